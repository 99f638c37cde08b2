// The CPU engine: GEMM on OpenBLAS.
//
// float32 and float64 go straight to sgemm/dgemm; float16 and bfloat16
// operands are widened to float32, multiplied with float32 accumulation and
// rounded to the output type (nearest, ties to even).
//
//   absl::StatusOr<std::unique_ptr<matmul::Engine>> engine =
//       matmul::CpuEngine::Create({.index = 0});
#ifndef MATMUL_KERNELS_CPU_CPU_ENGINE_H_
#define MATMUL_KERNELS_CPU_CPU_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace matmul {

struct CpuEngineOptions {
  // Worker index, used in the device id ("cpu:<index>").
  int index = 0;
  // OpenBLAS threads; 0 leaves OpenBLAS's default (all cores).
  int threads = 0;
};

class CpuEngine final : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const CpuEngineOptions& options);

  const DeviceDescription& Device() const override { return device_; }
  absl::string_view Name() const override { return "cpu-openblas"; }
  void Run(absl::Span<const GemmProblem> problems, absl::Span<absl::Status> status) override;

  // One problem; exposed for tests.
  static absl::Status RunOne(const GemmProblem& p);

 private:
  explicit CpuEngine(DeviceDescription device) : device_(std::move(device)) {}

  // What GetServerInfo and metrics say about this engine.
  const DeviceDescription device_;
};

}  // namespace matmul

#endif  // MATMUL_KERNELS_CPU_CPU_ENGINE_H_
