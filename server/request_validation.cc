#include "server/request_validation.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace matmul::server {
namespace {

using v1::Matrix;
using v1::MultiplyRequest;

constexpr absl::string_view kDTypeChoices =
    "DTYPE_FLOAT32, DTYPE_FLOAT64, DTYPE_FLOAT16 or DTYPE_BFLOAT16";

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Checks one matrix's dtype, shape and payload size. `field` is its name in
// the request ("a", "b", "c").
absl::StatusOr<DType> CheckMatrix(const Matrix& x, absl::string_view field,
                                  const RequestLimits& limits) {
  if (x.dtype() == v1::DTYPE_UNSPECIFIED) {
    return Invalid(absl::StrCat(field, ".dtype"), absl::StrCat("must be one of ", kDTypeChoices));
  }
  const std::optional<DType> type = FromProto(x.dtype());
  if (!type.has_value()) {
    return Invalid(absl::StrCat(field, ".dtype"),
                   absl::StrCat(ProtoDTypeName(x.dtype()), " is not one of ", kDTypeChoices));
  }
  for (const auto& [name, value] : {std::pair<absl::string_view, uint64_t>{"rows", x.rows()},
                                    std::pair<absl::string_view, uint64_t>{"cols", x.cols()}}) {
    if (value == 0) {
      return Invalid(absl::StrCat(field, ".", name), "must be at least 1, got 0");
    }
    if (value > limits.max_dim) {
      return Invalid(absl::StrCat(field, ".", name),
                     absl::StrCat(value, " is over the server's max_dim of ", limits.max_dim));
    }
  }
  uint64_t elements, bytes;
  if (__builtin_mul_overflow(x.rows(), x.cols(), &elements) ||
      __builtin_mul_overflow(elements, ElementSize(*type), &bytes)) {
    return Invalid(field, absl::StrCat(x.rows(), " x ", x.cols(), " ", DTypeName(*type),
                                       " overflows 64-bit sizes"));
  }
  if (x.data().size() != bytes) {
    return Invalid(absl::StrCat(field, ".data"),
                   absl::StrFormat("expected %d bytes (%d x %d %s), got %d", bytes, x.rows(),
                                   x.cols(), DTypeName(*type), x.data().size()));
  }
  return *type;
}

}  // namespace

std::optional<DType> FromProto(v1::DType type) {
  switch (type) {
    case v1::DTYPE_FLOAT32: return DType::kFloat32;
    case v1::DTYPE_FLOAT64: return DType::kFloat64;
    case v1::DTYPE_FLOAT16: return DType::kFloat16;
    case v1::DTYPE_BFLOAT16: return DType::kBFloat16;
    default: return std::nullopt;
  }
}

v1::DType ToProto(DType type) {
  switch (type) {
    case DType::kFloat32: return v1::DTYPE_FLOAT32;
    case DType::kFloat64: return v1::DTYPE_FLOAT64;
    case DType::kFloat16: return v1::DTYPE_FLOAT16;
    case DType::kBFloat16: return v1::DTYPE_BFLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

std::string ProtoDTypeName(int type) {
  if (v1::DType_IsValid(type)) return v1::DType_Name(static_cast<v1::DType>(type));
  return absl::StrCat("unknown value ", type);
}

absl::StatusOr<ValidatedRequest> ValidateMultiplyRequest(const MultiplyRequest& request,
                                                          const RequestLimits& limits) {
  if (!request.has_a()) return Invalid("a", "required");
  if (!request.has_b()) return Invalid("b", "required");
  absl::StatusOr<DType> a_type = CheckMatrix(request.a(), "a", limits);
  if (!a_type.ok()) return a_type.status();
  absl::StatusOr<DType> b_type = CheckMatrix(request.b(), "b", limits);
  if (!b_type.ok()) return b_type.status();
  if (*a_type != *b_type) {
    return Invalid("b.dtype", absl::StrCat("must match a.dtype (", ProtoDTypeName(request.a().dtype()),
                                           "), got ", ProtoDTypeName(request.b().dtype())));
  }

  GemmProblem p;
  p.input_type = *a_type;
  p.transpose_a = request.transpose_a();
  p.transpose_b = request.transpose_b();
  const Matrix& a = request.a();
  const Matrix& b = request.b();
  p.m = static_cast<int64_t>(p.transpose_a ? a.cols() : a.rows());
  p.k = static_cast<int64_t>(p.transpose_a ? a.rows() : a.cols());
  const int64_t kb = static_cast<int64_t>(p.transpose_b ? b.cols() : b.rows());
  p.n = static_cast<int64_t>(p.transpose_b ? b.rows() : b.cols());
  if (p.k != kb) {
    return Invalid(p.transpose_b ? "b.cols" : "b.rows",
                   absl::StrFormat("inner dimensions differ: op(a) is %d x %d (transpose_a=%s) "
                                   "but op(b) is %d x %d (transpose_b=%s); expected op(b) to "
                                   "have %d rows",
                                   p.m, p.k, p.transpose_a ? "true" : "false", kb, p.n,
                                   p.transpose_b ? "true" : "false", p.k));
  }

  if (request.output_dtype() == v1::DTYPE_UNSPECIFIED) {
    p.output_type = p.input_type;
  } else {
    const std::optional<DType> out = FromProto(request.output_dtype());
    if (!out.has_value()) {
      return Invalid("output_dtype", absl::StrCat(ProtoDTypeName(request.output_dtype()),
                                                  " is not one of ", kDTypeChoices));
    }
    if (!IsSupportedOutput(p.input_type, *out)) {
      const bool narrow = p.input_type == DType::kFloat16 || p.input_type == DType::kBFloat16;
      return Invalid("output_dtype",
                     absl::StrCat(ProtoDTypeName(request.output_dtype()), " is not available for ",
                                  ProtoDTypeName(a.dtype()), " inputs; expected ",
                                  narrow ? "DTYPE_FLOAT16, DTYPE_BFLOAT16, DTYPE_FLOAT32"
                                         : ProtoDTypeName(a.dtype()),
                                  " or DTYPE_UNSPECIFIED"));
    }
    p.output_type = *out;
  }

  if (!v1::Precision_IsValid(request.precision())) {
    return Invalid("precision", absl::StrCat("unknown value ", request.precision(),
                                             "; expected PRECISION_DEFAULT or PRECISION_TF32"));
  }
  p.precision = request.precision() == v1::PRECISION_TF32 ? Precision::kTF32 : Precision::kDefault;
  p.alpha = request.has_alpha() ? request.alpha() : 1.0;
  p.beta = request.has_beta() ? request.beta() : 0.0;

  if (request.has_c()) {
    absl::StatusOr<DType> c_type = CheckMatrix(request.c(), "c", limits);
    if (!c_type.ok()) return c_type.status();
    if (*c_type != p.output_type) {
      return Invalid("c.dtype", absl::StrCat("must be the output dtype (",
                                             ProtoDTypeName(ToProto(p.output_type)), "), got ",
                                             ProtoDTypeName(request.c().dtype())));
    }
    if (request.c().rows() != static_cast<uint64_t>(p.m) ||
        request.c().cols() != static_cast<uint64_t>(p.n)) {
      return Invalid("c", absl::StrFormat("must be %d x %d (the shape of op(a) * op(b)), got %d x %d",
                                          p.m, p.n, request.c().rows(), request.c().cols()));
    }
    p.c = request.c().data().data();
  } else if (p.beta != 0.0) {
    return Invalid("c", absl::StrCat("required when beta is non-zero (beta = ", p.beta, ")"));
  }
  if (p.beta == 0.0) p.c = nullptr;

  p.a = a.data().data();
  p.b = b.data().data();

  ValidatedRequest v;
  v.output_bytes = static_cast<uint64_t>(p.m) * static_cast<uint64_t>(p.n) *
                   ElementSize(p.output_type);
  if (v.output_bytes > limits.max_response_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("result of %d x %d %s is %d bytes, over the server's "
                        "max_response_bytes of %d",
                        p.m, p.n, DTypeName(p.output_type), v.output_bytes,
                        limits.max_response_bytes));
  }
  if (limits.max_problem_bytes > 0 && ProblemBytes(p) > limits.max_problem_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("problem needs %d bytes of device memory (operands and result), over "
                        "the engine's budget of %d bytes",
                        ProblemBytes(p), limits.max_problem_bytes));
  }
  v.problem = p;
  return v;
}

}  // namespace matmul::server
