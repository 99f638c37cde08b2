// Grouped GEMM on the GPU: one launch runs a whole batch of problems of
// different shapes. Operands are already in device memory; this layer knows
// nothing of staging or pools (see cuda_engine.h for that).
//
//   std::vector<DeviceGemmProblem> problems = ...;   // device pointers
//   GroupedGemmLauncher launcher = *GroupedGemmLauncher::Create(device);
//   size_t bytes = launcher.WorkspaceBytes(problems, options);
//   absl::Status s = launcher.Run(problems, options, workspace, bytes, stream);
//
// Kernel families:
//  * kPersistent: bf16/fp16 (and float32 with TF32 allowed) go to a
//    warp-specialized Hopper kernel (TMA loads on mbarriers, wgmma, a
//    producer warpgroup and two consumer warpgroups, a multi-stage shared
//    memory pipeline) on a persistent grid of one CTA per SM that walks one
//    tile list covering every problem. Exact float32 and float64 go to a
//    persistent SIMT kernel (FFMA/DFMA) for small problems and cuBLAS for
//    large ones, where cuBLAS is faster.
//  * kNonPersistent: the same kernels, one CTA per output tile.
//  * kCublas: one cuBLAS call per problem (reference and baseline).
// Problems the Hopper kernel cannot take (rows not 16-byte aligned, or a
// GPU without sm_90a) run on the SIMT kernel.
#ifndef MATMUL_KERNELS_CUDA_GROUPED_GEMM_H_
#define MATMUL_KERNELS_CUDA_GROUPED_GEMM_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"

namespace matmul::cuda {

// One problem in device memory: D = alpha * op(A) * op(B) + beta * C, all
// row-major with leading dimensions in elements.
struct DeviceGemmProblem {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;  // Read only when beta != 0.
  void* d = nullptr;
  double alpha = 1.0;
  double beta = 0.0;
  bool transpose_a = false;
  bool transpose_b = false;
  // Set by the launcher only (Run rejects it from callers): D and C are
  // stored n x m (column-major), element (i, j) at j * ldd + i. A TF32
  // problem whose B alone is stored k x n runs as D^T = B^T A^T, so that the
  // Hopper kernel reads B as an A stored k x m, through registers, instead
  // of copying it first (GroupedGemmOptions::hopper_tf32_register_a).
  bool transpose_d = false;
};

enum class KernelFamily { kPersistent, kNonPersistent, kCublas };

struct GroupedGemmOptions {
  DType input = DType::kBFloat16;
  DType output = DType::kBFloat16;
  Precision precision = Precision::kDefault;
  KernelFamily family = KernelFamily::kPersistent;
  // Exact float32/float64 problems with at least this many FLOPs go to
  // cuBLAS under kPersistent (our SIMT kernel is slower there); 0 = never.
  double cublas_min_flops = 2.0 * 512 * 512 * 512;
  // Width of the Hopper kernel's output tiles (128 rows by 256, 128 or 64
  // columns); 0 lets a cost model choose per batch. For benchmarks and tests.
  int hopper_tile_n = 0;
  // CTAs per cluster for the Hopper kernel: 2 pairs vertically adjacent wide
  // tiles that share B through TMA multicast, 1 never does, 0 lets the
  // launcher choose: pairs for batches of several 16-bit problems whose
  // pairs of tile-rows are nearly all whole, and for a single 16-bit problem
  // of two waves or more whose rows start off 32-byte sectors
  // (hopper_plan.h, PairsPay; measured up to 37% faster), single CTAs
  // otherwise.
  int hopper_cluster = 0;
  // Batches of at most this many Hopper problems carry their problem table
  // and tensor maps (encoded on the host) in the launch's parameters instead
  // of a table copied to the workspace first; -1 means the most the kernel
  // takes (kHopperInlineProblems), 0 never. For benchmarks and tests.
  int hopper_inline_problems = -1;
  // Split-K tail for a batch of one Hopper problem on the persistent grid
  // (its last, partial wave of tiles run as k-ranges summed at the end, so
  // that it takes a fraction of a wave): 0 lets the cost model decide, 1
  // never splits, 2 .. kHopperMaxSplits (kernels.h) asks for that many
  // k-ranges per tile (fewer where K is short), splitting the last full
  // wave where there is no partial one. Needs the batch to go in the launch
  // parameters and single CTAs (hopper_cluster != 2). For benchmarks and
  // tests.
  int hopper_split_k = 0;
  // Edge tiles of 16-bit inputs do only their share (hopper_gemm.cu): MMAs
  // as narrow as the columns they have inside the problem (half or a
  // quarter of the tile's width), loads and stores of those columns only,
  // and no work for the second consumer warpgroup where the rows fit the
  // first's 64. On by default since measured on an H100 (docs/BENCHMARKS.md,
  // tenth round: odd single problems 4-13% faster, grouped batches 0-3%,
  // no row slower); off only for benchmarks and tests of the full-width path.
  bool hopper_edge_tiles = true;
  // Experimental and off by default: ping-pong consumers (hopper_gemm.cu,
  // ConsumePing), where each of the Hopper kernel's two consumer
  // warpgroups takes whole 128 x 128 tiles of its own so that one's
  // epilogue overlaps the other's MMAs. Needs 16-bit inputs; the tile width
  // is then 128 (hopper_tile_n must be 0 or 128), single CTAs
  // (hopper_cluster 0 or 1) and no split-K tail. Measured on an H100
  // (docs/BENCHMARKS.md, thirteenth round): 2-7% faster than the
  // cooperative consumers at the same width, but slower than the 128 x 256
  // tiles the launcher picks for every benchmark row, so nothing uses it.
  bool hopper_pingpong = false;
  // TF32 operands stored MN-major (the kernel's wgmma reads TF32 from shared
  // memory only K-major): true reads an A stored k x m through registers
  // (wgmma's register operand), and runs a problem whose B alone is stored
  // k x n as D^T = B^T A^T, so that B becomes that A; only a B stored k x n
  // beside an A stored k x m is still copied. False copies every MN-major
  // operand K-major first (a transpose kernel; at 4096^3 its 50 us were the
  // whole gap to cuBLAS, docs/BENCHMARKS.md, fifteenth round). For
  // benchmarks and tests.
  bool hopper_tf32_register_a = true;
  // Output tile side of the SIMT kernel: 0 picks (128 for float32 inputs
  // when the launch has at least one 128 x 128 tile per SM, else 64), 64,
  // or 128 (float32 inputs only).
  int simt_tile = 0;
};

// What ran, for benchmarks and tests.
struct LaunchReport {
  // Kernel launches (including helper kernels such as TF32 transposes).
  int launches = 0;
  // Problems that went to each path.
  int hopper_problems = 0;
  int simt_problems = 0;
  int cublas_problems = 0;
  // "128x256", "128x128" or "128x64" for the Hopper tiles used, with
  // " x2 cluster" when tiles ran in pairs and " ping-pong" for
  // GroupedGemmOptions::hopper_pingpong.
  std::string hopper_tile;
  // CTAs of the Hopper launch (with clusters, twice the clusters that fit).
  int hopper_grid = 0;
  // True when the Hopper batch went in the launch's parameters.
  bool hopper_inline = false;
  // k-ranges per split tile of the split-K tail (1: none), and how many
  // tiles were split.
  int hopper_split_k = 1;
  int hopper_split_tiles = 0;
  // Output tile side of the SIMT launch (0 when it had no problems).
  int simt_tile = 0;
  // Host microseconds of the Hopper launch, by phase, for benchmarks:
  // plan (from Run's start: checks, paths, workspace layout, the tile shape
  // and tile offsets), build (the batch written where the kernel reads it:
  // pinned staging for a table, after waiting for that buffer to be free,
  // or the tensor maps of a batch in the parameters) and enqueue (the
  // table's copy, the maps' memset and the launch).
  double hopper_plan_us = 0;
  double hopper_build_us = 0;
  double hopper_enqueue_us = 0;
};

class GroupedGemmLauncher {
 public:
  // Prepares kernels for `device` (the current device must be `device`).
  static absl::StatusOr<std::unique_ptr<GroupedGemmLauncher>> Create(int device);
  ~GroupedGemmLauncher();

  // Device workspace `Run` needs for this batch (problem table, tile list,
  // tensor maps, TF32 transposes).
  size_t WorkspaceBytes(absl::Span<const DeviceGemmProblem> problems,
                        const GroupedGemmOptions& options) const;

  // Enqueues the batch on `stream`; returns once it is enqueued. The
  // workspace must stay untouched until the stream passes this point, and
  // must not be shared with a concurrent Run. Validates types and sizes.
  absl::Status Run(absl::Span<const DeviceGemmProblem> problems,
                   const GroupedGemmOptions& options, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, LaunchReport* report = nullptr);

  // True when this GPU runs the Hopper (sm_90a) kernels.
  bool has_hopper_kernels() const { return hopper_; }
  int num_sms() const { return num_sms_; }

  // True when the Hopper kernel can take this problem (16-byte aligned rows
  // and base addresses).
  static bool HopperEligible(const DeviceGemmProblem& p, DType input);

 private:
  GroupedGemmLauncher() = default;
  struct Impl;

  int device_ = 0;
  int num_sms_ = 0;
  // 2-CTA clusters of the wide kernel that fit on the device at once.
  int max_clusters_ = 0;
  bool hopper_ = false;
  // cuBLAS handle and tensor-map templates.
  std::unique_ptr<Impl> impl_;
};

// "cudaErrorInvalidValue: invalid argument" for logs and statuses.
std::string CudaErrorString(cudaError_t error);

}  // namespace matmul::cuda

#endif  // MATMUL_KERNELS_CUDA_GROUPED_GEMM_H_
