#include "kernels/engine_factory.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_engine.h"

#ifdef MATMUL_WITH_CUDA
#include "kernels/cuda/cuda_engine.h"
#endif

namespace matmul {
namespace {

absl::StatusOr<EngineSet> CreateCpuEngines(const EngineOptions& options) {
  if (options.cpu_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_workers must be >= 1, got ", options.cpu_workers));
  }
  EngineSet set;
  set.backend = "cpu";
  for (int i = 0; i < options.cpu_workers; ++i) {
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        CpuEngine::Create({.index = i, .threads = options.cpu_threads});
    if (!engine.ok()) return engine.status();
    set.engines.push_back(*std::move(engine));
  }
  return set;
}

#ifdef MATMUL_WITH_CUDA
absl::StatusOr<EngineSet> CreateGpuEngines(const EngineOptions& options) {
  CudaEngineOptions cuda;
  cuda.devices = options.cuda_devices;
  cuda.memory_fraction = options.gpu_memory_fraction;
  cuda.pinned_host_bytes = options.pinned_host_bytes;
  cuda.resident_bytes = options.gpu_resident_bytes;
  cuda.kernels = options.cuda_kernels;
  cuda.host_wait = options.cuda_host_wait;
  cuda.resident_row_align = options.cuda_resident_row_align;
  absl::StatusOr<CudaEngineSet> engines = CreateCudaEngines(cuda);
  if (!engines.ok()) return engines.status();
  EngineSet set;
  set.backend = "cuda";
  set.engines = std::move(engines->engines);
  set.notes = std::move(engines->notes);
  return set;
}
#endif

}  // namespace

bool BuiltWithCuda() {
#ifdef MATMUL_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<EngineSet> CreateEngines(const EngineOptions& options) {
  if (options.backend == "cpu") return CreateCpuEngines(options);
  if (options.backend != "auto" && options.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("backend must be auto, cpu or cuda, got \"", options.backend, "\""));
  }
#ifdef MATMUL_WITH_CUDA
  absl::StatusOr<EngineSet> gpu = CreateGpuEngines(options);
  if (gpu.ok() || options.backend == "cuda") return gpu;
  absl::StatusOr<EngineSet> cpu = CreateCpuEngines(options);
  if (cpu.ok()) cpu->fallback_reason = std::string(gpu.status().message());
  return cpu;
#else
  if (options.backend == "cuda") {
    return absl::FailedPreconditionError(
        "backend=cuda, but this binary was built without CUDA (configure with -DMATMUL_CUDA=ON)");
  }
  absl::StatusOr<EngineSet> cpu = CreateCpuEngines(options);
  if (cpu.ok()) cpu->fallback_reason = "built without CUDA";
  return cpu;
#endif
}

}  // namespace matmul
