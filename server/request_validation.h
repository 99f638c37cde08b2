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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/request_parser.h"
#include "server/shared_memory.h"

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

class StoredMatrix;

// A kept matrix named by an operand's handle, as a lookup found it.
struct KeptMatrix {
  uint64_t rows = 0;
  uint64_t cols = 0;
  DType dtype = DType::kFloat32;
  // The matrix itself (null in tests that only check shapes).
  std::shared_ptr<StoredMatrix> matrix;
};

// Finds the kept matrix `id` for operand `field` ("a.handle", ...):
// NOT_FOUND (naming the id) when there is none for this caller.
using KeptMatrixLookup =
    std::function<absl::StatusOr<KeptMatrix>(absl::string_view field, absl::string_view id)>;

// Finds the shared-memory bytes `ref` names for operand `field`
// ("a.shm", "output_shm"): NOT_FOUND or INVALID_ARGUMENT naming the field.
using SharedMemoryLookup =
    std::function<absl::StatusOr<SharedBytes>(const v1::SharedMemoryRef& ref, const std::string& field)>;

struct ValidatedRequest {
  // Pointers into the request's bytes (or the payloads moved out of it);
  // d is left null for the caller.
  // Operands given by handle have their kResident* bit set and no pointer.
  GemmProblem problem;
  // Bytes of the result D.
  uint64_t output_bytes = 0;
  // Operands given by handle (null for inline ones).
  std::shared_ptr<StoredMatrix> a_kept, b_kept, c_kept;
  // The result is to be kept on the server (store_result).
  bool keep_result = false;
  // Where the result goes when the request names output_shm (null
  // otherwise).
  void* output_shm = nullptr;
  // Shared-memory regions the operands or result live in; hold them until
  // the job ends.
  std::vector<std::shared_ptr<const void>> holds;
};

// INVALID_ARGUMENT for malformed requests (message names the field and what
// was expected); RESOURCE_EXHAUSTED for well-formed ones too big to ever run
// here (message gives the sizes); NOT_FOUND for an unknown handle. Without
// `lookup`, operands given by handle are INVALID_ARGUMENT (this server
// keeps no matrices); without `shm`, operands or results in shared memory
// are INVALID_ARGUMENT (shared memory is off). `operands` holds the
// payloads the parser moved out of the message (request_parser.h); the
// problem then points into them, and marks the pinned ones host_pinned.
absl::StatusOr<ValidatedRequest> ValidateMultiplyRequest(const v1::MultiplyRequest& request,
                                                          const RequestLimits& limits,
                                                          const KeptMatrixLookup& lookup = nullptr,
                                                          const SharedMemoryLookup& shm = nullptr,
                                                          const InlineOperands* operands = nullptr);

// Checks the shape and dtype of a matrix to keep (PutMatrix, the first
// UploadMatrix chunk) and returns its size in bytes; INVALID_ARGUMENT
// naming the field otherwise. The data is not looked at.
absl::StatusOr<uint64_t> CheckStoredShape(const v1::Matrix& shape, const RequestLimits& limits);

// Maps between wire and engine types. std::nullopt for DTYPE_UNSPECIFIED or
// values this build does not know.
std::optional<DType> FromProto(v1::DType type);
v1::DType ToProto(DType type);

// "DTYPE_FLOAT32", or "unknown value 17".
std::string ProtoDTypeName(int type);

}  // namespace matmul::server

#endif  // MATMUL_SERVER_REQUEST_VALIDATION_H_
