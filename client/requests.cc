#include "client/requests.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "kernels/reference_gemm.h"

namespace matmul::client {

v1::DType ToWire(DType type) {
  switch (type) {
    case DType::kFloat32: return v1::DTYPE_FLOAT32;
    case DType::kFloat64: return v1::DTYPE_FLOAT64;
    case DType::kFloat16: return v1::DTYPE_FLOAT16;
    case DType::kBFloat16: return v1::DTYPE_BFLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

std::optional<DType> FromWire(v1::DType type) {
  switch (type) {
    case v1::DTYPE_FLOAT32: return DType::kFloat32;
    case v1::DTYPE_FLOAT64: return DType::kFloat64;
    case v1::DTYPE_FLOAT16: return DType::kFloat16;
    case v1::DTYPE_BFLOAT16: return DType::kBFloat16;
    default: return std::nullopt;
  }
}

std::optional<DType> ParseDType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "float32" || n == "f32" || n == "fp32") return DType::kFloat32;
  if (n == "float64" || n == "f64" || n == "fp64") return DType::kFloat64;
  if (n == "float16" || n == "f16" || n == "fp16" || n == "half") return DType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DType::kBFloat16;
  return std::nullopt;
}

v1::Matrix MakeMatrix(uint64_t rows, uint64_t cols, DType type, std::string data) {
  v1::Matrix m;
  m.set_rows(rows);
  m.set_cols(cols);
  m.set_dtype(ToWire(type));
  m.set_data(std::move(data));
  return m;
}

namespace {

std::string RandomBytes(DType type, size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes = RandomMatrix(type, n, rng);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace

v1::MultiplyRequest RandomRequest(const ProblemSpec& spec, std::mt19937_64& rng) {
  v1::MultiplyRequest request;
  const uint64_t m = spec.m, n = spec.n, k = spec.k;
  *request.mutable_a() = spec.transpose_a ? MakeMatrix(k, m, spec.dtype, RandomBytes(spec.dtype, m * k, rng))
                                          : MakeMatrix(m, k, spec.dtype, RandomBytes(spec.dtype, m * k, rng));
  *request.mutable_b() = spec.transpose_b ? MakeMatrix(n, k, spec.dtype, RandomBytes(spec.dtype, k * n, rng))
                                          : MakeMatrix(k, n, spec.dtype, RandomBytes(spec.dtype, k * n, rng));
  request.set_transpose_a(spec.transpose_a);
  request.set_transpose_b(spec.transpose_b);
  if (spec.output_dtype.has_value()) request.set_output_dtype(ToWire(*spec.output_dtype));
  request.set_precision(spec.precision == Precision::kTF32 ? v1::PRECISION_TF32
                                                           : v1::PRECISION_DEFAULT);
  request.set_request_id(spec.request_id);
  request.set_priority(spec.priority);
  if (spec.alpha.has_value()) request.set_alpha(*spec.alpha);
  if (spec.beta.has_value()) {
    request.set_beta(*spec.beta);
    if (*spec.beta != 0.0) {
      const DType out = spec.output_dtype.value_or(spec.dtype);
      *request.mutable_c() = MakeMatrix(m, n, out, RandomBytes(out, m * n, rng));
    }
  }
  return request;
}

absl::StatusOr<GemmProblem> ProblemOf(const v1::MultiplyRequest& request) {
  const std::optional<DType> in = FromWire(request.a().dtype());
  if (!in.has_value()) return absl::InvalidArgumentError("a.dtype is not set");
  GemmProblem p;
  p.input_type = *in;
  p.output_type = request.output_dtype() == v1::DTYPE_UNSPECIFIED
                      ? *in
                      : FromWire(request.output_dtype()).value_or(*in);
  p.precision = request.precision() == v1::PRECISION_TF32 ? Precision::kTF32 : Precision::kDefault;
  p.transpose_a = request.transpose_a();
  p.transpose_b = request.transpose_b();
  p.m = static_cast<int64_t>(p.transpose_a ? request.a().cols() : request.a().rows());
  p.k = static_cast<int64_t>(p.transpose_a ? request.a().rows() : request.a().cols());
  const int64_t kb = static_cast<int64_t>(p.transpose_b ? request.b().cols() : request.b().rows());
  p.n = static_cast<int64_t>(p.transpose_b ? request.b().rows() : request.b().cols());
  if (kb != p.k) {
    return absl::InvalidArgumentError(
        absl::StrFormat("inner dimensions differ: %d vs %d", p.k, kb));
  }
  p.alpha = request.has_alpha() ? request.alpha() : 1.0;
  p.beta = request.has_beta() ? request.beta() : 0.0;
  p.a = request.a().data().data();
  p.b = request.b().data().data();
  p.c = p.beta != 0.0 ? request.c().data().data() : nullptr;
  return p;
}

absl::StatusOr<double> CheckResponse(const v1::MultiplyRequest& request,
                                     const v1::MultiplyResponse& response) {
  absl::StatusOr<GemmProblem> p = ProblemOf(request);
  if (!p.ok()) return p.status();
  const v1::Matrix& c = response.c();
  if (c.rows() != static_cast<uint64_t>(p->m) || c.cols() != static_cast<uint64_t>(p->n)) {
    return absl::InternalError(absl::StrFormat("result is %d x %d, expected %d x %d", c.rows(),
                                               c.cols(), p->m, p->n));
  }
  if (c.dtype() != ToWire(p->output_type)) {
    return absl::InternalError(absl::StrFormat("result dtype %d, expected %d", c.dtype(),
                                               ToWire(p->output_type)));
  }
  const uint64_t bytes = static_cast<uint64_t>(p->m) * p->n * ElementSize(p->output_type);
  if (c.data().size() != bytes) {
    return absl::InternalError(
        absl::StrFormat("result has %d bytes, expected %d", c.data().size(), bytes));
  }
  std::mt19937_64 rng(std::random_device{}());
  return SampledGemmRelativeError(*p, c.data().data(), kCheckSamples, rng);
}

}  // namespace matmul::client
