// libFuzzer target: raw bytes -> MultiplyRequest -> validation -> (when
// valid and small) the CPU engine, the path every request takes from the
// wire to a result. Must never crash, hang or read out of bounds; a valid
// request must give exactly the reference answer's shape.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cpu/cpu_engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/request_validation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  matmul::v1::MultiplyRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  matmul::server::RequestLimits limits;
  limits.max_dim = 4096;
  limits.max_response_bytes = 1 << 20;
  absl::StatusOr<matmul::server::ValidatedRequest> v =
      matmul::server::ValidateMultiplyRequest(request, limits);
  if (!v.ok()) {
    // Every refusal names a field and uses one of the two documented codes.
    if (v.status().code() != absl::StatusCode::kInvalidArgument &&
        v.status().code() != absl::StatusCode::kResourceExhausted) {
      __builtin_trap();
    }
    if (v.status().message().empty()) __builtin_trap();
    return 0;
  }
  matmul::GemmProblem p = v->problem;
  if (matmul::ProblemFlops(p) > 2e6) return 0;  // Keep each run fast.
  std::string out(v->output_bytes, '\0');
  p.d = out.data();
  if (!matmul::CpuEngine::RunOne(p).ok()) __builtin_trap();  // Validated => runnable.
  return 0;
}
