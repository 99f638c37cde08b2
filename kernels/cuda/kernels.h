// Launch entry points of the CUDA kernels, for the host-side launcher
// (grouped_gemm.cc) and the benchmark. Plain C++: no CUDA device code here.
#ifndef MATMUL_KERNELS_CUDA_KERNELS_H_
#define MATMUL_KERNELS_CUDA_KERNELS_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grouped_gemm.h"
#include "kernels/dtype.h"

namespace matmul::cuda {

// ---- Hopper (sm_90a) warp-specialized kernel --------------------------------

// Rows of an output tile (two consumer warpgroups of 64 rows).
inline constexpr int kHopperTileM = 128;

// Tensor-map templates for one input dtype and tile width: box sizes,
// swizzle and element type are set here on the host; address, sizes and
// strides are patched per problem on the device.
struct HopperTemplates {
  CUtensorMap a_kmajor;   // A stored m x k (box: 128 rows x 128 bytes)
  CUtensorMap a_mnmajor;  // A stored k x m (box: 64 columns x BK rows)
  CUtensorMap b_kmajor;   // B stored n x k (box: BN rows x 128 bytes)
  CUtensorMap b_kmajor_half;  // The same, BN/2 rows (each CTA's half in a cluster)
  CUtensorMap b_mnmajor;  // B stored k x n (box: 64 columns x BK rows)
  // D stored m x n, for TMA stores of each output dtype (box: 128 bytes x 64
  // rows, one consumer warpgroup's rows).
  CUtensorMap d_bf16;
  CUtensorMap d_f16;
  CUtensorMap d_f32;
};

// Tile widths with a compiled kernel.
inline constexpr int kHopperWideN = 256;
inline constexpr int kHopperNarrowN = 128;
inline constexpr int kHopperSmallN = 64;

// Encodes the templates (needs a live CUDA context; `scratch` is any
// 16-byte-aligned device address, only used as a placeholder).
cudaError_t EncodeHopperTemplates(DType input, int tile_n, void* scratch, HopperTemplates* out);

// Batches of at most this many Hopper problems travel inside the launch's
// parameters: the problem table, the tile offsets and tensor maps encoded on
// the host, so the launch needs no table copy before it and its CTAs read no
// table and build no maps before their first loads. Measured on the H200
// (docs/BENCHMARKS.md): a 1024^3 launch cost 10 us more launch to launch
// than its kernel, most of it the table copy on the stream.
inline constexpr int kHopperInlineProblems = 16;

struct HopperInlineBatch {
  int count = 0;  // Problems; 0 means the batch is in device memory.
  // Tiles (units) before each problem; tile_offsets[count] is the total.
  int32_t tile_offsets[kHopperInlineProblems + 1] = {};
  DeviceGemmProblem problems[kHopperInlineProblems];
  // A, B and D maps per problem (D only where the epilogue stores by TMA).
  CUtensorMap maps[kHopperInlineProblems][3] = {};
};

// Encodes problem `p`'s A and B tensor maps for tiles of width `tile_n` in
// clusters of `cluster` CTAs, and its D map for `output` where D is 16-byte
// aligned with rows 16 bytes apart (maps[2] is left alone elsewhere). Host
// only; needs no CUDA context.
cudaError_t EncodeHopperMaps(DType input, DType output, int tile_n, int cluster,
                             const DeviceGemmProblem& p, CUtensorMap maps[3]);

// Split-K tail: the persistent grid runs a problem's tiles in whole waves
// of one tile per SM, so a problem of 153 tiles on 132 SMs takes two waves
// for 1.16 waves of work (measured on the H200: 2056^3 ran at 0.44x
// cuBLAS). The launcher may split the last `tiles` tiles of one problem
// (the last, partial wave) into `splits` units each, unit j taking k-blocks
// [j K / splits, (j + 1) K / splits): the tail then takes about 1/splits of
// a wave. Each unit writes its float32 partial tile to `partials`; the last
// of a tile's units to finish (a counter per tile and consumer warpgroup)
// sums all of them in the order j = 0, 1, ... (so the result does not
// depend on which finished last) and runs the epilogue. Nothing waits on
// another CTA, so the grid needs no co-residency.
inline constexpr int kHopperMaxSplits = 16;
// Split tiles a launch may have (one counter pair each per stream).
inline constexpr int kHopperMaxSplitTiles = 1024;

struct HopperSplit {
  int problem = -1;     // The problem whose tail is split; -1: none.
  int first_tile = 0;   // Its first split tile (the rest of its tiles are).
  int tiles = 0;        // Split tiles (at most kHopperMaxSplitTiles).
  int splits = 1;       // Units per split tile, 2 .. kHopperMaxSplits.
  // tiles * splits partial tiles of kHopperTileM x tile_n floats, device memory.
  float* partials = nullptr;
  // 2 per split tile (one per consumer warpgroup): zero before the launch,
  // and set back to zero by the launch.
  unsigned int* counters = nullptr;
};

struct HopperLaunch {
  DType input = DType::kBFloat16;  // kFloat32 means TF32
  DType output = DType::kBFloat16;
  int tile_n = kHopperWideN;
  // Device memory: the problem table, its tile prefix sums (count + 1), the
  // problem of each tile, three tensor maps (A, B, D) and one build flag per
  // problem.
  const DeviceGemmProblem* problems = nullptr;
  const int32_t* tile_offsets = nullptr;
  // Problem index of every tile (total_tiles entries).
  const int32_t* tile_problem = nullptr;
  int num_problems = 0;
  int total_tiles = 0;
  CUtensorMap* maps = nullptr;
  unsigned long long* map_flags = nullptr;
  // Zeroed device counter the persistent grid takes tiles from (needed when
  // grid < total_tiles).
  unsigned int* tile_counter = nullptr;
  // Distinguishes this launch's flag values from earlier launches' (>= 1,
  // increasing per workspace).
  unsigned long long epoch = 1;
  // CTAs: the SM count for the persistent kernel, total_tiles for one CTA
  // per tile (times `cluster`; with clusters, tiles count pairs of tiles).
  int grid = 0;
  // CTAs per cluster: 1, or 2 (wide tiles only) for pairs of tiles that share
  // B through TMA multicast.
  int cluster = 1;
  const HopperTemplates* templates = nullptr;
  // When set, the batch itself (problems, tile offsets, maps): `problems`,
  // `tile_offsets`, `tile_problem`, `maps`, `map_flags` and `epoch` are then
  // unused, and `tile_counter` points at two counters that are zero before
  // the launch and that the grid sets back to zero when it is done, so that
  // consecutive launches on one stream reuse them with nothing in between.
  const HopperInlineBatch* inline_batch = nullptr;
  // The split-K tail, if any (single CTAs only: cluster 1).
  HopperSplit split;
  // GroupedGemmOptions::hopper_edge_tiles (16-bit inputs, single CTAs).
  bool edge_tiles = false;
  // GroupedGemmOptions::hopper_pingpong: each consumer warpgroup takes whole
  // tiles of its own (16-bit inputs, tile_n 128, single CTAs, no split).
  bool pingpong = false;
  cudaStream_t stream = nullptr;
};

// Once per device, before the first launch (raises the kernels' shared
// memory limit).
cudaError_t PrepareHopperGemm();

cudaError_t LaunchHopperGemm(const HopperLaunch& launch);

// How many 2-CTA clusters of the wide kernel can run at once on the current
// device (at most SMs / 2; fewer where a GPC has an odd SM count).
cudaError_t HopperMaxActiveClusters(int* clusters);

// ---- SIMT kernel (FFMA / DFMA; any alignment, any dtype) ---------------------

// Output tile sides: kSimtTile for every dtype; kSimtWideTile, float32 only,
// for launches with enough tiles of that size to fill the GPU.
inline constexpr int kSimtTile = 64;
inline constexpr int kSimtWideTile = 128;

struct SimtLaunch {
  DType input = DType::kFloat32;
  DType output = DType::kFloat32;
  int tile = kSimtTile;  // kSimtTile, or kSimtWideTile with float32 in and out.
  const DeviceGemmProblem* problems = nullptr;
  const int32_t* tile_offsets = nullptr;  // In tile x tile tiles.
  int num_problems = 0;
  int total_tiles = 0;
  int grid = 0;
  // Two counters, zero before the launch and zero again after it (the last
  // block resets them), from which blocks claim their tiles; null: each
  // block takes its index and every grid-th tile after it (no claims).
  unsigned int* tile_counter = nullptr;
  cudaStream_t stream = nullptr;
};

cudaError_t LaunchSimtGemm(const SimtLaunch& launch);

// ---- Helpers -----------------------------------------------------------------

// One matrix for LaunchTransposes32: out (cols x rows, leading dimension
// ldo) = in^T for a rows x cols float matrix with leading dimension ldi.
struct TransposeJob {
  const float* in = nullptr;
  float* out = nullptr;
  int64_t rows = 0, cols = 0, ldi = 0, ldo = 0;
};

// Jobs that one launch of LaunchTransposes32 takes (in its parameters).
constexpr int kTransposesPerLaunch = 32;

// Every job of `jobs` (the TF32 copies of a whole batch) in at most
// ceil(count / kTransposesPerLaunch) launches, whose number is added to
// `*launches`: one launch a matrix cost a batch of many small problems a
// launch per operand.
cudaError_t LaunchTransposes32(const TransposeJob* jobs, int count, cudaStream_t stream,
                               int* launches);

}  // namespace matmul::cuda

#endif  // MATMUL_KERNELS_CUDA_KERNELS_H_
