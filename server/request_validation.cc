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

// One operand once checked: its shape and dtype, and the kept matrix when
// it was given by handle.
struct Operand {
  uint64_t rows = 0;
  uint64_t cols = 0;
  DType dtype = DType::kFloat32;
  std::shared_ptr<StoredMatrix> kept;
  bool by_handle = false;
  // The bytes (inline or in shared memory); null when by handle.
  const void* data = nullptr;
  // They are in a pinned buffer the parser moved them to.
  bool pinned = false;
  // The shared-memory region holding them, if any.
  std::shared_ptr<const void> hold;
};

struct Shape {
  DType dtype;
  uint64_t bytes;
};

// An operand's inline payload: its data field, or the buffer the parser
// moved it to (see request_parser.h).
struct Payload {
  const void* data = nullptr;
  size_t size = 0;
  bool pinned = false;
  bool empty() const { return size == 0; }
};

Payload PayloadOf(const Matrix& x, const HostBuffer* moved) {
  if (moved != nullptr && moved->data() != nullptr) {
    return {moved->data(), moved->size(), moved->pinned()};
  }
  return {x.data().data(), x.data().size(), false};
}

absl::StatusOr<DType> CheckMatrix(const Matrix& x, const Payload& payload, absl::string_view field,
                                  const RequestLimits& limits);

// An operand given by handle: the kept matrix must exist, and any shape or
// dtype the request states must be the kept one's.
absl::StatusOr<Operand> CheckHandle(const Matrix& x, const Payload& payload,
                                    absl::string_view field, const KeptMatrixLookup& lookup) {
  if (!lookup) {
    return Invalid(absl::StrCat(field, ".handle"),
                   "this server keeps no matrices (--resident_bytes=0); send the data inline");
  }
  if (!payload.empty()) {
    return Invalid(absl::StrCat(field, ".data"),
                   absl::StrCat("must be empty when ", field, ".handle is set, got ",
                                payload.size, " bytes"));
  }
  absl::StatusOr<KeptMatrix> kept = lookup(absl::StrCat(field, ".handle"), x.handle());
  if (!kept.ok()) return kept.status();
  if ((x.rows() != 0 && x.rows() != kept->rows) || (x.cols() != 0 && x.cols() != kept->cols)) {
    return Invalid(field, absl::StrFormat("handle %s holds a %d x %d matrix, the request says %d x %d",
                                          x.handle(), kept->rows, kept->cols, x.rows(), x.cols()));
  }
  if (x.dtype() != v1::DTYPE_UNSPECIFIED && FromProto(x.dtype()) != kept->dtype) {
    return Invalid(absl::StrCat(field, ".dtype"),
                   absl::StrCat("handle ", x.handle(), " holds ", ProtoDTypeName(ToProto(kept->dtype)),
                                ", the request says ", ProtoDTypeName(x.dtype())));
  }
  Operand o;
  o.rows = kept->rows;
  o.cols = kept->cols;
  o.dtype = kept->dtype;
  o.kept = std::move(kept->matrix);
  o.by_handle = true;
  return o;
}

absl::StatusOr<Shape> CheckShape(const Matrix& x, absl::string_view field,
                                 const RequestLimits& limits);

// Shared-memory bytes of `expected` length for `field`.
absl::StatusOr<SharedBytes> CheckShared(const v1::SharedMemoryRef& ref, absl::string_view field,
                                        uint64_t expected, absl::string_view what,
                                        const SharedMemoryLookup& shm) {
  if (!shm) {
    return Invalid(field, "this server has shared memory off (start it with --shared_memory); "
                          "send the data inline");
  }
  if (ref.bytes() != expected) {
    return Invalid(absl::StrCat(field, ".bytes"),
                   absl::StrCat("expected ", expected, " (", what, "), got ", ref.bytes()));
  }
  return shm(ref, std::string(field));
}

absl::StatusOr<Operand> CheckOperand(const Matrix& x, const HostBuffer* moved,
                                     absl::string_view field, const RequestLimits& limits,
                                     const KeptMatrixLookup& lookup,
                                     const SharedMemoryLookup& shm) {
  const Payload payload = PayloadOf(x, moved);
  const int sources = !x.handle().empty() + x.has_shm() + !payload.empty();
  if (sources > 1) {
    return Invalid(field, "give exactly one of data, handle and shm");
  }
  if (!x.handle().empty()) return CheckHandle(x, payload, field, lookup);
  Operand o;
  if (x.has_shm()) {
    absl::StatusOr<Shape> shape = CheckShape(x, field, limits);
    if (!shape.ok()) return shape.status();
    absl::StatusOr<SharedBytes> bytes =
        CheckShared(x.shm(), absl::StrCat(field, ".shm"), shape->bytes,
                    absl::StrFormat("%d x %d %s", x.rows(), x.cols(), DTypeName(shape->dtype)), shm);
    if (!bytes.ok()) return bytes.status();
    o.dtype = shape->dtype;
    o.data = bytes->data;
    o.hold = std::move(bytes->hold);
  } else {
    absl::StatusOr<DType> type = CheckMatrix(x, payload, field, limits);
    if (!type.ok()) return type.status();
    o.dtype = *type;
    o.data = payload.data;
    o.pinned = payload.pinned;
  }
  o.rows = x.rows();
  o.cols = x.cols();
  return o;
}

// Checks one matrix's dtype and shape (not its data); `field` is its name
// in the request ("a", "b", "c", "matrix").
absl::StatusOr<Shape> CheckShape(const Matrix& x, absl::string_view field,
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
  return Shape{*type, bytes};
}

// Checks one inline matrix's dtype, shape and payload size.
absl::StatusOr<DType> CheckMatrix(const Matrix& x, const Payload& payload, absl::string_view field,
                                  const RequestLimits& limits) {
  absl::StatusOr<Shape> shape = CheckShape(x, field, limits);
  if (!shape.ok()) return shape.status();
  if (payload.size != shape->bytes) {
    return Invalid(absl::StrCat(field, ".data"),
                   absl::StrFormat("expected %d bytes (%d x %d %s), got %d", shape->bytes, x.rows(),
                                   x.cols(), DTypeName(shape->dtype), payload.size));
  }
  return shape->dtype;
}

}  // namespace

absl::StatusOr<uint64_t> CheckStoredShape(const v1::Matrix& shape, const RequestLimits& limits) {
  absl::StatusOr<Shape> checked = CheckShape(shape, "matrix", limits);
  if (!checked.ok()) return checked.status();
  return checked->bytes;
}

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
                                                          const RequestLimits& limits,
                                                          const KeptMatrixLookup& lookup,
                                                          const SharedMemoryLookup& shm,
                                                          const InlineOperands* operands) {
  if (!request.has_a()) return Invalid("a", "required");
  if (!request.has_b()) return Invalid("b", "required");
  absl::StatusOr<Operand> a = CheckOperand(request.a(), operands ? &operands->a : nullptr, "a",
                                           limits, lookup, shm);
  if (!a.ok()) return a.status();
  absl::StatusOr<Operand> b = CheckOperand(request.b(), operands ? &operands->b : nullptr, "b",
                                           limits, lookup, shm);
  if (!b.ok()) return b.status();
  if (a->dtype != b->dtype) {
    return Invalid("b.dtype", absl::StrCat("must match a.dtype (", ProtoDTypeName(ToProto(a->dtype)),
                                           "), got ", ProtoDTypeName(ToProto(b->dtype))));
  }

  GemmProblem p;
  p.input_type = a->dtype;
  p.transpose_a = request.transpose_a();
  p.transpose_b = request.transpose_b();
  p.m = static_cast<int64_t>(p.transpose_a ? a->cols : a->rows);
  p.k = static_cast<int64_t>(p.transpose_a ? a->rows : a->cols);
  const int64_t kb = static_cast<int64_t>(p.transpose_b ? b->cols : b->rows);
  p.n = static_cast<int64_t>(p.transpose_b ? b->rows : b->cols);
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
      const std::string in_name = ProtoDTypeName(ToProto(p.input_type));
      return Invalid("output_dtype",
                     absl::StrCat(ProtoDTypeName(request.output_dtype()), " is not available for ",
                                  in_name, " inputs; expected ",
                                  narrow ? "DTYPE_FLOAT16, DTYPE_BFLOAT16, DTYPE_FLOAT32" : in_name,
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

  ValidatedRequest v;
  if (request.has_c()) {
    absl::StatusOr<Operand> c = CheckOperand(request.c(), operands ? &operands->c : nullptr, "c",
                                             limits, lookup, shm);
    if (!c.ok()) return c.status();
    if (c->dtype != p.output_type) {
      return Invalid("c.dtype", absl::StrCat("must be the output dtype (",
                                             ProtoDTypeName(ToProto(p.output_type)), "), got ",
                                             ProtoDTypeName(ToProto(c->dtype))));
    }
    if (c->rows != static_cast<uint64_t>(p.m) || c->cols != static_cast<uint64_t>(p.n)) {
      return Invalid("c", absl::StrFormat("must be %d x %d (the shape of op(a) * op(b)), got %d x %d",
                                          p.m, p.n, c->rows, c->cols));
    }
    if (p.beta != 0.0) {
      if (c->by_handle) {
        p.resident |= kResidentC;
        v.c_kept = std::move(c->kept);
      } else {
        p.c = c->data;
        if (c->pinned) p.host_pinned |= kResidentC;
        if (c->hold) v.holds.push_back(std::move(c->hold));
      }
    }
  } else if (p.beta != 0.0) {
    return Invalid("c", absl::StrCat("required when beta is non-zero (beta = ", p.beta, ")"));
  }
  if (p.beta == 0.0) p.c = nullptr;

  if (a->by_handle) {
    p.resident |= kResidentA;
    v.a_kept = std::move(a->kept);
  } else {
    p.a = a->data;
    if (a->pinned) p.host_pinned |= kResidentA;
    if (a->hold) v.holds.push_back(std::move(a->hold));
  }
  if (b->by_handle) {
    p.resident |= kResidentB;
    v.b_kept = std::move(b->kept);
  } else {
    p.b = b->data;
    if (b->pinned) p.host_pinned |= kResidentB;
    if (b->hold) v.holds.push_back(std::move(b->hold));
  }
  if (request.store_result()) {
    if (!lookup) {
      return Invalid("store_result", "this server keeps no matrices (--resident_bytes=0)");
    }
    p.resident |= kResidentD;
    v.keep_result = true;
  }

  v.output_bytes = static_cast<uint64_t>(p.m) * static_cast<uint64_t>(p.n) *
                   ElementSize(p.output_type);
  if (request.has_output_shm()) {
    if (v.keep_result) return Invalid("output_shm", "cannot be combined with store_result");
    absl::StatusOr<SharedBytes> out =
        CheckShared(request.output_shm(), "output_shm", v.output_bytes,
                    absl::StrFormat("the %d x %d %s result", p.m, p.n, DTypeName(p.output_type)),
                    shm);
    if (!out.ok()) return out.status();
    v.output_shm = out->data;
    v.holds.push_back(std::move(out->hold));
  }
  if (!v.keep_result && v.output_shm == nullptr && v.output_bytes > limits.max_response_bytes) {
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
