#include "kernels/engine.h"

#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

namespace matmul {
namespace {

// Engine's default resident matrix: host memory.
class HostResidentMatrix final : public ResidentMatrix {
 public:
  HostResidentMatrix(int64_t rows, int64_t cols, DType dtype, std::unique_ptr<uint8_t[]> data)
      : ResidentMatrix(rows, cols, dtype), data_(std::move(data)) {}
  uint8_t* data() const { return data_.get(); }

 private:
  const std::unique_ptr<uint8_t[]> data_;
};

}  // namespace

uint64_t ProblemBytes(const GemmProblem& p) {
  const uint64_t in = ElementSize(p.input_type);
  const uint64_t out = ElementSize(p.output_type);
  const uint64_t m = p.m, n = p.n, k = p.k;
  const bool a = !(p.resident & kResidentA) && p.a_resident == nullptr;
  const bool b = !(p.resident & kResidentB) && p.b_resident == nullptr;
  const bool c = p.beta != 0.0 && !(p.resident & kResidentC) && p.c_resident == nullptr;
  const bool d = !(p.resident & kResidentD) && p.d_resident == nullptr;
  uint64_t bytes = 0;
  if (a) bytes += m * k * in;
  if (b) bytes += k * n * in;
  if (c) bytes += m * n * out;
  if (d) bytes += m * n * out;
  return bytes;
}

absl::StatusOr<std::unique_ptr<ResidentMatrix>> Engine::CreateResident(int64_t rows, int64_t cols,
                                                                       DType dtype,
                                                                       const void* host) {
  const uint64_t bytes =
      static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * ElementSize(dtype);
  std::unique_ptr<uint8_t[]> data(new (std::nothrow) uint8_t[bytes == 0 ? 1 : bytes]);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory for a resident matrix"));
  }
  if (host != nullptr) std::memcpy(data.get(), host, bytes);
  return std::make_unique<HostResidentMatrix>(rows, cols, dtype, std::move(data));
}

absl::Status Engine::ReadResident(const ResidentMatrix& matrix, void* host) {
  const auto* m = dynamic_cast<const HostResidentMatrix*>(&matrix);
  if (m == nullptr) return absl::InternalError("resident matrix belongs to another engine");
  std::memcpy(host, m->data(), matrix.bytes());
  return absl::OkStatus();
}

GemmProblem ResolveHostResident(const GemmProblem& problem) {
  GemmProblem p = problem;
  auto host = [](const ResidentMatrix* r) -> uint8_t* {
    const auto* h = dynamic_cast<const HostResidentMatrix*>(r);
    return h == nullptr ? nullptr : h->data();
  };
  if (p.a_resident != nullptr) p.a = host(p.a_resident);
  if (p.b_resident != nullptr) p.b = host(p.b_resident);
  if (p.c_resident != nullptr) p.c = host(p.c_resident);
  if (p.d_resident != nullptr) p.d = host(p.d_resident);
  p.a_resident = p.b_resident = p.c_resident = nullptr;
  p.d_resident = nullptr;
  return p;
}

}  // namespace matmul
