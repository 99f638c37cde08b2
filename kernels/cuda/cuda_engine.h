// The CUDA engine: runs batches on one GPU with the grouped kernels.
//
//   CudaEngineOptions options;              // all GPUs, 80% of free memory
//   auto engines = CreateCudaEngines(options);
//   (*engines)[0]->Run(batch, statuses);
//
// Per batch: operands are packed (rows padded to 16 bytes, so every problem
// can take the TMA path) into pinned host memory, copied to device memory
// from a pool reserved at start-up, multiplied by one grouped launch, and
// copied back. Run may be called from several threads at once; each call
// uses its own CUDA stream and pinned buffer, so one batch's copies overlap
// another's compute. A batch larger than the pool is split; a problem
// larger than the pool fails with RESOURCE_EXHAUSTED. A CUDA error fails the
// batch with INTERNAL; an error that leaves the context unusable marks the
// engine unhealthy.
#ifndef MATMUL_KERNELS_CUDA_CUDA_ENGINE_H_
#define MATMUL_KERNELS_CUDA_CUDA_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace matmul {

struct CudaEngineOptions {
  // Device ordinals; empty means all. Repeats run several engines on one GPU
  // (they split its memory budget).
  std::vector<int> devices;
  // Share of each GPU's free memory reserved for the pools.
  double memory_fraction = 0.8;
  // Of that share, bytes per engine set apart for resident matrices
  // (operands and results kept between requests); at most half the share.
  uint64_t resident_bytes = 0;
  // "persistent", "nonpersistent" or "cublas".
  std::string kernels = "persistent";
  // Checks our kernels against cuBLAS at start-up; a dtype that disagrees
  // is served by cuBLAS instead (and a note says so).
  bool self_test = true;
  // Most bytes of pinned host memory for request operands and results
  // (HostBuffers(), shared by every engine of the process); past it they
  // come from the heap and are staged. 0: no pool.
  uint64_t pinned_host_bytes = 0;
  // Smallest operand or result given pinned memory. Below it the staging
  // copy costs less than a DMA of its own (the engine merges staged ranges
  // into one copy per batch) and the parser's work to move it.
  size_t pinned_min_bytes = 256 << 10;
  // How host threads wait for the GPU: "auto", "spin", "yield" or "block"
  // (cudaDeviceSchedule*); set on each device before its context exists.
  std::string host_wait = "auto";
  // Rows of resident matrices that are 1 KiB or longer start on multiples
  // of this many bytes: 16 (what TMA needs), 32 (a sector; the default), 64
  // or 128 (a line). Rows 16 bytes off a sector cost the kernel up to a
  // third of each k-block on the H200 (docs/BENCHMARKS.md, eighth round);
  // on sectors, 2056^3 and 3000^3 ran 25% and 38% faster on an H100, and
  // lines bought nothing more (eleventh round).
  int resident_row_align = 32;
};

struct CudaEngineSet {
  std::vector<std::unique_ptr<Engine>> engines;
  // Lines for the start-up log (self-test outcomes, fallbacks).
  std::vector<std::string> notes;
};

// UNAVAILABLE when no usable GPU or driver is present (with the reason).
absl::StatusOr<CudaEngineSet> CreateCudaEngines(const CudaEngineOptions& options);

}  // namespace matmul

#endif  // MATMUL_KERNELS_CUDA_CUDA_ENGINE_H_
