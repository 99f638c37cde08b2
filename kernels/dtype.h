// Element types and precisions the engines understand, independent of any
// wire format (the server maps matmul.v1 enums onto these).
//
//   size_t bytes = matmul::ElementSize(matmul::DType::kBFloat16);  // 2
//   absl::string_view name = matmul::DTypeName(matmul::DType::kFloat32);
#ifndef MATMUL_KERNELS_DTYPE_H_
#define MATMUL_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace matmul {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
};
inline constexpr int kNumDTypes = 4;

// How float32 products may be computed.
enum class Precision : uint8_t {
  kDefault = 0,  // The dtype's own accuracy (float32 stays float32).
  kTF32 = 1,     // float32 inputs may go through TF32 tensor cores.
};

// Bytes per element.
constexpr size_t ElementSize(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
  }
  return 0;
}

// "float32", "float64", "float16", "bfloat16": used in logs and metric labels.
absl::string_view DTypeName(DType t);

absl::string_view PrecisionName(Precision p);

// True when `input` operands may produce an `output` result: float16 and
// bfloat16 inputs give float16, bfloat16 or float32; float32 and float64
// give their own type.
bool IsSupportedOutput(DType input, DType output);

}  // namespace matmul

#endif  // MATMUL_KERNELS_DTYPE_H_
