// The Hopper grouped GEMM: a persistent, warp-specialized kernel.
//
// Block: 3 warpgroups. Warpgroup 0 is the producer (registers given back with
// setmaxnreg). Its second warp is the scheduler: it claims tiles, locates
// them in the batch, makes sure their problem's tensor maps exist, and hands
// each tile's TileInfo to the loader through a small ring in shared memory,
// a few tiles ahead. Its first thread is the loader: it issues TMA loads of
// A and B tiles into a ring of shared-memory stages, each completing on a
// "full" mbarrier. Warpgroups 1 and 2 are consumers (registers raised with
// setmaxnreg): each owns 64 rows of the 128-row output tile, waits for a
// full stage, runs wgmma on it from shared memory, and each of its warps
// releases the stage on its "empty" mbarrier. The grid walks one tile list
// that covers every problem of the batch; within a problem tiles go in
// groups of 8 tile-rows so that neighbouring CTAs share A and B panels in L2.
//
// Tile scheduling: CTA b starts with tile b; after that the scheduler takes
// the next tile from a global counter (one atomicAdd a tile), once the
// loader is within a few stages of the end of what it has. Tiles are thus
// handed out in list order to whichever CTA is free, as the hardware does
// for one CTA per tile: the tiles in flight stay a contiguous window of the
// list (so the L2 panels they share stay resident), and tiles of unequal
// cost balance across SMs. Runs of tiny tiles (small grouped problems) are
// prepared several at a time, so that the table reads and map builds of one
// hide behind the loads of the ones before: measured on the H200, consumers
// of a batch of 1024 small problems spent a quarter of their time waiting
// for the next tile's first stage when one warp did all of that in turn.
// The loader writes each tile's TileInfo into shared memory with its first
// stage, before the stage's full barrier completes; the consumers read it
// there after waiting, so they never read the problem table before their
// main loop. A stage carrying tile -1 ends the consumers' loop.
//
// Ping-pong (experimental, HopperLaunch::pingpong, 16-bit inputs, 128x128
// tiles, single CTAs, no split tail): each consumer warpgroup takes every
// other tile whole (all 128 rows, two wgmmas a k-step) from the one ring of
// stages, and their main loops take turns, so that one warpgroup's
// epilogue overlaps the other's MMAs (ConsumePing).
//
// Clusters (kCluster = 2): two CTAs on neighbouring SMs take a pair of
// vertically adjacent tiles (same B panel, two A panels) as one unit. Each
// loads its own A tile and half of the shared B tile, multicast into both
// CTAs' shared memory, so each SM pulls 32 KiB a k-block from L2 instead of
// 48 KiB. A stage is free again only when the consumers of both CTAs are
// done with it: each consumer releases it on both CTAs' empty barriers.
// Both CTAs of a cluster must walk the same units: rank 0's scheduler
// claims each from the counter and sends it to rank 1's through a small
// ring in rank 1's shared memory (UnitAfter), so units go to whichever pair
// is free, as tiles go to single CTAs. A pair whose second tile lies below
// the problem computes on TMA's zero fill and stores nothing.
//
// Epilogue: where a problem has no C to read (beta = 0) and D's rows are
// 16-byte aligned, each consumer warpgroup writes its 64 x BN accumulators
// (times alpha, converted) into shared memory in 128-byte-swizzled boxes of
// 64 rows x 128 bytes, and one thread TMA-stores each box. With 16-bit
// inputs the tile's last stage stays out of the ring until the next tile's
// first MMAs are issued (MainLoop's kHold) and lends each warpgroup half of
// itself, so that with the two buffers after the stages a 128 x 256 tile's
// four boxes a warpgroup never wait for each other; TF32 tiles take the two
// buffers in turn. The stores drain while the warpgroup goes back to its
// main loop, and TMA clips edge tiles. Other problems store from registers
// (Epilogue).
// Measured on the H200 (docs/BENCHMARKS.md): the register epilogue cost
// 8-12% of a large problem's time, more for small grouped problems.
//
// Edge tiles (single CTAs and 16-bit inputs, where the launch asks for it
// with HopperLaunch::edge_tiles, as the launcher does by default): a tile
// whose columns inside the problem fit half or a quarter of BN runs wgmma
// that narrow (N = BN/2 or BN/4, at least 64), loads only those columns of
// B where B is stored k x n, and TMA-stores only those boxes; a tile whose
// rows inside the problem fit the first consumer warpgroup's 64 leaves the
// second warpgroup idle (no MMA, no store). Batches of small problems are
// mostly such tiles: on the H200 a batch of 1024 problems of 64..256 spent
// as long in each tile's epilogue as in its main loop (docs/BENCHMARKS.md,
// eighth round).
//
// Split-K tail (HopperSplit, kernels.h): a lone problem's last tiles may
// come as several units each, one per k-range. A unit's consumers write
// their float32 partial to the workspace and count themselves on the
// tile's counter (ReduceSplit); the last unit sums all partials in unit
// order and runs the epilogue, the others go on to their next unit.
//
// Tensor maps: TMA needs one map per operand (A, B and, for TMA stores, D).
// The host encodes templates (box, swizzle, element type) once; a warp
// patches a copy with the problem's address, sizes and stride
// (tensormap.replace), publishes it to global memory and flags it; others
// wait for the flag. No host work per problem. The producer warpgroup's
// last two warps (the map builders) build every problem's maps from the
// kernel's start, spread over the grid in tile-list order, so that a
// scheduler mostly finds them ready: when the schedulers built them on
// demand, a batch of 1024 small problems spent most of each tile's time on
// the build (docs/BENCHMARKS.md, sixth round). Batches of up to
// kHopperInlineProblems come instead with their problems and maps (encoded
// on the host) in the kernel's parameters: nothing is copied before the
// launch, no map is built, and the tile counters (a pair per stream) are
// set back to zero by the grid's last CTA.
//
// Layouts: A is K-major (stored m x k) or MN-major (stored k x m); B is
// K-major (stored n x k) or MN-major (stored k x n). All four combinations
// run with wgmma's transpose bits for 16-bit types; TF32 needs K-major
// operands (the launcher transposes others first).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/kernels.h"
#include "kernels/cuda/tile_counters.cuh"
#include "kernels/cuda/wgmma_ops.cuh"

namespace matmul::cuda {
namespace {

constexpr int kBM = kHopperTileM;
constexpr int kRowBytes = 128;           // One swizzle row: BK elements.
constexpr int kThreads = 384;            // Producer + 2 consumer warpgroups.
constexpr int kGroupRows = 8;            // Tile-rows per rasterization group.
constexpr int kConsumerWarps = 8;        // Each releases a stage on its own.
constexpr int kInfoSlots = 8;            // Tiles the scheduler may have ready ahead.
constexpr int kMapBuilders = 2;          // Producer warps 2 and 3 (PrebuildMaps).
constexpr int kMapWarps = 1 + kMapBuilders;  // Warps that build tensor maps: the scheduler too.
constexpr int kUnitSlots = 2;            // Pairs: claimed units rank 0 may have sent ahead.

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers ---------------------------------------------------------------

__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count));
}

__device__ __forceinline__ void MbarExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}

__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred ready;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 ready, [%0], %1;\n"
      "@!ready bra WAIT;\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}

// ---- TMA and tensor maps -------------------------------------------------------

__device__ __forceinline__ void TmaLoad2d(void* dst, const CUtensorMap* map, int c0, int c1,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(SmemAddr(bar))
      : "memory");
}

// Loads a box into the same shared-memory offset of every CTA in `mask`,
// completing bytes on each one's barrier at `bar`'s offset.
__device__ __forceinline__ void TmaLoad2dMulticast(void* dst, const CUtensorMap* map, int c0,
                                                   int c1, uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(SmemAddr(bar)), "h"(mask)
      : "memory");
}

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Arrives on the barrier at `bar`'s offset in cluster CTA `rank`, with the
// default (CTA-scope) release. A consumer's stage release only has to order
// its own MMAs' reads of its own CTA's stage before the peer's next
// multicast into it, which waiting for the MMAs already does. The
// cluster-scope form (.release.cluster) compiles to a CGAERRBAR before
// every arrive; measured on an H100 (docs/BENCHMARKS.md, twenty-second
// round) it made the pairs' load pipeline alone twice as slow (4096^3 bf16,
// no MMAs: 290 us against 155 us), which is why pairs had been slower
// than single CTAs. Rank 1's scheduler gives a unit slot back with it too
// (UnitAfter): its read of the slot is done before it arrives.
__device__ __forceinline__ void MbarArriveCluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(rank)
      : "memory");
}

// Publishes `value` at `slot`'s offset in cluster CTA `rank` and arrives on
// the barrier at `bar`'s offset there, releasing the store at cluster scope
// (once a tile, so the CGAERRBAR this costs does not matter).
__device__ __forceinline__ void SendToPeer(int* slot, int value, uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote_slot, remote_bar;\n"
      "mapa.shared::cluster.u32 remote_slot, %0, %3;\n"
      "mapa.shared::cluster.u32 remote_bar, %1, %3;\n"
      "st.shared::cluster.u32 [remote_slot], %2;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote_bar];\n"
      "}\n" ::"r"(SmemAddr(slot)),
      "r"(SmemAddr(bar)), "r"(value), "r"(rank)
      : "memory");
}

// MbarWait that acquires at cluster scope: what the peer stored before its
// SendToPeer arrive is visible after it.
__device__ __forceinline__ void MbarWaitCluster(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred ready;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 ready, [%0], %1;\n"
      "@!ready bra WAIT;\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}

// Patches a tensor map in shared memory: base address, the two extents
// (dim 0 innermost) and the byte stride of dim 1.
__device__ __forceinline__ void PatchMap(void* smem_map, const void* base, uint32_t dim0,
                                         uint32_t dim1, uint64_t stride_bytes) {
  const uint32_t s = SmemAddr(smem_map);
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" ::"r"(s),
               "l"(reinterpret_cast<uint64_t>(base))
               : "memory");
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;" ::"r"(s),
               "r"(dim0)
               : "memory");
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;" ::"r"(s),
               "r"(dim1)
               : "memory");
  asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;" ::"r"(s),
               "l"(stride_bytes)
               : "memory");
}

// Whole warp: copies a patched map to global memory, releasing it to the
// tensor-map proxy.
__device__ __forceinline__ void PublishMap(CUtensorMap* global_map, const void* smem_map) {
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned"
      " [%0], [%1], 128;" ::"l"(reinterpret_cast<uint64_t>(global_map)),
      "r"(SmemAddr(smem_map))
      : "memory");
}

__device__ __forceinline__ void AcquireMap(const CUtensorMap* global_map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(
                   reinterpret_cast<uint64_t>(global_map))
               : "memory");
}

__device__ __forceinline__ void PrefetchMap(const CUtensorMap* global_map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(global_map)) : "memory");
}

// TMA store of a box from shared memory, tracked by this thread's bulk
// async-groups.
__device__ __forceinline__ void TmaStore2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(SmemAddr(src)), "r"(c0), "r"(c1)
               : "memory");
}

__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most kPending of this thread's bulk groups still read
// shared memory.
template <int kPending>
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// Waits until all of this thread's bulk groups are complete (writes done).
__device__ __forceinline__ void BulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Makes this thread's shared-memory writes visible to the async proxy (TMA).
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Barrier `id` (1-15) over `threads` threads (one warpgroup, or both
// consumer warpgroups).
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Named barrier of both consumer warpgroups at the end of each tile's main
// loop (16-bit inputs: the held stage; Consume).
constexpr int kTileEndBarrier = 3;

__device__ __forceinline__ unsigned long long LoadAcquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// ---- wgmma ------------------------------------------------------------------

// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t Desc(uint32_t smem_addr, uint32_t lbo_bytes,
                                         uint32_t sbo_bytes) {
  uint64_t d = static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= uint64_t{1} << 62;
  return d;
}

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator accesses across wgmma's
// asynchronous writes.
template <int N>
__device__ __forceinline__ void FenceRegisters(float (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// ---- element types -------------------------------------------------------------

template <typename T>
struct Elem;
template <>
struct Elem<__nv_bfloat16> {
  static constexpr int kBK = 64;   // Elements per 128-byte row.
  static constexpr int kStep = 16; // K per wgmma.
};
template <>
struct Elem<__half> {
  static constexpr int kBK = 64;
  static constexpr int kStep = 16;
};
template <>
struct Elem<float> {  // TF32
  static constexpr int kBK = 32;
  static constexpr int kStep = 8;
};

template <typename T, int BN, int kAmn, int kBmn>
__device__ __forceinline__ void Mma(float (&acc)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (sizeof(T) == 4) {
    if constexpr (BN == 256) wgmma::MmaTf32N256(acc, da, db, 1);
    else if constexpr (BN == 128) wgmma::MmaTf32N128(acc, da, db, 1);
    else wgmma::MmaTf32N64(acc, da, db, 1);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if constexpr (BN == 256) wgmma::MmaBf16N256<kAmn, kBmn>(acc, da, db, 1);
    else if constexpr (BN == 128) wgmma::MmaBf16N128<kAmn, kBmn>(acc, da, db, 1);
    else wgmma::MmaBf16N64<kAmn, kBmn>(acc, da, db, 1);
  } else {
    if constexpr (BN == 256) wgmma::MmaF16N256<kAmn, kBmn>(acc, da, db, 1);
    else if constexpr (BN == 128) wgmma::MmaF16N128<kAmn, kBmn>(acc, da, db, 1);
    else wgmma::MmaF16N64<kAmn, kBmn>(acc, da, db, 1);
  }
}

// ---- the kernel ------------------------------------------------------------------

struct Params {
  HopperTemplates templates;
  // Small batches (count > 0): the problems, tile offsets and host-encoded
  // maps themselves; the table pointers, maps, flags and epoch below are
  // then unused, and the tile counters are reset by the grid's last CTA.
  HopperInlineBatch inl;
  const DeviceGemmProblem* problems;
  const int32_t* tile_offsets;
  const int32_t* tile_problem;
  int num_problems;
  int total_tiles;
  CUtensorMap* maps;
  unsigned long long* map_flags;
  // Tiles handed out after each CTA's first (zero at launch); with an
  // inline batch, followed by a count of the CTAs done claiming.
  unsigned int* tile_counter;
  unsigned long long epoch;
  DType output;
  // The split-K tail (kernels.h): problem -1 when there is none.
  HopperSplit split;
  // Edge tiles do only their share (EdgeFlags): HopperLaunch::edge_tiles.
  bool edge_tiles;
#ifdef MATMUL_HOPPER_DIAG
  int diag;        // Bits of kDiag* (diagnostic builds only).
  int group_rows;  // Tile-rows per rasterization group (diagnostic builds only).
  // Timeline records (MATMUL_HOPPER_TRACE, diagnostic builds only): a
  // count, 7 words of padding, then `trace_capacity` records of
  // kTraceWords words;
  // null when this launch is not traced.
  unsigned long long* trace;
  unsigned int trace_capacity;
#endif
};

static_assert(sizeof(Params) <= 32764, "over the kernel parameter limit");

__device__ __forceinline__ bool Inline(const Params& p) { return p.inl.count > 0; }

// Problem `prob` of the batch, from the parameters or the table.
__device__ __forceinline__ const DeviceGemmProblem& Problem(const Params& p, int prob) {
  return Inline(p) ? p.inl.problems[prob] : p.problems[prob];
}

// Problem `prob`'s map of A (0), B (1) or D (2): encoded on the host with an
// inline batch, else built into the workspace by a map builder or a
// scheduler warp (BuildMaps).
__device__ __forceinline__ const CUtensorMap* Map(const Params& p, int prob, int which) {
  return Inline(p) ? &p.inl.maps[prob][which] : p.maps + 3 * prob + which;
}

// Diagnostic builds (MATMUL_HOPPER_DIAG defined: gemm-bench-diag, never the
// engine) leave one stage of the work out, chosen at run time by the
// environment variable MATMUL_HOPPER_DIAG, so that timing differences say
// what bounds the kernel. The results are then wrong.
//  kDiagNoLoads: after a CTA's first ring of stages the loader issues no
//    more TMA loads, it only completes the full barriers (the consumers
//    compute on stale stages): the kernel without its L2 traffic.
//  kDiagNoStores: the consumers skip the epilogue.
//  kDiagNoMma: the consumers issue no wgmma (they wait and release stages):
//    the load pipeline alone.
//  kDiagDirectStores: every tile stored from registers (the epilogue that
//    TMA stores replaced), for A/B runs; results stay right.
// Bits that move work rather than leave it out (results stay right unless
// said), each asking where a tile's 1.7-us epilogue goes on small batches
// (docs/BENCHMARKS.md, twelfth round: none of them changed it much):
//  kDiagStagger: the second consumer warpgroup starts 2 us after the
//    first, so that one's epilogue might overlap the other's main loop.
//  kDiagEarlyAcquireD: a warpgroup acquires its tile's D map as soon as it
//    reads the tile, before its main loop, instead of in the epilogue.
//  kDiagPrefetchD: a warpgroup prefetches its tile's D map as soon as it
//    reads the tile; the acquire stays in the epilogue.
//  kDiagNoAcquire: no thread acquires a built tensor map, so TMA may use a
//    stale copy and results may be wrong: what the acquires cost.
constexpr int kDiagNoLoads = 1;
constexpr int kDiagNoStores = 2;
constexpr int kDiagNoMma = 4;
constexpr int kDiagDirectStores = 8;  // The register epilogue even where TMA could store.
constexpr int kDiagStagger = 16;
constexpr int kDiagEarlyAcquireD = 32;
constexpr int kDiagPrefetchD = 64;
constexpr int kDiagNoAcquire = 128;

// Tile-rows per rasterization group: kGroupRows, or in diagnostic builds
// MATMUL_HOPPER_GROUP_ROWS.
__device__ __forceinline__ int GroupRows(const Params& p) {
#ifdef MATMUL_HOPPER_DIAG
  return p.group_rows;
#else
  (void)p;
  return kGroupRows;
#endif
}

__device__ __forceinline__ bool Diag(const Params& p, int bit) {
#ifdef MATMUL_HOPPER_DIAG
  return (p.diag & bit) != 0;
#else
  (void)p;
  (void)bit;
  return false;
#endif
}

// Timelines (diagnostic builds, MATMUL_HOPPER_TRACE=FILE): one launch
// (MATMUL_HOPPER_TRACE_AT, default the 10th) records, per tile and consumer
// warpgroup, when it began waiting for the tile's first stage, when that
// stage landed, when its main loop, split reduction and epilogue ended
// (SM clock cycles, with the global timer at the start to line SMs up),
// and per tile of the loader when it waited for and got the tile's
// TileInfo and issued its first and last k-block. Record words: 0 kind
// (0 consumer, 1 loader) << 56 | warpgroup << 48 | SM << 32 | tile; 1
// problem << 32 | k-blocks << 16 | split unit + 1 (0: not split); 2 global
// ns; 3-7 clock64 stamps.
#ifdef MATMUL_HOPPER_DIAG
#define MATMUL_TRACE(...) __VA_ARGS__
constexpr int kTraceStamps = 6;  // Words 2-7 of a record.
constexpr int kTraceWords = 2 + kTraceStamps;
__device__ __forceinline__ unsigned long long GlobalNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned int SmId() {
  unsigned int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
__device__ __forceinline__ void TraceRecord(const Params& p, int kind, int wg, int tile,
                                            int problem, int kblocks, int unit,
                                            const unsigned long long (&t)[kTraceStamps]) {
  if (p.trace == nullptr) return;
  const unsigned long long i = atomicAdd(p.trace, 1ull);
  if (i >= p.trace_capacity) return;
  unsigned long long* r = p.trace + 8 + i * kTraceWords;
  r[0] = (static_cast<unsigned long long>(kind) << 56) |
         (static_cast<unsigned long long>(wg) << 48) |
         (static_cast<unsigned long long>(SmId()) << 32) | static_cast<unsigned int>(tile);
  r[1] = (static_cast<unsigned long long>(static_cast<unsigned int>(problem)) << 32) |
         (static_cast<unsigned long long>(kblocks & 0xffff) << 16) | (unit & 0xffff);
  for (int j = 0; j < kTraceStamps; ++j) r[2 + j] = t[j];
}
#else
#define MATMUL_TRACE(...)
#endif

// What the scheduler warp works out for one tile, handed to the loader
// through the info ring and to the consumers with the tile's first stage,
// so that neither reads the problem table on its critical path.
struct alignas(16) TileInfo {
  int tile;     // Index in the batch's tile (unit) list; -1 ends the work.
  int problem;  // Index in the problem table.
  int m0;       // First row of this CTA's tile.
  int n0;       // First column.
  int kblocks;  // k-blocks of this unit (of the problem, unless split).
  int flags;    // kInfo* bits.
  float alpha;  // For the TMA-store epilogue.
  int kb0;      // The unit's first k-block (0 unless split).
};
constexpr int kInfoTransposeA = 1;  // A stored k x m (MN-major).
constexpr int kInfoTransposeB = 2;  // B stored n x k (K-major).
constexpr int kInfoTmaStore = 4;    // StoresByTma: the epilogue goes out by TMA.
// Edge tiles (single CTAs and 16-bit inputs only, where the launch asks:
// EdgeFlags): the tile's columns inside the problem fit BN >> w, w in bits
// 4-5, so its MMAs, its loads of B (stored k x n) and its TMA-stored boxes
// stop at that width; and where its rows inside the problem all fall in the
// first consumer warpgroup's 64, the second warpgroup issues no MMA and
// stores nothing (bit 6), and A stored k x m loads only its first 64
// columns.
constexpr int kInfoNarrowShift = 4;
constexpr int kInfoNarrowMask = 3;
constexpr int kInfoFirstHalf = 64;
// D (and C) stored n x m (DeviceGemmProblem::transpose_d; TF32 only): the
// epilogue writes the accumulators transposed (EpilogueTmaTransposed,
// EpilogueTransposed).
constexpr int kInfoTransposeD = 128;
// A unit of a split tile (HopperSplit): its index j among the tile's units
// sits in bits 8-15 of the flags, the tile's index among the split tiles
// (its slot of partials and counters) in bits 16-31.
constexpr int kInfoSplit = 8;
constexpr int kInfoSplitShift = 8;
constexpr int kInfoSlotShift = 16;
static_assert(kHopperMaxSplits <= 256 && kHopperMaxSplitTiles <= 65536, "TileInfo flag bits");
#ifdef MATMUL_HOPPER_DIAG
// The split unit of a TileInfo's flags as a trace record counts it: the
// unit (as ReduceSplit reads it) + 1, or 0 for a whole tile.
__device__ __forceinline__ int TraceUnit(int flags) {
  return (flags & kInfoSplit) ? ((flags >> kInfoSplitShift) & 0xff) + 1 : 0;
}
#endif

// The edge bits (kInfoNarrowShift, kInfoFirstHalf) of the tile of `pr` at
// (m0, n0).
template <int BN>
__device__ __forceinline__ int EdgeFlags(const DeviceGemmProblem& pr, int m0, int n0) {
  const int64_t cols = pr.n - n0;
  int w = 0;
  if constexpr (BN / 2 >= 64) {
    if (cols <= BN / 2) w = 1;
  }
  if constexpr (BN / 4 >= 64) {
    if (cols <= BN / 4) w = 2;
  }
  return (w << kInfoNarrowShift) | (pr.m - m0 <= 64 ? kInfoFirstHalf : 0);
}

// The tile's MMA width as a shift of BN (0 unless an edge tile is narrower).
__device__ __forceinline__ int NarrowShift(int flags) {
  return (flags >> kInfoNarrowShift) & kInfoNarrowMask;
}

template <int BN>
struct Layout {
  // About 192 KiB of stages whatever the width.
  static constexpr int kStages = BN == 256 ? 4 : (BN == 128 ? 6 : 8);
  static constexpr int kABytes = kBM * kRowBytes;       // 16 KiB per stage
  static constexpr int kBBytes = BN * kRowBytes;        // 32, 16 or 8 KiB per stage
  static constexpr int kStageBytes = kABytes + kBBytes;
  // Output staging for TMA stores: per consumer warpgroup two buffers of 64
  // rows x 128 bytes (one 128-byte-swizzled box each).
  static constexpr int kStoreBufferBytes = 64 * kRowBytes;
  static constexpr int kStoreOffset = kStages * kStageBytes;
  // Stages (1024-byte aligned), the store buffers, then the barriers (full
  // and empty per stage, full and empty per info slot), each stage's
  // TileInfo, the info ring, the loader's count of issued k-blocks and the
  // consumer warpgroups' split flags (16 bytes), and
  // three 128-byte tensor-map scratch slots (A, B, D) for each warp that
  // builds maps (the scheduler and the two map builders).
  static constexpr int kBarrierOffset = kStoreOffset + 2 * 2 * kStoreBufferBytes;
  static constexpr int kStageInfoOffset = kBarrierOffset + (2 * kStages + 2 * kInfoSlots) * 8;
  static constexpr int kInfoOffset = kStageInfoOffset + kStages * sizeof(TileInfo);
  static constexpr int kIssuedOffset = kInfoOffset + kInfoSlots * sizeof(TileInfo);
  // Ping-pong only: the two consumer warpgroups' turn barriers, then the
  // k-blocks of each one's current tile (ConsumePing).
  static constexpr int kTurnOffset = kIssuedOffset + 16;
  static constexpr int kTurnBlocksOffset = kTurnOffset + 16;
  // Pairs only: the ring of claimed units from rank 0's scheduler to rank
  // 1's (Schedule): per slot a full and an empty barrier, then the units.
  static constexpr int kUnitOffset = kTurnBlocksOffset + 8;
  static constexpr int kMapOffset = (kUnitOffset + kUnitSlots * (8 + 8 + 4) + 127) / 128 * 128;
  static constexpr int kBytes = kMapOffset + kMapWarps * 3 * 128 + 1024;  // + alignment slack
  // A held stage (16-bit inputs: MainLoop's kHold) lends each consumer
  // warpgroup half of it, this many store boxes, for its tile's epilogue.
  static constexpr int kHeldBoxes = kStageBytes / 2 / kStoreBufferBytes;
  static_assert(kBarrierOffset % 16 == 0 && kStageInfoOffset % 16 == 0, "TileInfo alignment");
  static_assert(kBytes <= 227 * 1024, "over the shared memory of one SM");
};

// The shared-memory objects of one CTA, carved out of Layout.
template <int BN>
struct Smem {
  uint8_t* stages;
  uint64_t* full;        // Per stage: its loads landed (count 1 + bytes).
  uint64_t* empty;       // Per stage: every consumer warp of the stage's CTAs is done.
  uint64_t* info_full;   // Per info slot: the scheduler wrote it.
  uint64_t* info_empty;  // Per info slot: the loader read it.
  TileInfo* stage_info;  // Per stage: the tile it starts (read at a tile's first stage).
  TileInfo* info;        // The scheduler-to-loader ring.
  int* issued;           // k-blocks the loader has issued (shared-memory atomics).
  uint64_t* turn;        // Ping-pong: per consumer warpgroup, the other's MMAs are issued.
  int* turn_kblocks;     // Ping-pong: per consumer warpgroup, its current tile's k-blocks.
  uint64_t* unit_full;   // Pairs, rank 1: per unit slot, rank 0 wrote it.
  uint64_t* unit_empty;  // Pairs, rank 0: per unit slot, rank 1 read it.
  int* unit;             // Pairs, rank 1: the unit slots, written by rank 0.
  CUtensorMap* scratch;  // Map scratch (A, B, D): the scheduler's, then each builder's.

  __device__ explicit Smem(uint8_t* base)
      : stages(base),
        full(reinterpret_cast<uint64_t*>(base + Layout<BN>::kBarrierOffset)),
        empty(full + Layout<BN>::kStages),
        info_full(empty + Layout<BN>::kStages),
        info_empty(info_full + kInfoSlots),
        stage_info(reinterpret_cast<TileInfo*>(base + Layout<BN>::kStageInfoOffset)),
        info(reinterpret_cast<TileInfo*>(base + Layout<BN>::kInfoOffset)),
        issued(reinterpret_cast<int*>(base + Layout<BN>::kIssuedOffset)),
        turn(reinterpret_cast<uint64_t*>(base + Layout<BN>::kTurnOffset)),
        turn_kblocks(reinterpret_cast<int*>(base + Layout<BN>::kTurnBlocksOffset)),
        unit_full(reinterpret_cast<uint64_t*>(base + Layout<BN>::kUnitOffset)),
        unit_empty(unit_full + kUnitSlots),
        unit(reinterpret_cast<int*>(unit_empty + kUnitSlots)),
        scratch(reinterpret_cast<CUtensorMap*>(base + Layout<BN>::kMapOffset)) {}
};

// Problem and tile coordinates of global tile `tile`.
struct TileCoord {
  int problem;
  int tile_m;
  int tile_n;
  int split;  // Unit index among its tile's units (HopperSplit), or -1.
  int slot;   // The tile's index among the split tiles (when split >= 0).
};

// With clusters, `tile` numbers a unit of kCluster tile-rows, and tile_m is
// the unit's row (this CTA's tile row is tile_m * kCluster + its rank).
template <int BN, int kCluster>
__device__ __forceinline__ TileCoord Locate(const Params& p, int tile) {
  int prob = 0;
  int first;  // The problem's first tile.
  if (Inline(p)) {
    while (prob + 1 < p.inl.count && tile >= p.inl.tile_offsets[prob + 1]) ++prob;
    first = p.inl.tile_offsets[prob];
  } else {
    prob = __ldg(&p.tile_problem[tile]);
    first = __ldg(&p.tile_offsets[prob]);
  }
  const DeviceGemmProblem& pr = Problem(p, prob);
  int local = tile - first;
  int split = -1, slot = 0;
  if constexpr (kCluster == 1) {
    // The split tail: each of the last tiles is `splits` units in a row.
    if (prob == p.split.problem && local >= p.split.first_tile) {
      const int v = local - p.split.first_tile;
      slot = v / p.split.splits;
      split = v - slot * p.split.splits;
      local = p.split.first_tile + slot;
    }
  }
  const int tiles_m = static_cast<int>((pr.m + kCluster * kBM - 1) / (kCluster * kBM));
  const int tiles_n = static_cast<int>((pr.n + BN - 1) / BN);
  const int group_rows = GroupRows(p);
  const int per_group = group_rows * tiles_n;
  const int group = local / per_group;
  const int first_m = group * group_rows;
  const int rows = min(tiles_m - first_m, group_rows);
  const int in_group = local - group * per_group;
  return {prob, first_m + in_group % rows, in_group / rows, split, slot};
}

__device__ __forceinline__ int OutputSize(DType output) {
  return output == DType::kFloat32 ? 4 : 2;
}

// True when problem `pr`'s tiles are stored by TMA (from shared memory,
// asynchronously): no C to read, D 16-byte aligned with rows a multiple of
// 16 bytes apart. Other problems take the register epilogue.
__device__ __forceinline__ bool StoresByTma(const Params& p, const DeviceGemmProblem& pr) {
  return pr.beta == 0.0 && reinterpret_cast<uintptr_t>(pr.d) % 16 == 0 &&
         (pr.ldd * OutputSize(p.output)) % 16 == 0 && !Diag(p, kDiagDirectStores);
}

// Whole warp: makes sure problem `prob`'s tensor maps are built and
// published (by this warp or another, of this CTA or another), `scratch`
// being this warp's three shared-memory slots. The scheduler calls it with
// `wait` set: on return the maps are ready, and the threads that use them
// acquire them (AcquireMap) after learning of the problem from it. A map
// builder calls it without `wait`, and moves on when another warp is
// already building them.
template <typename T, int kCluster>
__device__ void BuildMaps(const Params& p, int prob, CUtensorMap* scratch, bool wait = true) {
  const int lane = threadIdx.x & 31;
  CUtensorMap* ga = p.maps + 3 * prob;
  CUtensorMap* gb = ga + 1;
  CUtensorMap* gd = ga + 2;
  unsigned long long* flag = p.map_flags + prob;
  const unsigned long long building = 2 * p.epoch - 1;
  const unsigned long long ready = 2 * p.epoch;
  int state = 0;  // 0: built already, 1: this warp builds, 2: another CTA builds.
  if (lane == 0 && LoadAcquire(flag) != ready) {
    const unsigned long long old = atomicMax(flag, building);
    state = old < building ? 1 : (old == ready ? 0 : 2);
  }
  state = __shfl_sync(0xffffffffu, state, 0);
  if (state == 1) {
    const DeviceGemmProblem& pr = p.problems[prob];
    const CUtensorMap* ta = pr.transpose_a ? &p.templates.a_mnmajor : &p.templates.a_kmajor;
    const CUtensorMap* tb =
        pr.transpose_b ? (kCluster > 1 ? &p.templates.b_kmajor_half : &p.templates.b_kmajor)
                       : &p.templates.b_mnmajor;
    // 128 bytes each: lanes 0-15 copy A's template, 16-31 B's.
    const uint64_t* src = reinterpret_cast<const uint64_t*>(lane < 16 ? ta : tb);
    reinterpret_cast<uint64_t*>(scratch + (lane < 16 ? 0 : 1))[lane & 15] = src[lane & 15];
    __syncwarp();
    if (lane == 0) {
      const uint64_t sz = sizeof(T);
      if (pr.transpose_a) {  // Stored k x m.
        PatchMap(scratch, pr.a, static_cast<uint32_t>(pr.m), static_cast<uint32_t>(pr.k),
                 pr.lda * sz);
      } else {  // Stored m x k.
        PatchMap(scratch, pr.a, static_cast<uint32_t>(pr.k), static_cast<uint32_t>(pr.m),
                 pr.lda * sz);
      }
      if (pr.transpose_b) {  // Stored n x k.
        PatchMap(scratch + 1, pr.b, static_cast<uint32_t>(pr.k), static_cast<uint32_t>(pr.n),
                 pr.ldb * sz);
      } else {  // Stored k x n.
        PatchMap(scratch + 1, pr.b, static_cast<uint32_t>(pr.n), static_cast<uint32_t>(pr.k),
                 pr.ldb * sz);
      }
    }
    __syncwarp();
    PublishMap(ga, scratch);
    PublishMap(gb, scratch + 1);
    if (StoresByTma(p, pr)) {
      const CUtensorMap* td = p.output == DType::kFloat32
                                  ? &p.templates.d_f32
                                  : (p.output == DType::kBFloat16 ? &p.templates.d_bf16
                                                                  : &p.templates.d_f16);
      if (lane < 16) {
        reinterpret_cast<uint64_t*>(scratch + 2)[lane] =
            reinterpret_cast<const uint64_t*>(td)[lane];
      }
      __syncwarp();
      if (lane == 0) {  // Stored m x n, or n x m.
        const uint32_t rows = static_cast<uint32_t>(pr.transpose_d ? pr.n : pr.m);
        const uint32_t cols = static_cast<uint32_t>(pr.transpose_d ? pr.m : pr.n);
        PatchMap(scratch + 2, pr.d, cols, rows, pr.ldd * OutputSize(p.output));
      }
      __syncwarp();
      PublishMap(gd, scratch + 2);
    }
    if (lane == 0) {
      __threadfence();
      atomicExch(flag, ready);
    }
  } else if (state == 2 && lane == 0 && wait) {
    while (LoadAcquire(flag) != ready) __nanosleep(64);
  }
  __syncwarp();
}

// Map builders (warps 2 and 3 of the producer warpgroup, otherwise idle):
// with the batch in a table, they build its problems' tensor maps from the
// kernel's start, builder w of CTA b taking problems kMapBuilders * b + w
// and every kMapBuilders * gridDim.x-th after, so that the whole grid
// builds them in parallel and in about the order the tile list reaches
// them. A scheduler reaching a new
// problem then mostly finds its maps ready instead of building them on its
// tile's critical path (for batches of many small problems that build was
// most of each tile's time); it still builds any that are not.
template <typename T, int BN, int kCluster>
__device__ void PrebuildMaps(const Params& p, const Smem<BN>& sm) {
  if (Inline(p)) return;
  const int w = (static_cast<int>(threadIdx.x) >> 5) - 2;  // 0 .. kMapBuilders - 1
  CUtensorMap* scratch = sm.scratch + 3 * (1 + w);         // After the scheduler's slots.
  const int stride = kMapBuilders * static_cast<int>(gridDim.x);
  for (int prob = kMapBuilders * static_cast<int>(blockIdx.x) + w; prob < p.num_problems;
       prob += stride) {
    // A problem without tiles has no maps to build (and extents of 0).
    if (__ldg(&p.tile_offsets[prob + 1]) == __ldg(&p.tile_offsets[prob])) continue;
    BuildMaps<T, kCluster>(p, prob, scratch, /*wait=*/false);
  }
}

// Scheduler lane 0 of a grid with fewer CTAs (clusters) than tiles (units),
// Schedule's `dynamic`: the next tile (unit) from the counter, after each
// CTA's (cluster's) first. With clusters only rank 0 claims (UnitAfter).
template <int kCluster>
__device__ __forceinline__ int ClaimTile(const Params& p) {
  return static_cast<int>(gridDim.x) / kCluster + static_cast<int>(atomicAdd(p.tile_counter, 1u));
}

// Scheduler lane 0 of a pair (clusters of 2), the `n`-th claim: rank 0
// claims the next unit and sends it to rank 1 through the unit ring, so
// that both CTAs walk the same units, handed out to whichever pair is free
// (as single CTAs take tiles). Rank 1 waits for it.
template <int BN>
__device__ __forceinline__ int UnitAfter(const Params& p, const Smem<BN>& sm, int n, int rank) {
  const int slot = n % kUnitSlots;
  const uint32_t phase = (n / kUnitSlots) & 1;
  if (rank == 0) {
    const int unit = ClaimTile<2>(p);
    MbarWait(&sm.unit_empty[slot], phase ^ 1);  // Rank 1 has read the slot's last unit.
    SendToPeer(&sm.unit[slot], unit, &sm.unit_full[slot], 1);
    return unit;
  }
  MbarWaitCluster(&sm.unit_full[slot], phase);
  const int unit = *static_cast<volatile int*>(&sm.unit[slot]);
  MbarArriveCluster(&sm.unit_empty[slot], 0);
  return unit;
}

// Loader: the TMA loads of k-block `kb` of the tile at (m0, n0) into
// stage `s`, completing on its full barrier. `flags`: the tile's kInfo*
// bits (operand layouts).
template <typename T, int BN, int kCluster>
__device__ __forceinline__ void IssueStage(int flags, const CUtensorMap* map_a,
                                           const CUtensorMap* map_b, uint8_t* stages,
                                           uint64_t* full, int s, int kb, int m0, int n0,
                                           int rank) {
  using L = Layout<BN>;
  constexpr int BK = Elem<T>::kBK;
  // Edge tiles (EdgeFlags, single CTAs only) leave out the boxes of A and B
  // (as laid out MN-major) that no MMA of theirs reads.
  const bool first_half = kCluster == 1 && (flags & kInfoFirstHalf);
  const int b_boxes = kCluster == 1 ? (BN >> NarrowShift(flags)) / 64 : BN / 64;
  const bool a_half = first_half && (flags & kInfoTransposeA);
  // A stored k x m comes in boxes one 128-byte row wide: 64 columns of
  // 16-bit types, 32 of TF32.
  constexpr int kABoxCols = kRowBytes / static_cast<int>(sizeof(T));
  constexpr int kABoxes = kBM / kABoxCols;
  const int bytes = (a_half ? L::kABytes / 2 : L::kABytes) +
                    ((flags & kInfoTransposeB) ? L::kBBytes : b_boxes * BK * kRowBytes);
  MbarExpectTx(&full[s], bytes);
  uint8_t* sa = stages + s * L::kStageBytes;
  uint8_t* sb = sa + L::kABytes;
  const int k0 = kb * BK;
  if (flags & kInfoTransposeA) {  // MN-major: boxes of kABoxCols columns by BK rows.
#pragma unroll
    for (int box = 0; box < kABoxes; ++box) {
      if (!a_half || box < kABoxes / 2) {
        TmaLoad2d(sa + box * BK * kRowBytes, map_a, m0 + box * kABoxCols, k0, &full[s]);
      }
    }
  } else {
    TmaLoad2d(sa, map_a, k0, m0, &full[s]);
  }
  if constexpr (kCluster > 1) {
    // This CTA's half of B, into both CTAs.
    constexpr int kHalf = BN / 2;
    if (flags & kInfoTransposeB) {  // K-major: a box of BN/2 rows.
      TmaLoad2dMulticast(sb + rank * kHalf * kRowBytes, map_b, k0, n0 + rank * kHalf,
                         &full[s], 0x3);
    } else {
#pragma unroll
      for (int h = 0; h < kHalf / 64; ++h) {
        const int box = rank * (kHalf / 64) + h;
        TmaLoad2dMulticast(sb + box * BK * kRowBytes, map_b, n0 + box * 64, k0, &full[s],
                           0x3);
      }
    }
  } else if (flags & kInfoTransposeB) {  // K-major: one box of BN rows.
    TmaLoad2d(sb, map_b, k0, n0, &full[s]);
  } else {
#pragma unroll
    for (int h = 0; h < BN / 64; ++h) {
      if (h < b_boxes) TmaLoad2d(sb + h * BK * kRowBytes, map_b, n0 + h * 64, k0, &full[s]);
    }
  }
}

// Scheduler warp (the producer warpgroup's second warp): walks this CTA's
// tiles ahead of the loader. For each it locates the tile, makes sure the
// problem's tensor maps exist, and hands a TileInfo to the loader through
// the info ring; a TileInfo with tile -1 ends the work. A new tile is
// claimed only once the loader has at most kLookahead k-blocks left of what
// it was given: far enough ahead to hide the claim, the table reads and a
// map build behind the loads, and no further, so that tiles are still handed
// out to whichever CTA is free (large tiles balance as before) while runs of
// tiny tiles are prepared several at a time.
template <typename T, int BN, int kCluster>
__device__ void Schedule(const Params& p, const Smem<BN>& sm) {
  constexpr int BK = Elem<T>::kBK;
  constexpr int kLookahead = 2 * Layout<BN>::kStages;
  const int lane = threadIdx.x & 31;
  const int rank = kCluster > 1 ? static_cast<int>(ClusterRank()) : 0;
  const bool dynamic = static_cast<int>(gridDim.x) / kCluster < p.total_tiles;
  int tile = static_cast<int>(blockIdx.x) / kCluster;
  int built = -1;      // Problem whose maps this warp last made sure of.
  int published = 0;   // k-blocks handed to the loader so far.
  for (int n = 0;; ++n) {
    const int slot = n % kInfoSlots;
    if (lane == 0) MbarWait(&sm.info_empty[slot], ((n / kInfoSlots) & 1) ^ 1);
    __syncwarp();
    if (tile >= p.total_tiles) {
      if (lane == 0) {
        sm.info[slot].tile = -1;
        MbarArrive(&sm.info_full[slot]);
        if (dynamic && Inline(p)) {
          // This CTA's claims are over. The last CTA to get here sets the
          // counters back to zero for the next launch on the stream.
          CountOutOfTileClaims(p.tile_counter);
        }
      }
      break;
    }
    const TileCoord t = Locate<BN, kCluster>(p, tile);
    const DeviceGemmProblem& pr = Problem(p, t.problem);
    if (!Inline(p) && t.problem != built) {
      BuildMaps<T, kCluster>(p, t.problem, sm.scratch);
      built = t.problem;
    }
    int kblocks = static_cast<int>((pr.k + BK - 1) / BK);
    int kb0 = 0;
    if (t.split >= 0) {  // k-blocks [j K / splits, (j + 1) K / splits).
      kb0 = t.split * kblocks / p.split.splits;
      kblocks = (t.split + 1) * kblocks / p.split.splits - kb0;
    }
    if (lane == 0) {
      TileInfo ti;
      ti.tile = tile;
      ti.problem = t.problem;
      ti.m0 = (t.tile_m * kCluster + rank) * kBM;
      ti.n0 = t.tile_n * BN;
      ti.kblocks = kblocks;
      ti.flags = (pr.transpose_a ? kInfoTransposeA : 0) | (pr.transpose_b ? kInfoTransposeB : 0) |
                 (StoresByTma(p, pr) ? kInfoTmaStore : 0) |
                 (pr.transpose_d ? kInfoTransposeD : 0) |
                 (kCluster == 1 && sizeof(T) == 2 && p.edge_tiles
                      ? EdgeFlags<BN>(pr, ti.m0, ti.n0)
                      : 0) |
                 (t.split >= 0 ? kInfoSplit | (t.split << kInfoSplitShift) |
                                     (t.slot << kInfoSlotShift)
                               : 0);
      ti.alpha = static_cast<float>(pr.alpha);
      ti.kb0 = kb0;
      sm.info[slot] = ti;
      MbarArrive(&sm.info_full[slot]);  // Releases the slot's contents.
    }
    published += kblocks;
    int next = 0;
    if (lane == 0) {
      if (dynamic) {
        while (published - atomicAdd(sm.issued, 0) > kLookahead) __nanosleep(32);
      }
      if constexpr (kCluster > 1) {
        next = dynamic ? UnitAfter(p, sm, n, rank) : p.total_tiles;
      } else {
        next = dynamic ? ClaimTile<1>(p) : p.total_tiles;
      }
    }
    tile = __shfl_sync(0xffffffffu, next, 0);
  }
}

// Loader (lane 0 of the producer warpgroup): takes tiles from the info ring
// and issues their k-blocks' TMA loads into the stage ring. Each tile's
// first stage carries its TileInfo to the consumers; after the last tile, a
// stage with tile -1 and no bytes ends the consumers' loop.
//
// The ping-pong consumers read the same ring, each warpgroup the stages of
// its own tiles (ConsumePing).
template <typename T, int BN, int kCluster>
__device__ void Load(const Params& p, const Smem<BN>& sm) {
  using L = Layout<BN>;
  const int rank = kCluster > 1 ? static_cast<int>(ClusterRank()) : 0;
  int seq = 0;
  int current = -1;  // Problem whose maps this thread has acquired.
  const CUtensorMap* map_a = nullptr;
  const CUtensorMap* map_b = nullptr;
  for (int n = 0;; ++n) {
    const int slot = n % kInfoSlots;
    MATMUL_TRACE(unsigned long long tr[kTraceStamps] = {}; tr[0] = GlobalNs(); tr[1] = clock64();)
    MbarWait(&sm.info_full[slot], (n / kInfoSlots) & 1);
    const TileInfo ti = sm.info[slot];
    MbarArrive(&sm.info_empty[slot]);
    if (ti.tile < 0) break;
    MATMUL_TRACE(tr[2] = clock64();)
    if (ti.problem != current) {
      map_a = Map(p, ti.problem, 0);
      map_b = Map(p, ti.problem, 1);
      if (!Inline(p) && !Diag(p, kDiagNoAcquire)) {
        // Built and flagged before the scheduler handed the tile over.
        AcquireMap(map_a);
        AcquireMap(map_b);
      }
      PrefetchMap(map_a);
      PrefetchMap(map_b);
      current = ti.problem;
    }
    for (int kb = 0; kb < ti.kblocks; ++kb, ++seq) {
      const int s = seq % L::kStages;
      MbarWait(&sm.empty[s], ((seq / L::kStages) & 1) ^ 1);
      MATMUL_TRACE(if (kb == 0) tr[3] = clock64();)
      if (kb == 0) sm.stage_info[s] = ti;  // Released to the consumers by the arrive below.
      if (Diag(p, kDiagNoLoads) && seq >= L::kStages) {
        MbarArrive(&sm.full[s]);
      } else {
        IssueStage<T, BN, kCluster>(ti.flags, map_a, map_b, sm.stages, sm.full, s, ti.kb0 + kb,
                                    ti.m0, ti.n0, rank);
      }
      atomicAdd(sm.issued, 1);
    }
    MATMUL_TRACE(tr[4] = clock64();
                 TraceRecord(p, 1, 0, ti.tile, ti.problem, ti.kblocks, TraceUnit(ti.flags), tr);)
  }
  const int s = seq % L::kStages;
  MbarWait(&sm.empty[s], ((seq / L::kStages) & 1) ^ 1);
  sm.stage_info[s].tile = -1;
  MbarArrive(&sm.full[s]);
}

template <typename TOut>
__device__ __forceinline__ void StorePair(TOut* d, float v0, float v1, bool two, bool paired);

template <>
__device__ __forceinline__ void StorePair<float>(float* d, float v0, float v1, bool two,
                                                 bool paired) {
  if (two && paired) {
    *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
  } else {
    d[0] = v0;
    if (two) d[1] = v1;
  }
}
template <>
__device__ __forceinline__ void StorePair<__nv_bfloat16>(__nv_bfloat16* d, float v0, float v1,
                                                         bool two, bool paired) {
  if (two && paired) {
    *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(v0, v1);
  } else {
    d[0] = __float2bfloat16_rn(v0);
    if (two) d[1] = __float2bfloat16_rn(v1);
  }
}
template <>
__device__ __forceinline__ void StorePair<__half>(__half* d, float v0, float v1, bool two,
                                                  bool paired) {
  if (two && paired) {
    *reinterpret_cast<__half2*>(d) = __floats2half2_rn(v0, v1);
  } else {
    d[0] = __float2half_rn(v0);
    if (two) d[1] = __float2half_rn(v1);
  }
}

__device__ __forceinline__ float LoadOut(const float* p) { return *p; }
__device__ __forceinline__ float LoadOut(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float LoadOut(const __half* p) { return __half2float(*p); }

// Writes a consumer warpgroup's 64 x BN accumulators (alpha/beta applied).
template <typename TOut, int BN>
__device__ void Epilogue(const DeviceGemmProblem& pr, const float (&acc)[BN / 2], int row0,
                         int col0) {
  const int t = threadIdx.x & 127;
  const int warp = t >> 5, lane = t & 31;
  const float alpha = static_cast<float>(pr.alpha);
  const float beta = static_cast<float>(pr.beta);
  const bool use_c = pr.beta != 0.0;
  TOut* d = static_cast<TOut*>(pr.d);
  const TOut* c = static_cast<const TOut*>(pr.c);
  const bool paired = (pr.ldd % 2 == 0) && (reinterpret_cast<uintptr_t>(d) % (2 * sizeof(TOut)) == 0);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + warp * 16 + (lane >> 2) + half * 8;
    if (row >= pr.m) continue;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int64_t col = col0 + j * 8 + (lane & 3) * 2;
      if (col >= pr.n) continue;
      const bool two = col + 1 < pr.n;
      float v0 = alpha * acc[j * 4 + half * 2 + 0];
      float v1 = alpha * acc[j * 4 + half * 2 + 1];
      if (use_c) {
        const TOut* cp = c + row * pr.ldc + col;
        v0 += beta * LoadOut(cp);
        if (two) v1 += beta * LoadOut(cp + 1);
      }
      StorePair<TOut>(d + row * pr.ldd + col, v0, v1, two, paired);
    }
  }
}

// Writes a consumer warpgroup's 64 x BN accumulators (times alpha) through
// shared memory with TMA stores: the tile goes in boxes of 64 rows x 128
// bytes. The stores run on after the warpgroup returns to its main loop;
// TMA clips rows and columns outside the problem. Boxes start below `width`
// (the tile's MMA width) only.
//
// kHeld (16-bit inputs, `held`: this warpgroup's half of the stage
// MainLoop kept): every earlier store has finished reading (ReleaseHeld), and
// the boxes take the two buffers, then the held half's kHeldBoxes, in turn,
// waiting only where a box comes back to a slot of this tile's: a 128 x 256
// tile of 16-bit outputs (four boxes) never waits. Otherwise the boxes
// alternate between the two buffers, each waiting for the store two boxes
// back, and `stores` (this warpgroup's boxes so far) picks the buffer.
template <typename TOut, int BN, bool kHeld>
__device__ void EpilogueTma(float alpha, const CUtensorMap* map_d, const float (&acc)[BN / 2],
                            int row0, int col0, int width, uint8_t* buffers, uint8_t* held,
                            int wg, int& stores) {
  constexpr int kCols = kRowBytes / static_cast<int>(sizeof(TOut));  // Columns per box.
  constexpr int kBoxes = BN / kCols;
  constexpr int kBufferBytes = Layout<BN>::kStoreBufferBytes;
  constexpr int kSlots = 2 + Layout<BN>::kHeldBoxes;  // With a held stage.
  const int t = threadIdx.x & 127;
  const int warp = t >> 5, lane = t & 31;
  const bool leader = t == 0;
#pragma unroll
  for (int box = 0; box < kBoxes; ++box, ++stores) {
    if (box * kCols >= width) break;  // An edge tile's boxes end at its MMA width.
    uint8_t* buffer;
    if constexpr (kHeld) {
      const int slot = box % kSlots;
      buffer = slot < 2 ? buffers + slot * kBufferBytes : held + (slot - 2) * kBufferBytes;
      if (box >= kSlots) {  // The store kSlots boxes back is done reading.
        if (leader) BulkWaitRead<kSlots - 1>();
        NamedBarrier(1 + wg, 128);
      }
    } else {
      buffer = buffers + (stores & 1) * kBufferBytes;
      // The store that last read this buffer (two boxes ago) is done reading.
      if (leader) BulkWaitRead<1>();
      NamedBarrier(1 + wg, 128);
    }
#pragma unroll
    for (int jj = 0; jj < kCols / 8; ++jj) {
      const int j = box * (kCols / 8) + jj;  // 8-column group of the accumulators
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = warp * 16 + (lane >> 2) + half * 8;
        const int byte = (jj * 8 + (lane & 3) * 2) * static_cast<int>(sizeof(TOut));
        // 128-byte swizzle: 16-byte unit u of row r sits at unit u ^ (r % 8).
        const int at = r * kRowBytes + ((((byte >> 4) ^ (r & 7))) << 4) + (byte & 15);
        StorePair<TOut>(reinterpret_cast<TOut*>(buffer + at), alpha * acc[j * 4 + half * 2 + 0],
                        alpha * acc[j * 4 + half * 2 + 1], true, true);
      }
    }
    FenceProxyAsync();
    NamedBarrier(1 + wg, 128);
    if (leader) {
      TmaStore2d(map_d, buffer, col0 + box * kCols, row0);
      BulkCommit();
    }
  }
}

// D stored n x m (kInfoTransposeD, TF32 only, so float32 out): writes a
// consumer warpgroup's 64 x BN accumulators, element (r, c) of the tile to
// d[c * ldd + r], alpha/beta applied. For fixed lane & 3, a warp's lanes
// write 8 consecutive floats (one 32-byte sector) of each of 4 rows of D.
template <int BN>
__device__ void EpilogueTransposed(const DeviceGemmProblem& pr, const float (&acc)[BN / 2],
                                   int row0, int col0) {
  const int t = threadIdx.x & 127;
  const int warp = t >> 5, lane = t & 31;
  const float alpha = static_cast<float>(pr.alpha);
  const float beta = static_cast<float>(pr.beta);
  const bool use_c = pr.beta != 0.0;
  float* d = static_cast<float*>(pr.d);
  const float* c = static_cast<const float*>(pr.c);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + warp * 16 + (lane >> 2) + half * 8;
    if (row >= pr.m) continue;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = col0 + j * 8 + (lane & 3) * 2 + e;
        if (col >= pr.n) continue;
        float v = alpha * acc[j * 4 + half * 2 + e];
        if (use_c) v += beta * c[col * pr.ldc + row];
        d[col * pr.ldd + row] = v;
      }
    }
  }
}

// D stored n x m, by TMA (kInfoTransposeD with kInfoTmaStore): the
// warpgroup's 64 x BN accumulators are columns row0 .. row0 + 63 of D's
// rows col0 .. col0 + BN - 1, stored as boxes of 64 rows of D by 32
// columns (128 bytes), two at a time: for each 64 rows, warps 0-1 fill the
// box of the first 32 columns in one buffer while warps 2-3 fill the other
// in the second, then both are stored. Each box is its own bulk group, so
// that `stores` keeps picking buffers as EpilogueTma expects. Writes into
// the swizzled boxes are free of bank conflicts: a warp's 32 lanes cover
// 8 columns (two 16-byte units) of 4 rows whose swizzle differs.
template <int BN>
__device__ void EpilogueTmaTransposed(float alpha, const CUtensorMap* map_d,
                                      const float (&acc)[BN / 2], int row0, int col0,
                                      uint8_t* buffers, int wg, int& stores) {
  constexpr int kBufferBytes = Layout<BN>::kStoreBufferBytes;
  static_assert(kBufferBytes == 64 * kRowBytes, "a box of 64 rows of 128 bytes a buffer");
  const int t = threadIdx.x & 127;
  const int warp = t >> 5, lane = t & 31;
  const bool leader = t == 0;
  const int box = warp >> 1;  // This warp's box: columns row0 + 32 box ...
#pragma unroll
  for (int q = 0; q < BN / 64; ++q, stores += 2) {
    // Both buffers' earlier stores are done reading them.
    if (leader) BulkWaitRead<0>();
    NamedBarrier(1 + wg, 128);
    uint8_t* buffer = buffers + ((stores + box) & 1) * kBufferBytes;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {  // The 8-column groups of the accumulators in these rows.
      const int j = q * 8 + jj;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = jj * 8 + (lane & 3) * 2 + e;                     // Row in the box.
          const int byte = ((warp & 1) * 16 + (lane >> 2) + half * 8) * 4;  // Byte in the row.
          const int at = r * kRowBytes + (((byte >> 4) ^ (r & 7)) << 4) + (byte & 15);
          *reinterpret_cast<float*>(buffer + at) = alpha * acc[j * 4 + half * 2 + e];
        }
      }
    }
    FenceProxyAsync();
    NamedBarrier(1 + wg, 128);
    if (leader) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        TmaStore2d(map_d, buffers + ((stores + b) & 1) * kBufferBytes, row0 + 32 * b,
                   col0 + 64 * q);
        BulkCommit();
      }
    }
  }
}

// Stores a consumer warpgroup's 64 x BN accumulators as the rows from
// `row0` of tile `ti`: by TMA through `map_d` (acquired by the caller)
// where the tile's flags say so, else from registers. kHeld, `width`,
// `buffers`, `held`, `wg` and `stores` as for EpilogueTma (the transposed
// epilogue takes no held stage: TF32 inputs hold none).
template <typename T, int BN, bool kHeld>
__device__ __forceinline__ void StoreRows(const Params& p, const TileInfo& ti,
                                          const CUtensorMap* map_d, const float (&acc)[BN / 2],
                                          int row0, int width, uint8_t* buffers, uint8_t* held,
                                          int wg, int& stores) {
  if constexpr (sizeof(T) == 4) {
    if (ti.flags & kInfoTransposeD) {  // TF32: float32 out, never narrow.
      if (ti.flags & kInfoTmaStore) {
        EpilogueTmaTransposed<BN>(ti.alpha, map_d, acc, row0, ti.n0, buffers, wg, stores);
      } else {
        EpilogueTransposed<BN>(Problem(p, ti.problem), acc, row0, ti.n0);
      }
      return;
    }
  }
  if (ti.flags & kInfoTmaStore) {
    switch (p.output) {
      case DType::kFloat32:
        EpilogueTma<float, BN, kHeld>(ti.alpha, map_d, acc, row0, ti.n0, width, buffers, held,
                                      wg, stores);
        break;
      case DType::kBFloat16:
        EpilogueTma<__nv_bfloat16, BN, kHeld>(ti.alpha, map_d, acc, row0, ti.n0, width, buffers,
                                              held, wg, stores);
        break;
      default:
        EpilogueTma<__half, BN, kHeld>(ti.alpha, map_d, acc, row0, ti.n0, width, buffers, held,
                                       wg, stores);
        break;
    }
    return;
  }
  const DeviceGemmProblem& pr = Problem(p, ti.problem);
  switch (p.output) {
    case DType::kFloat32: Epilogue<float, BN>(pr, acc, row0, ti.n0); break;
    case DType::kBFloat16: Epilogue<__nv_bfloat16, BN>(pr, acc, row0, ti.n0); break;
    default: Epilogue<__half, BN>(pr, acc, row0, ti.n0); break;
  }
}

// Makes tile `ti`'s D map (map_d) visible to this warpgroup's TMA stores:
// its first thread acquires the map once per problem (`acquired_d`: the
// problem it last acquired) where the tile stores by TMA through a map
// built in global memory, by a map builder or a scheduler (this CTA's or
// another's) and seen through the map flag before the tile was handed over.
__device__ __forceinline__ void AcquireStoreMap(const Params& p, const TileInfo& ti,
                                                const CUtensorMap* map_d, int& acquired_d) {
  if ((ti.flags & kInfoTmaStore) && (threadIdx.x & 127) == 0 && acquired_d != ti.problem &&
      !Inline(p) && !Diag(p, kDiagNoAcquire)) {
    AcquireMap(map_d);
    acquired_d = ti.problem;
  }
}

// Gives stage `s` back to the loader: this CTA's and, with clusters, the
// peer's (whose multicast writes into this CTA's stage too). Called by the
// whole warp once its reads of the stage (its MMAs, and at a tile's first
// stage lane 0's read of the TileInfo) are done; each consumer warp arrives
// for itself, so that every read is ordered before the stage is refilled.
template <int kCluster>
__device__ __forceinline__ void Release(uint64_t* empty, int s) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) {
    MbarArrive(&empty[s]);
    if constexpr (kCluster > 1) MbarArriveCluster(&empty[s], ClusterRank() ^ 1);
  }
}

// The wgmma descriptors of k-step `j` of a stage: A's 64-row box `box`
// (sa: the stage's A tile; kAmn: A stored m-major, i.e. transposed) and B's
// (sb: the stage's B tile; kBmn: B stored n-major). MainLoop's warpgroup
// reads box `wg`, a ping-pong warpgroup both.
template <typename T, int kAmn>
__device__ __forceinline__ uint64_t DescA(uint32_t sa, int box, int j) {
  constexpr int BK = Elem<T>::kBK;
  if constexpr (kAmn) {
    // A box holds 64 rows; a k-step is 16 rows of 128 B.
    return Desc(sa + box * BK * kRowBytes + j * 16 * kRowBytes, BK * kRowBytes, 1024);
  } else {
    // 64 rows of 128 B per box; a k-step is 32 bytes along the row.
    return Desc(sa + box * 64 * kRowBytes + j * 32, 16, 1024);
  }
}
template <typename T, int kBmn>
__device__ __forceinline__ uint64_t DescB(uint32_t sb, int j) {
  constexpr int BK = Elem<T>::kBK;
  if constexpr (kBmn) {
    return Desc(sb + j * 16 * kRowBytes, BK * kRowBytes, 1024);
  } else {
    return Desc(sb + j * 32, 16, 1024);
  }
}

// 16-bit inputs hold each tile's last stage for its epilogue (MainLoop's
// kHold; SkipStages too), and every tile has at least one k-block (the
// launcher sends problems with K = 0 elsewhere). So between tiles, with `seq`
// the next k-block, the held stage is always that of k-block seq - 1, and
// there is one whenever seq > 0: no state to keep, which would cost the
// consumers a register they do not have (ptxas spilled with a flag).
template <int BN>
__device__ __forceinline__ int HeldStage(int seq) {
  return (seq - 1) % Layout<BN>::kStages;
}

// Gives back the stage held for the epilogue of the warpgroup's tile before
// (HeldStage(seq), seq > 0), once this warpgroup's TMA stores have all
// finished reading shared memory (its first thread issued them and waits;
// the others wait for it at the warpgroup's barrier). Afterwards every store
// buffer is free, so the next epilogue writes its first boxes without
// waiting.
template <int BN, int kCluster>
__device__ __forceinline__ void ReleaseHeld(uint64_t* empty, int seq, int wg) {
  if ((threadIdx.x & 127) == 0) BulkWaitRead<0>();
  NamedBarrier(1 + wg, 128);
  Release<kCluster>(empty, HeldStage<BN>(seq));
}

// A consumer warpgroup's k-blocks of one tile: MMAs kN wide (BN, or less
// for an edge tile: they then write only the first kN / 2 accumulators,
// the columns they cover, which hold the same places as in a full-width
// MMA).
//
// kHold (16-bit inputs): the tile's last stage is not given back when its
// MMAs are done but kept (HeldStage) for the epilogue's store boxes
// (EpilogueTma), so that a 128 x 256 tile's four boxes a warpgroup never
// wait for each other; the stage held for the tile before goes back after
// this tile's first MMAs are issued (ReleaseHeld), while the loader still
// has the ring's other stages to fill. Shared memory has room for two
// 8 KiB buffers a warpgroup besides the four 48 KiB stages; lending one of
// the four to the epilogue for good cost single problems 4-5%
// (docs/BENCHMARKS.md, eighteenth round).
template <typename T, int BN, int kN, int kCluster, int kAmn, int kBmn, bool kHold>
__device__ __forceinline__ void MainLoop(float (&acc)[BN / 2], uint8_t* stages, uint64_t* full,
                                         uint64_t* empty, int kblocks, int& seq, int wg,
                                         bool no_mma) {
  static_assert(kN <= BN && kN >= 64, "MMA width");
  using L = Layout<BN>;
  constexpr int BK = Elem<T>::kBK;
  constexpr int kSteps = BK / Elem<T>::kStep;
  float(&part)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[0]);
  int previous = -1;  // Stage whose MMAs may still be running.
  // One k-block (the next, `seq`): its MMAs issued, the block before's done.
  auto block = [&]() {
    const int s = seq % L::kStages;
    MbarWait(&full[s], (seq / L::kStages) & 1);
    const uint32_t sa = SmemAddr(stages + s * L::kStageBytes);
    const uint32_t sb = sa + L::kABytes;
    WgmmaFence();
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      const uint64_t da = DescA<T, kAmn>(sa, wg, j);
      const uint64_t db = DescB<T, kBmn>(sb, j);
      if (!no_mma) Mma<T, kN, kAmn, kBmn>(part, da, db);
    }
    WgmmaCommit();
    // Keep this k-block's MMAs in flight; the previous block's are done, so
    // its stage goes back to the loader.
    WgmmaWait<1>();
    FenceRegisters(acc);
    if (previous >= 0) Release<kCluster>(empty, previous);
    previous = s;
    ++seq;
  };
  // Every tile has a k-block (HeldStage). The first is peeled off, so that
  // the stage held for the tile before goes back with its MMAs in flight:
  // the test inside the loop cost the consumers registers (ptxas spilled).
  block();
  if (kHold && seq > 1) ReleaseHeld<BN, kCluster>(empty, seq - 1, wg);
  for (int kb = 1; kb < kblocks; ++kb) block();
  WgmmaWait<0>();
  FenceRegisters(acc);
  if (!kHold && previous >= 0) Release<kCluster>(empty, previous);  // Else HeldStage(seq).
}

// A consumer warpgroup with no rows in the tile (kInfoFirstHalf): waits for
// each of the tile's stages and gives it back, issuing no MMA. (A run-time
// test around MainLoop's wgmma instead makes ptxas serialize every wgmma of
// the kernel, warning C7520.)
// Like MainLoop (16-bit inputs only), it gives back the stage held for the
// tile before and holds the tile's last (HeldStage).
template <int BN, int kCluster>
__device__ __forceinline__ void SkipStages(uint64_t* full, uint64_t* empty, int kblocks, int& seq,
                                           int wg) {
  using L = Layout<BN>;
  if (seq > 0) ReleaseHeld<BN, kCluster>(empty, seq, wg);
  for (int kb = 0; kb < kblocks; ++kb, ++seq) {
    const int s = seq % L::kStages;
    MbarWait(&full[s], (seq / L::kStages) & 1);
    if (kb + 1 < kblocks) Release<kCluster>(empty, s);
  }
}

// MainLoop at the tile's MMA width (NarrowShift of its flags).
// 16-bit inputs: the tile's last stage is held for its epilogue (kHold).
template <typename T, int BN, int kCluster, int kAmn, int kBmn>
__device__ __forceinline__ void MainLoopAtWidth(int shift, float (&acc)[BN / 2], uint8_t* stages,
                                                uint64_t* full, uint64_t* empty, int kblocks,
                                                int& seq, int wg, bool no_mma) {
  if constexpr (kCluster == 1 && BN / 4 >= 64) {
    if (shift == 2) {
      MainLoop<T, BN, BN / 4, kCluster, kAmn, kBmn, true>(acc, stages, full, empty, kblocks, seq,
                                                          wg, no_mma);
      return;
    }
  }
  if constexpr (kCluster == 1 && BN / 2 >= 64) {
    if (shift == 1) {
      MainLoop<T, BN, BN / 2, kCluster, kAmn, kBmn, true>(acc, stages, full, empty, kblocks, seq,
                                                          wg, no_mma);
      return;
    }
  }
  MainLoop<T, BN, BN, kCluster, kAmn, kBmn, true>(acc, stages, full, empty, kblocks, seq, wg,
                                                  no_mma);
}

// TF32 MMA of width BN with A from registers.
template <int BN>
__device__ __forceinline__ void MmaRegA(float (&acc)[BN / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (BN == 256) wgmma::MmaTf32RegAN256(acc, a, db, 1);
  else if constexpr (BN == 128) wgmma::MmaTf32RegAN128(acc, a, db, 1);
  else wgmma::MmaTf32RegAN64(acc, a, db, 1);
}

// TF32 tiles with A stored k x m (kInfoTransposeA), which wgmma cannot read
// from shared memory: each thread loads its register fragment of A from
// the stage's A tile, laid out by TMA as four boxes of 32 columns (m) by 32
// rows (k) of 128 bytes, 128-byte swizzled, and wgmma takes A from those
// registers (B as in MainLoop, K-major). Thread (warp w, lane l) of
// warpgroup wg holds, per k-step of 8, the elements (r, k), (r + 8, k),
// (r, k + 4) and (r + 8, k + 4), r = 64 wg + 16 w + l / 4 and k = l % 4
// (wgmma's m64nNk8 register fragment). Loads by a warp touch 16 banks
// twice each (two-way conflicts).
//
// Each k-step's MMA is its own wgmma group with its own fragment set, of
// four in a ring. The fragment of the next k-step (at a block's last step,
// the first of the next block, whose stage it waits for) is loaded before
// this step's MMA is issued, and after each issue the thread waits until
// at most two groups are pending, so that the set it loads next was read
// by an MMA that is done. ptxas keeps wgmmas in flight in this order; where
// a step's fragment was loaded just before its own MMA after waiting down
// to three pending groups, it serialized every wgmma of the kernel (C7513).
// A k-block's stage goes back to the loader once its last MMA is done, at
// the second k-step of the next block.
template <int BN, int kCluster>
__device__ __forceinline__ void MainLoopRegA(float (&acc)[BN / 2], uint8_t* stages, uint64_t* full,
                                             uint64_t* empty, int kblocks, int& seq, int wg,
                                             bool no_mma) {
  using L = Layout<BN>;
  constexpr int BK = Elem<float>::kBK;
  constexpr int kSteps = BK / Elem<float>::kStep;
  static_assert(kSteps == 4, "a ring of four fragment sets, one per k-step of a block");
  const int t = threadIdx.x & 127;
  const int warp = t >> 5, lane = t & 31;
  const int box = 2 * wg + (warp >> 1);  // Rows 64 wg + 16 w .. + 15 lie in one box.
  uint32_t offsets[4];                   // a0..a3 of k-step 0, in bytes from the A tile.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = (warp & 1) * 16 + (lane >> 2) + (i & 1) * 8;  // Column in the box.
    const int k = (lane & 3) + (i >> 1) * 4;                    // Row in the box.
    offsets[i] = box * BK * kRowBytes + k * kRowBytes + ((((c >> 2) ^ (k & 7))) << 4) + (c & 3) * 4;
  }
  // Fragment of k-step j of the stage at `sa`; k-step j is 8 rows (1024
  // bytes) further than k-step 0, with the same swizzle (row % 8).
  auto load = [&](uint32_t(&f)[4], const uint8_t* sa, int j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[i] = *reinterpret_cast<const uint32_t*>(sa + offsets[i] + j * 8 * kRowBytes);
    }
  };
  uint32_t frag[kSteps][4];
  int previous = -1;  // Stage whose MMAs may still be running.
  {
    const int s = seq % L::kStages;
    MbarWait(&full[s], (seq / L::kStages) & 1);
    load(frag[0], stages + s * L::kStageBytes, 0);
  }
  for (int kb = 0; kb < kblocks; ++kb, ++seq) {
    const int s = seq % L::kStages;
    const uint8_t* sa = stages + s * L::kStageBytes;
    const uint32_t sb = SmemAddr(sa + L::kABytes);
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      if (j + 1 < kSteps) {
        load(frag[j + 1], sa, j + 1);
      } else if (kb + 1 < kblocks) {
        const int next = (seq + 1) % L::kStages;
        MbarWait(&full[next], ((seq + 1) / L::kStages) & 1);
        load(frag[0], stages + next * L::kStageBytes, 0);
      }
      WgmmaFence();
      if (!no_mma) MmaRegA<BN>(acc, frag[j], DescB<float, 0>(sb, j));
      WgmmaCommit();
      WgmmaWait<2>();
      if (j == 1 && previous >= 0) {  // Every MMA of the block before is done.
        Release<kCluster>(empty, previous);
        previous = -1;
      }
    }
    previous = s;
  }
  WgmmaWait<0>();
  FenceRegisters(acc);
  if (previous >= 0) Release<kCluster>(empty, previous);
}

// Consumer warp: the TileInfo at `info`, read by lane 0 alone and passed to
// the other lanes by shuffles, so that the warp's only shared-memory read of
// it comes before, in lane 0's own program order, the arrive with which
// lane 0 later releases the stage.
__device__ __forceinline__ TileInfo ReadTileInfo(const TileInfo* info) {
  int v[8];
  if ((threadIdx.x & 31) == 0) {
    const int4 lo = reinterpret_cast<const int4*>(info)[0];
    const int4 hi = reinterpret_cast<const int4*>(info)[1];
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
    v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __shfl_sync(0xffffffffu, v[i], 0);
  TileInfo ti;
  ti.tile = v[0];
  ti.problem = v[1];
  ti.m0 = v[2];
  ti.n0 = v[3];
  ti.kblocks = v[4];
  ti.flags = v[5];
  ti.alpha = __int_as_float(v[6]);
  ti.kb0 = v[7];
  return ti;
}

// Consumer warpgroup `wg`, after the main loop of a split tile's unit
// (HopperSplit): writes its 64 x BN float32 partial to the unit's slot and
// counts itself in on the tile's counter for this warpgroup. True for the
// last of the tile's units to get there: its accumulators then hold the sum
// of every unit's partial, added in unit order (0, 1, ...) so that the
// result is the same whichever unit finished last, and it runs the
// epilogue; it also sets the counter back to zero for the next launch.
// False for the others, which are done with the tile. Each thread keeps its
// own accumulators' places (float4 i of thread t at i * 128 + t), so that
// every access is coalesced.
template <int BN>
__device__ __forceinline__ bool ReduceSplit(const Params& p, int flags, float (&acc)[BN / 2],
                                            int wg, int* last_flag) {
  constexpr int kVecs = BN / 8;           // float4s a thread holds.
  constexpr int kPiece = kVecs * 128;     // float4s of one warpgroup's partial.
  const int t = threadIdx.x & 127;
  const int splits = p.split.splits;
  const int unit = (flags >> kInfoSplitShift) & 0xff;
  const int slot = static_cast<int>(static_cast<unsigned>(flags) >> kInfoSlotShift);
  // A tile's partials: unit-major, then warpgroup.
  float4* tile_partials =
      reinterpret_cast<float4*>(p.split.partials) + static_cast<size_t>(slot) * splits * 2 * kPiece;
  float4* mine = tile_partials + (unit * 2 + wg) * kPiece + t;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    __stcg(mine + i * 128, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
  }
  __threadfence();  // This thread's partial before the count below.
  NamedBarrier(1 + wg, 128);
  if (t == 0) {
    unsigned int* counter = p.split.counters + 2 * slot + wg;
    const bool last = atomicAdd(counter, 1u) == static_cast<unsigned>(splits - 1);
    if (last) atomicExch(counter, 0u);  // Every unit has counted: ready for the next launch.
    *last_flag = last;
  }
  NamedBarrier(1 + wg, 128);
  if (*last_flag == 0) return false;
  __threadfence();  // The other units' partials after their counts.
  // Unit 0's partial, then each later one added in unit order. (A split
  // tile costs about six k-blocks' time per partial on the H200, and not
  // because of these loads: fences between groups of them, or the sum
  // done box by box in the TMA epilogue, measured the same;
  // docs/BENCHMARKS.md, seventh round.)
  const float4* piece = tile_partials + wg * kPiece + t;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const float4 v = __ldcg(piece + i * 128);
    acc[4 * i] = v.x, acc[4 * i + 1] = v.y, acc[4 * i + 2] = v.z, acc[4 * i + 3] = v.w;
  }
  for (int u = 1; u < splits; ++u) {
    piece += 2 * kPiece;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const float4 v = __ldcg(piece + i * 128);
      acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
    }
  }
  return true;
}

template <typename T, int BN, int kCluster>
__device__ void Consume(const Params& p, const Smem<BN>& sm) {
  using L = Layout<BN>;
  uint8_t* stages = sm.stages;
  uint64_t* full = sm.full;
  uint64_t* empty = sm.empty;
  const int wg = (threadIdx.x >> 7) - 1;  // 0 or 1
  uint8_t* store_buffers = stages + L::kStoreOffset + wg * 2 * L::kStoreBufferBytes;
  int stores = 0;         // TMA-stored boxes so far (picks the staging buffer)
  int acquired_d = -1;    // Problem whose D map this warpgroup last acquired
  float acc[BN / 2];
  int seq = 0;
  if (wg == 1 && Diag(p, kDiagStagger)) __nanosleep(2000);
  while (true) {
    MATMUL_TRACE(unsigned long long tr[kTraceStamps] = {}; tr[0] = GlobalNs(); tr[1] = clock64();)
    // The tile's first stage says which tile it is (MainLoop's own wait on
    // this stage then returns at once).
    {
      const int s = seq % L::kStages;
      MbarWait(&full[s], (seq / L::kStages) & 1);
    }
    const TileInfo ti = ReadTileInfo(&sm.stage_info[seq % L::kStages]);
    if (ti.tile < 0) break;
    MATMUL_TRACE(tr[2] = clock64();
                 const bool tracer = (threadIdx.x & 127) == 0;
                 auto record = [&] {
                   if (tracer) {
                     TraceRecord(p, 0, wg, ti.tile, ti.problem, ti.kblocks, TraceUnit(ti.flags), tr);
                   }
                 };)
    const int kblocks = ti.kblocks;
    if (Diag(p, kDiagEarlyAcquireD)) {
      AcquireStoreMap(p, ti, Map(p, ti.problem, 2), acquired_d);
    } else if (Diag(p, kDiagPrefetchD) && (ti.flags & kInfoTmaStore) &&
               (threadIdx.x & 127) == 0 && acquired_d != ti.problem && !Inline(p)) {
      PrefetchMap(Map(p, ti.problem, 2));
    }
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    FenceRegisters(acc);
    // The second warpgroup of a tile whose rows all fall in the first's
    // computes nothing (its stages' A rows are TMA's zero fill, or not
    // loaded at all) and stores nothing.
    const bool idle = sizeof(T) == 2 && wg == 1 && (ti.flags & kInfoFirstHalf);
    const bool no_mma = Diag(p, kDiagNoMma);
    const int shift = NarrowShift(ti.flags);
    if (idle) {
      SkipStages<BN, kCluster>(full, empty, kblocks, seq, wg);
    } else if constexpr (sizeof(T) == 4) {
      // TF32 tiles are never trimmed (EdgeFlags is for 16-bit inputs). B is
      // always K-major (the launcher sees to it); A stored k x m goes
      // through registers.
      if (ti.flags & kInfoTransposeA) {
        MainLoopRegA<BN, kCluster>(acc, stages, full, empty, kblocks, seq, wg, no_mma);
      } else {
        MainLoop<T, BN, BN, kCluster, 0, 0, false>(acc, stages, full, empty, kblocks, seq, wg,
                                                   no_mma);
      }
    } else {
      const int layout =
          ((ti.flags & kInfoTransposeA) ? 2 : 0) + ((ti.flags & kInfoTransposeB) ? 0 : 1);
      switch (layout) {
        case 0: MainLoopAtWidth<T, BN, kCluster, 0, 0>(shift, acc, stages, full, empty, kblocks, seq, wg, no_mma); break;
        case 1: MainLoopAtWidth<T, BN, kCluster, 0, 1>(shift, acc, stages, full, empty, kblocks, seq, wg, no_mma); break;
        case 2: MainLoopAtWidth<T, BN, kCluster, 1, 0>(shift, acc, stages, full, empty, kblocks, seq, wg, no_mma); break;
        default: MainLoopAtWidth<T, BN, kCluster, 1, 1>(shift, acc, stages, full, empty, kblocks, seq, wg, no_mma); break;
      }
    }
    MATMUL_TRACE(tr[3] = clock64();)
    if constexpr (sizeof(T) == 2) {
      // Each warpgroup's store boxes go over operand bytes of the held stage
      // that the other warpgroup's MMAs read (its half holds B columns both
      // multiply by): both main loops are done before either writes. A
      // warpgroup with no rows in the tile (idle) waits too rather than only
      // arriving: after a bare arrival it could run through the next tile's
      // stages (a short tile whose k-blocks fit the free stages) and arrive
      // again, and two arrivals of its 128 threads would complete a barrier
      // of 256 without the other warpgroup.
      NamedBarrier(kTileEndBarrier, 256);
    }
    if (Diag(p, kDiagNoStores)) continue;
    if constexpr (kCluster == 1) {
      // This warpgroup's split flag: the ints after the loader's count
      // (Layout), addressed from `stages`, which the consumers hold anyway.
      int* last_flag = reinterpret_cast<int*>(stages + L::kIssuedOffset) + 1 + wg;
      if ((ti.flags & kInfoSplit) && !ReduceSplit<BN>(p, ti.flags, acc, wg, last_flag)) {
        MATMUL_TRACE(tr[4] = tr[5] = clock64(); record();)
        continue;  // Another unit of the tile finishes it.
      }
    }
    MATMUL_TRACE(tr[4] = clock64();)
    if (idle) {  // Its rows are all below the problem: nothing to store.
      MATMUL_TRACE(tr[5] = tr[4]; record();)
      continue;
    }
    const CUtensorMap* map_d = Map(p, ti.problem, 2);
    AcquireStoreMap(p, ti, map_d, acquired_d);
    // 16-bit inputs: this warpgroup's half of the held stage lends the
    // epilogue its boxes.
    constexpr bool kHeld = sizeof(T) == 2;
    uint8_t* held_half = stages + HeldStage<BN>(seq) * L::kStageBytes + wg * (L::kStageBytes / 2);
    StoreRows<T, BN, kHeld>(p, ti, map_d, acc, ti.m0 + wg * 64, BN >> shift, store_buffers,
                            held_half, wg, stores);
    MATMUL_TRACE(tr[5] = clock64(); record();)
  }
  if constexpr (sizeof(T) == 2) {
    if (seq > 0) ReleaseHeld<BN, kCluster>(empty, seq, wg);
  }
  // Shared memory must outlive the last stores' reads, and their writes
  // must land before the grid ends.
  if ((threadIdx.x & 127) == 0) BulkWaitAll();
}

// Ping-pong consumers (kPing: 16-bit inputs, single CTAs, no split tiles):
// each warpgroup takes every other tile, all 128 rows of it, from the one
// ring of stages, so that one warpgroup's epilogue runs while the other's
// MMAs do. Measured on the H100
// (docs/BENCHMARKS.md, twelfth round), a small tile of the 1024-problem
// batch spent as long in its epilogue (1.7 us) as in its main loop, with
// the tensor cores idle meanwhile. Accumulators: rows 0-63 in acc[0, BN/2),
// rows 64-127 in acc[BN/2, BN), each in the layout the cooperative
// consumers use for their 64 rows, so the same epilogues store them.

// One ping-pong warpgroup's k-blocks of one tile: per k-step, an MMA kN
// wide for each of the tile's kHalves 64-row halves (1 where the tile's
// rows fit the first 64: kInfoFirstHalf).
// Once every MMA of the tile is issued, the warpgroup's warps arrive on
// `next_turn`, letting the other warpgroup start its main loop.
template <typename T, int BN, int kN, int kHalves, int kAmn, int kBmn>
__device__ __forceinline__ void MainLoopPing(float (&acc)[BN], uint8_t* stages, uint64_t* full,
                                             uint64_t* empty, uint64_t* next_turn, int kblocks,
                                             int& seq, bool no_mma) {
  static_assert(kN <= BN && kN >= 64, "MMA width");
  using L = Layout<BN>;
  constexpr int BK = Elem<T>::kBK;
  constexpr int kSteps = BK / Elem<T>::kStep;
  float(&part0)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[0]);
  float(&part1)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[BN / 2]);
  int previous = -1;  // Stage whose MMAs may still be running.
  for (int kb = 0; kb < kblocks; ++kb, ++seq) {
    const int s = seq % L::kStages;
    MbarWait(&full[s], (seq / L::kStages) & 1);
    const uint32_t sa = SmemAddr(stages + s * L::kStageBytes);
    const uint32_t sb = sa + L::kABytes;
    WgmmaFence();
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      const uint64_t db = DescB<T, kBmn>(sb, j);
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        const uint64_t da = DescA<T, kAmn>(sa, h, j);
        if (!no_mma) {
          if (h == 0) {
            Mma<T, kN, kAmn, kBmn>(part0, da, db);
          } else {
            Mma<T, kN, kAmn, kBmn>(part1, da, db);
          }
        }
      }
    }
    WgmmaCommit();
    if (kb + 1 == kblocks) {
      __syncwarp();
      if ((threadIdx.x & 31) == 0) MbarArrive(next_turn);
    }
    WgmmaWait<1>();
    FenceRegisters(acc);
    if (previous >= 0) Release<1>(empty, previous);
    previous = s;
  }
  WgmmaWait<0>();
  FenceRegisters(acc);
  if (previous >= 0) Release<1>(empty, previous);
}

// MainLoopPing at the tile's MMA width (NarrowShift: BN or BN / 2) and
// number of halves.
template <typename T, int BN, int kAmn, int kBmn>
__device__ __forceinline__ void MainLoopPingAt(int shift, bool one_half, float (&acc)[BN],
                                               uint8_t* stages, uint64_t* full, uint64_t* empty,
                                               uint64_t* next_turn, int kblocks, int& seq,
                                               bool no_mma) {
  if (shift == 1) {
    if (one_half) {
      MainLoopPing<T, BN, BN / 2, 1, kAmn, kBmn>(acc, stages, full, empty, next_turn, kblocks,
                                                 seq, no_mma);
    } else {
      MainLoopPing<T, BN, BN / 2, 2, kAmn, kBmn>(acc, stages, full, empty, next_turn, kblocks,
                                                 seq, no_mma);
    }
  } else if (one_half) {
    MainLoopPing<T, BN, BN, 1, kAmn, kBmn>(acc, stages, full, empty, next_turn, kblocks, seq,
                                           no_mma);
  } else {
    MainLoopPing<T, BN, BN, 2, kAmn, kBmn>(acc, stages, full, empty, next_turn, kblocks, seq,
                                           no_mma);
  }
}

template <typename T, int BN>
__device__ void ConsumePing(const Params& p, const Smem<BN>& sm) {
  static_assert(sizeof(T) == 2 && BN / 2 >= 64 && BN / 4 < 64,
                "ping-pong: 16-bit inputs, tiles at most half-narrowed");
  using L = Layout<BN>;
  const int wg = (threadIdx.x >> 7) - 1;  // 0 or 1
  uint8_t* store_buffers = sm.stages + L::kStoreOffset + wg * 2 * L::kStoreBufferBytes;
  int stores = 0;       // TMA-stored boxes so far (picks the staging buffer)
  int acquired_d = -1;  // Problem whose D map this warpgroup last acquired
  float acc[BN];
  int seq = 0;
  const bool no_mma = Diag(p, kDiagNoMma);
  // Turns: the warpgroups' main loops alternate, tile by tile (warpgroup
  // 0's first, then 1's first, then 0's second...), so that the tensor
  // cores run one warpgroup's MMAs while the other stores. Left to
  // themselves, both would start their first tiles together and stay in
  // step, storing at the same time as the cooperative consumers do.
  // Warpgroup w waits on turn[w], which the other's warps arrive on once
  // they have issued a tile's MMAs; every wait refers to a tile of the
  // other warpgroup that comes earlier in the CTA's order, so it exists.
  //
  // Both read the one ring of stages, each the stages of its own tiles:
  // the loader runs ahead into the next tile's stages while a warpgroup's
  // main loop runs, whoever takes it. (Measured on the H100, a ring of half
  // the stages per warpgroup left the loader blocked on one ring while the
  // other ran dry, and took more than twice as long as the cooperative
  // consumers.) A warpgroup learns how far to skip, the k-blocks of the
  // other's tile in between, from turn_kblocks, written before the turn
  // is handed over. The stage of tile -1 is read by both: a warpgroup that
  // reads it hands over the turn with nothing to skip.
  uint64_t* my_turn = sm.turn + wg;
  uint64_t* next_turn = sm.turn + (wg ^ 1);
  const bool leader = (threadIdx.x & 127) == 0;  // Lane 0 of the warpgroup's first warp.
  int tiles = 0;  // This warpgroup's tiles so far.
  while (true) {
    // Warpgroup 0's tile i waits for the other's tile i - 1, warpgroup 1's
    // tile i for the other's tile i.
    if (wg == 1 || tiles > 0) {
      MbarWait(my_turn, (wg == 0 ? tiles - 1 : tiles) & 1);
      // Lane 0 reads and shares it, as in ReadTileInfo, so that each read
      // is ordered before the warp's next arrive on next_turn.
      int skip = 0;
      if ((threadIdx.x & 31) == 0) skip = *static_cast<volatile int*>(&sm.turn_kblocks[wg ^ 1]);
      seq += __shfl_sync(0xffffffffu, skip, 0);
    }
    ++tiles;
    MbarWait(&sm.full[seq % L::kStages], (seq / L::kStages) & 1);
    const TileInfo ti = ReadTileInfo(&sm.stage_info[seq % L::kStages]);
    if (ti.tile < 0) {
      if (leader) sm.turn_kblocks[wg] = 0;
      __syncwarp();
      if ((threadIdx.x & 31) == 0) MbarArrive(next_turn);
      break;
    }
    // Released to the other warpgroup by this warp's arrive on next_turn.
    if (leader) sm.turn_kblocks[wg] = ti.kblocks;
#pragma unroll
    for (int i = 0; i < BN; ++i) acc[i] = 0.0f;
    FenceRegisters(acc);
    const bool one_half = (ti.flags & kInfoFirstHalf) != 0;
    const int shift = NarrowShift(ti.flags);
    const int layout =
        ((ti.flags & kInfoTransposeA) ? 2 : 0) + ((ti.flags & kInfoTransposeB) ? 0 : 1);
    switch (layout) {
      case 0: MainLoopPingAt<T, BN, 0, 0>(shift, one_half, acc, sm.stages, sm.full, sm.empty, next_turn, ti.kblocks, seq, no_mma); break;
      case 1: MainLoopPingAt<T, BN, 0, 1>(shift, one_half, acc, sm.stages, sm.full, sm.empty, next_turn, ti.kblocks, seq, no_mma); break;
      case 2: MainLoopPingAt<T, BN, 1, 0>(shift, one_half, acc, sm.stages, sm.full, sm.empty, next_turn, ti.kblocks, seq, no_mma); break;
      default: MainLoopPingAt<T, BN, 1, 1>(shift, one_half, acc, sm.stages, sm.full, sm.empty, next_turn, ti.kblocks, seq, no_mma); break;
    }
    if (Diag(p, kDiagNoStores)) continue;
    const int width = BN >> shift;
    const CUtensorMap* map_d = Map(p, ti.problem, 2);
    AcquireStoreMap(p, ti, map_d, acquired_d);
    // Each half at a constant offset: a loop over the halves (even
    // unrolled, with its early exit) put acc in local memory, 512 bytes of
    // stack, and every MMA went through it.
    const float(&top)[BN / 2] = *reinterpret_cast<const float(*)[BN / 2]>(&acc[0]);
    const float(&bottom)[BN / 2] = *reinterpret_cast<const float(*)[BN / 2]>(&acc[BN / 2]);
    StoreRows<T, BN, false>(p, ti, map_d, top, ti.m0, width, store_buffers, nullptr, wg, stores);
    if (!one_half) {  // Otherwise rows 64-127 lie below the problem.
      StoreRows<T, BN, false>(p, ti, map_d, bottom, ti.m0 + 64, width, store_buffers, nullptr,
                              wg, stores);
    }
  }
  // Shared memory must outlive the last stores' reads, and their writes
  // must land before the grid ends.
  if ((threadIdx.x & 127) == 0) BulkWaitAll();
}

template <typename T, int BN, int kCluster, bool kPing = false>
__global__ void __launch_bounds__(kThreads, 1) HopperGroupedGemm(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<BN>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* stages = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const Smem<BN> sm(stages);
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      MbarInit(&sm.full[s], 1);
      // Every consumer warp of every CTA sharing the stage.
      // (Ping-pong: the four warps of the warpgroup whose tile it holds.)
      MbarInit(&sm.empty[s], kPing ? kConsumerWarps / 2 : kConsumerWarps * kCluster);
    }
    for (int i = 0; i < kInfoSlots; ++i) {
      MbarInit(&sm.info_full[i], 1);
      MbarInit(&sm.info_empty[i], 1);
    }
    if constexpr (kCluster > 1) {
      for (int i = 0; i < kUnitSlots; ++i) {
        MbarInit(&sm.unit_full[i], 1);
        MbarInit(&sm.unit_empty[i], 1);
      }
    }
    if constexpr (kPing) {
      MbarInit(&sm.turn[0], kConsumerWarps / 2);  // The four warps of the other warpgroup.
      MbarInit(&sm.turn[1], kConsumerWarps / 2);
    }
    *sm.issued = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // The peer CTA arrives on these barriers and writes these stages.
  if constexpr (kCluster > 1) {
    ClusterSync();
  } else {
    __syncthreads();
  }
  // Register budget: 128 x 56 + 256 x 224 <= 64 Ki. ptxas holds the producer
  // to 56 (at 40 its look-ahead code spilled).
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
    if (threadIdx.x == 0) {
      Load<T, BN, kCluster>(p, sm);
    } else if (threadIdx.x >= 32 && threadIdx.x < 64) {
      Schedule<T, BN, kCluster>(p, sm);
    } else if (threadIdx.x >= 64) {  // Warps 2 and 3: the kMapBuilders builders.
      static_assert(kMapBuilders == (128 - 64) / 32, "one builder per remaining producer warp");
      PrebuildMaps<T, BN, kCluster>(p, sm);
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
    if constexpr (kPing) {
      static_assert(kCluster == 1, "ping-pong runs single CTAs");
      ConsumePing<T, BN>(p, sm);
    } else {
      Consume<T, BN, kCluster>(p, sm);
    }
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if constexpr (kCluster > 1) ClusterSync();
#endif
}

template <typename T, int BN, int kCluster, bool kPing = false>
cudaError_t Prepare() {
  return cudaFuncSetAttribute(HopperGroupedGemm<T, BN, kCluster, kPing>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<BN>::kBytes);
}

// Launch configuration for clusters of `cluster` CTAs along x; `attribute`
// must outlive the configuration's use.
cudaLaunchConfig_t ClusterConfig(int grid, int smem_bytes, cudaStream_t stream, int cluster,
                                 cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = cluster;
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}

#ifdef MATMUL_HOPPER_DIAG
// MATMUL_HOPPER_TRACE (see TraceRecord): true where this launch is the one
// to trace, with `p.trace` set.
bool TraceBegin(Params& p, cudaStream_t stream) {
  static int launches = 0;
  static unsigned long long* buffer = nullptr;
  constexpr unsigned int kCapacity = 1u << 17;
  p.trace = nullptr;
  p.trace_capacity = 0;
  const char* path = std::getenv("MATMUL_HOPPER_TRACE");
  const char* at = std::getenv("MATMUL_HOPPER_TRACE_AT");
  if (path == nullptr || launches++ != (at != nullptr ? std::atoi(at) : 10)) return false;
  if (buffer == nullptr &&
      cudaMalloc(&buffer, (8 + kTraceWords * static_cast<size_t>(kCapacity)) * sizeof(*buffer)) !=
          cudaSuccess) {
    buffer = nullptr;
    return false;
  }
  if (cudaMemsetAsync(buffer, 0, 8 * sizeof(*buffer), stream) != cudaSuccess) return false;
  p.trace = buffer;
  p.trace_capacity = kCapacity;
  return true;
}

// Waits for the traced launch and writes its records as text: a header
// line, then one record of kTraceWords numbers a line.
void TraceEnd(const Params& p, const HopperLaunch& l, int bn, int cluster) {
  if (cudaStreamSynchronize(l.stream) != cudaSuccess) return;
  unsigned long long count = 0;
  cudaMemcpy(&count, p.trace, sizeof(count), cudaMemcpyDeviceToHost);
  count = std::min<unsigned long long>(count, p.trace_capacity);
  std::vector<unsigned long long> records(kTraceWords * count);
  cudaMemcpy(records.data(), p.trace + 8, records.size() * sizeof(records[0]),
             cudaMemcpyDeviceToHost);
  FILE* f = std::fopen(std::getenv("MATMUL_HOPPER_TRACE"), "w");
  if (f == nullptr) return;
  std::fprintf(f,
               "# grid %d total_tiles %d tile_n %d cluster %d problems %d split_tiles %d splits %d "
               "records %llu\n",
               l.grid, l.total_tiles, bn, cluster, l.num_problems,
               l.split.problem >= 0 ? l.split.tiles : 0, l.split.problem >= 0 ? l.split.splits : 0,
               count);
  for (unsigned long long i = 0; i < count; ++i) {
    for (int j = 0; j < kTraceWords; ++j) {
      std::fprintf(f, j ? " %llu" : "%llu", records[kTraceWords * i + j]);
    }
    std::fputc('\n', f);
  }
  std::fclose(f);
}
#endif

template <typename T, int BN, int kCluster, bool kPing = false>
cudaError_t Launch(const HopperLaunch& l) {
  using L = Layout<BN>;
  auto kernel = HopperGroupedGemm<T, BN, kCluster, kPing>;
  Params p;
  p.templates = *l.templates;
  if (l.inline_batch != nullptr) {
    p.inl = *l.inline_batch;
  } else {
    p.inl.count = 0;
  }
  p.problems = l.problems;
  p.tile_offsets = l.tile_offsets;
  p.tile_problem = l.tile_problem;
  p.num_problems = l.num_problems;
  p.total_tiles = l.total_tiles;
  p.maps = l.maps;
  p.map_flags = l.map_flags;
  p.tile_counter = l.tile_counter;
  p.epoch = l.epoch;
  p.output = l.output;
  p.split = l.split;
  p.edge_tiles = l.edge_tiles;
#ifdef MATMUL_HOPPER_DIAG
  const char* diag = std::getenv("MATMUL_HOPPER_DIAG");
  p.diag = diag != nullptr ? std::atoi(diag) : 0;
  const char* group_rows = std::getenv("MATMUL_HOPPER_GROUP_ROWS");
  p.group_rows = group_rows != nullptr ? std::max(1, std::atoi(group_rows)) : kGroupRows;
  const bool tracing = TraceBegin(p, l.stream);
#endif
  cudaError_t e;
  if constexpr (kCluster == 1) {
    kernel<<<l.grid, kThreads, L::kBytes, l.stream>>>(p);
    e = cudaGetLastError();
  } else {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config = ClusterConfig(l.grid, L::kBytes, l.stream, kCluster, &attribute);
    e = cudaLaunchKernelEx(&config, kernel, p);
  }
#ifdef MATMUL_HOPPER_DIAG
  if (tracing && e == cudaSuccess) TraceEnd(p, l, BN, kCluster);
#endif
  return e;
}

// The kernel of width BN and cluster size kCluster for the launch's input type.
template <int BN, int kCluster>
cudaError_t LaunchForInput(const HopperLaunch& l) {
  switch (l.input) {
    case DType::kBFloat16: return Launch<__nv_bfloat16, BN, kCluster>(l);
    case DType::kFloat16: return Launch<__half, BN, kCluster>(l);
    case DType::kFloat32: return Launch<float, BN, kCluster>(l);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t PrepareHopperGemm() {
  for (cudaError_t e :
       {Prepare<__nv_bfloat16, 256, 1>(), Prepare<__nv_bfloat16, 128, 1>(),
        Prepare<__nv_bfloat16, 64, 1>(), Prepare<__half, 256, 1>(), Prepare<__half, 128, 1>(),
        Prepare<__half, 64, 1>(), Prepare<float, 256, 1>(), Prepare<float, 128, 1>(),
        Prepare<float, 64, 1>(), Prepare<__nv_bfloat16, 256, 2>(), Prepare<__half, 256, 2>(),
        Prepare<float, 256, 2>(), Prepare<__nv_bfloat16, kHopperNarrowN, 1, true>(),
        Prepare<__half, kHopperNarrowN, 1, true>()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t HopperMaxActiveClusters(int* clusters) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      ClusterConfig(2 * 1024, Layout<256>::kBytes, nullptr, 2, &attribute);
  return cudaOccupancyMaxActiveClusters(clusters, HopperGroupedGemm<__nv_bfloat16, 256, 2>,
                                        &config);
}

cudaError_t LaunchHopperGemm(const HopperLaunch& l) {
  if (l.total_tiles == 0) return cudaSuccess;
  if (l.split.problem >= 0 &&
      (l.cluster != 1 || l.split.splits < 2 || l.split.splits > kHopperMaxSplits ||
       l.split.tiles < 1 || l.split.tiles > kHopperMaxSplitTiles || l.split.first_tile < 0 ||
       l.split.partials == nullptr || l.split.counters == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (l.cluster == 2) {
    if (l.tile_n != kHopperWideN || l.grid % 2 != 0) return cudaErrorInvalidValue;
    if (l.tile_counter == nullptr && l.grid / 2 < l.total_tiles) return cudaErrorInvalidValue;
    return LaunchForInput<256, 2>(l);
  }
  if (l.cluster != 1) return cudaErrorInvalidValue;
  if (l.tile_counter == nullptr && l.grid < l.total_tiles) return cudaErrorInvalidValue;
  if (l.pingpong) {
    if (l.tile_n != kHopperNarrowN || l.split.problem >= 0) return cudaErrorInvalidValue;
    switch (l.input) {
      case DType::kBFloat16: return Launch<__nv_bfloat16, kHopperNarrowN, 1, true>(l);
      case DType::kFloat16: return Launch<__half, kHopperNarrowN, 1, true>(l);
      default: return cudaErrorInvalidValue;
    }
  }
  switch (l.tile_n) {
    case kHopperWideN: return LaunchForInput<256, 1>(l);
    case kHopperNarrowN: return LaunchForInput<128, 1>(l);
    case kHopperSmallN: return LaunchForInput<64, 1>(l);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace matmul::cuda
