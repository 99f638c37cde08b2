// Turns a matmul.v1.MultiplyRequest into an engine problem, or explains
// exactly what is wrong with it.
//
//   absl::StatusOr<ValidatedRequest> v = ValidateMultiplyRequest(request, limits);
//   if (!v.ok()) return v.status();   // INVALID_ARGUMENT naming the field
//   v->problem.d = output_buffer;     // everything else points into `request`
//
// Validation reads sizes only, never the payload bytes, so it costs the same
// for a 1x1 and a 4096x4096 request.
#ifndef MATMUL_SERVER_REQUEST_VALIDATION_H_
#define MATMUL_SERVER_REQUEST_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/engine.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul::server {

// What the server accepts.
struct RequestLimits {
  // Largest rows or cols of any matrix.
  uint64_t max_dim = 65536;
  // Largest result matrix in bytes.
  uint64_t max_response_bytes = 256ull << 20;
  // Largest ProblemBytes() any engine can run (device budget); 0 = no limit.
  uint64_t max_problem_bytes = 0;
};

struct ValidatedRequest {
  // Pointers into the request's bytes; d is left null for the caller.
  GemmProblem problem;
  // Bytes of the result D.
  uint64_t output_bytes = 0;
};

// INVALID_ARGUMENT for malformed requests (message names the field and what
// was expected); RESOURCE_EXHAUSTED for well-formed ones too big to ever run
// here (message gives the sizes).
absl::StatusOr<ValidatedRequest> ValidateMultiplyRequest(const v1::MultiplyRequest& request,
                                                          const RequestLimits& limits);

// Maps between wire and engine types. std::nullopt for DTYPE_UNSPECIFIED or
// values this build does not know.
std::optional<DType> FromProto(v1::DType type);
v1::DType ToProto(DType type);

// "DTYPE_FLOAT32", or "unknown value 17".
std::string ProtoDTypeName(int type);

}  // namespace matmul::server

#endif  // MATMUL_SERVER_REQUEST_VALIDATION_H_
