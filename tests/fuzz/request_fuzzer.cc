// libFuzzer target: raw bytes -> MultiplyRequest (protobuf's parse and the
// server's payload-moving one, which must agree) -> validation (inline,
// kept-matrix handles and shared-memory operands) -> (when valid and small)
// the CPU engine, the path every request takes from the wire to a result. Must never crash, hang or read out of bounds; a valid
// request must give exactly the reference answer's shape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "kernels/cpu/cpu_engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/request_parser.h"
#include "server/request_validation.h"

namespace {

// Stand-ins for the matrix store and the shared-memory registry: handle
// "k1" is an 8 x 8 float32, "k2" a 3 x 5 bfloat16; region "s" is 1 MiB.
// Everything else is NOT_FOUND, as the real ones answer.
alignas(64) uint8_t kept_bytes[8 * 8 * 8];
alignas(64) uint8_t region[1 << 20];

absl::StatusOr<matmul::server::KeptMatrix> FindKept(absl::string_view field, absl::string_view id) {
  matmul::server::KeptMatrix k;
  if (id == "k1") {
    k.rows = k.cols = 8;
    k.dtype = matmul::DType::kFloat32;
  } else if (id == "k2") {
    k.rows = 3;
    k.cols = 5;
    k.dtype = matmul::DType::kBFloat16;
  } else {
    return absl::NotFoundError(std::string(field) + ": no such matrix");
  }
  return k;
}

absl::StatusOr<matmul::server::SharedBytes> FindShared(const matmul::v1::SharedMemoryRef& ref,
                                                       const std::string& field) {
  if (ref.region() != "s") return absl::NotFoundError(field + ".region: unknown");
  uint64_t end;
  if (__builtin_add_overflow(ref.offset(), ref.bytes(), &end) || end > sizeof(region)) {
    return absl::InvalidArgumentError(field + ": out of range");
  }
  return matmul::server::SharedBytes{region + ref.offset(), ref.bytes(), nullptr};
}

void* PinStandIn(size_t bytes) { return std::malloc(bytes); }
void UnpinStandIn(void* p) { std::free(p); }

// The server's parser, which moves payloads of 64 bytes or more into pool
// buffers, must accept exactly what protobuf accepts and give the same
// message once the payloads are put back.
matmul::HostBufferPool pool(&PinStandIn, &UnpinStandIn, 1 << 30, 64);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  matmul::v1::MultiplyRequest typed;
  const bool typed_ok = typed.ParseFromArray(data, static_cast<int>(size));
  matmul::v1::MultiplyRequest request;
  matmul::server::InlineOperands operands;
  google::protobuf::io::ArrayInputStream input(data, static_cast<int>(size),
                                               1 + static_cast<int>(size % 97));
  const absl::Status parsed =
      matmul::server::ParseMultiplyRequest(&input, size, &pool, &request, &operands);
  if (parsed.ok() != typed_ok) __builtin_trap();
  if (!parsed.ok()) {
    if (parsed.code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  {
    matmul::v1::MultiplyRequest back = request;
    if (operands.a.data() != nullptr) {
      back.mutable_a()->set_data(static_cast<const char*>(operands.a.data()), operands.a.size());
    }
    if (operands.b.data() != nullptr) {
      back.mutable_b()->set_data(static_cast<const char*>(operands.b.data()), operands.b.size());
    }
    if (operands.c.data() != nullptr) {
      back.mutable_c()->set_data(static_cast<const char*>(operands.c.data()), operands.c.size());
    }
    if (back.SerializeAsString() != typed.SerializeAsString()) __builtin_trap();
  }
  matmul::server::RequestLimits limits;
  limits.max_dim = 4096;
  limits.max_response_bytes = 1 << 20;
  // Half the inputs see a server with a store and shared memory.
  const bool extras = size % 2 == 0;
  absl::StatusOr<matmul::server::ValidatedRequest> v = matmul::server::ValidateMultiplyRequest(
      request, limits, extras ? matmul::server::KeptMatrixLookup(FindKept) : nullptr,
      extras ? matmul::server::SharedMemoryLookup(FindShared) : nullptr, &operands);
  if (!v.ok()) {
    // Every refusal names a field and uses one of the documented codes.
    if (v.status().code() != absl::StatusCode::kInvalidArgument &&
        v.status().code() != absl::StatusCode::kResourceExhausted &&
        v.status().code() != absl::StatusCode::kNotFound) {
      __builtin_trap();
    }
    if (v.status().message().empty()) __builtin_trap();
    return 0;
  }
  matmul::GemmProblem p = v->problem;
  if (matmul::ProblemFlops(p) > 2e6) return 0;  // Keep each run fast.
  // Kept operands: the engine would bind them; here they are stand-in bytes.
  if (p.resident & matmul::kResidentA) p.a = kept_bytes;
  if (p.resident & matmul::kResidentB) p.b = kept_bytes;
  if (p.resident & matmul::kResidentC) p.c = kept_bytes;
  std::string out(v->output_bytes, '\0');
  p.d = v->output_shm != nullptr ? v->output_shm : out.data();
  if (!matmul::CpuEngine::RunOne(p).ok()) __builtin_trap();  // Validated => runnable.
  return 0;
}
