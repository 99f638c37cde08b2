// Picks and creates the engines a server runs: one per device worker.
//
//   matmul::EngineOptions options;
//   options.backend = "auto";            // CUDA when a usable GPU is present
//   absl::StatusOr<matmul::EngineSet> set = matmul::CreateEngines(options);
//   for (auto& engine : set->engines) { ... one worker each ... }
#ifndef MATMUL_KERNELS_ENGINE_FACTORY_H_
#define MATMUL_KERNELS_ENGINE_FACTORY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace matmul {

struct EngineOptions {
  // "auto" (CUDA when usable, CPU otherwise), "cpu" or "cuda".
  std::string backend = "auto";
  // CUDA device ordinals to serve from; empty means every visible GPU. An
  // ordinal may repeat to run several workers on one GPU.
  std::vector<int> cuda_devices;
  // Share of each GPU's free memory the engine's pool takes at start-up.
  double gpu_memory_fraction = 0.8;
  // Of that share, device memory per engine kept apart for resident
  // matrices (the CPU engine keeps them in host memory instead).
  uint64_t gpu_resident_bytes = 0;
  // Most bytes of pinned host memory that requests' large operands and
  // results are parsed into and written to (one pool for all GPUs); past
  // it they use the heap and are staged. 0: no pool.
  uint64_t pinned_host_bytes = 0;
  // CUDA kernel family: "persistent" (our grouped persistent kernels),
  // "nonpersistent" (same tiles, one CTA per tile) or "cublas".
  std::string cuda_kernels = "persistent";
  // How a host thread waits for its GPU work: "spin" (lowest latency, one
  // core busy per waiting batch), "yield", "block" (the thread sleeps until
  // the GPU is done; its core serves gRPC meanwhile) or "auto" (CUDA's
  // choice: spin unless there are more contexts than cores).
  std::string cuda_host_wait = "auto";
  // Byte alignment of long rows of matrices kept on a GPU: 16, 32, 64 or
  // 128 (CudaEngineOptions::resident_row_align).
  int cuda_resident_row_align = 32;
  // CPU workers (engines); each runs whole batches with OpenBLAS.
  int cpu_workers = 1;
  // OpenBLAS threads; 0 means all cores.
  int cpu_threads = 0;
};

struct EngineSet {
  // "cpu" or "cuda": the backend actually chosen.
  std::string backend;
  // One engine per worker.
  std::vector<std::unique_ptr<Engine>> engines;
  // Why "auto" fell back to the CPU, for the start-up log; empty otherwise.
  std::string fallback_reason;
  // Other lines for the start-up log (e.g. kernel self-test outcomes).
  std::vector<std::string> notes;
};

// True when this binary was built with the CUDA engine.
bool BuiltWithCuda();

absl::StatusOr<EngineSet> CreateEngines(const EngineOptions& options);

}  // namespace matmul

#endif  // MATMUL_KERNELS_ENGINE_FACTORY_H_
