#include "kernels/dtype.h"

namespace matmul {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

absl::string_view PrecisionName(Precision p) {
  return p == Precision::kTF32 ? "tf32" : "default";
}

bool IsSupportedOutput(DType input, DType output) {
  switch (input) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return output == DType::kFloat16 || output == DType::kBFloat16 ||
             output == DType::kFloat32;
    case DType::kFloat32:
    case DType::kFloat64:
      return output == input;
  }
  return false;
}

}  // namespace matmul
