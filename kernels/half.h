// Conversions between float and the 16-bit float formats (IEEE binary16 and
// bfloat16), rounding to nearest, ties to even, as the hardware does.
//
//   uint16_t h = matmul::FloatToHalf(1.0f);       // 0x3c00
//   float f = matmul::BFloat16ToFloat(0x3f80);    // 1.0f
//
// NaN stays NaN (quiet), infinities and signed zeros are kept, float16
// subnormals are produced and read exactly, and values beyond a format's range
// round to infinity.
#ifndef MATMUL_KERNELS_HALF_H_
#define MATMUL_KERNELS_HALF_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace matmul {

namespace half_internal {
inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace half_internal

inline uint16_t FloatToHalf(float f) {
  using half_internal::Bits;
  using half_internal::FromBits;
  const uint32_t x = Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN; NaN keeps its top payload, quiet.
    return static_cast<uint16_t>(
        sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520
  if (abs < 0x38800000u) {
    // Below 2^-14: a float16 subnormal (or zero). Adding 0.5 places the
    // float16 subnormal step (2^-24) at the float's last mantissa bit, so the
    // float adder rounds to nearest even for us.
    const float shifted = FromBits(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (Bits(shifted) - 0x3f000000u));
  }
  const uint32_t odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + odd;  // Rebias the exponent (-112) and round.
  return static_cast<uint16_t>(sign | (abs >> 13));
}

inline float HalfToFloat(uint16_t h) {
  using half_internal::FromBits;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // Inf, or NaN made quiet (as F16C's conversion does).
    return FromBits(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  }
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -v : v;
  }
  return FromBits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Branch-free (a select for NaN), so that the bulk conversion's blocks of
// calls vectorize.
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t x = half_internal::Bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // Nearest even.
  const uint32_t quiet_nan = (x >> 16) | 0x40u;                     // Top bits, made quiet.
  const bool nan = static_cast<int32_t>(x & 0x7fffffffu) > 0x7f800000;
  return static_cast<uint16_t>(nan ? quiet_nan : rounded);
}

inline float BFloat16ToFloat(uint16_t b) {
  return half_internal::FromBits(static_cast<uint32_t>(b) << 16);
}

// Bulk conversions; `n` elements each.
void HalfToFloat(const uint16_t* in, float* out, size_t n);
void BFloat16ToFloat(const uint16_t* in, float* out, size_t n);
void FloatToHalf(const float* in, uint16_t* out, size_t n);
void FloatToBFloat16(const float* in, uint16_t* out, size_t n);

}  // namespace matmul

#endif  // MATMUL_KERNELS_HALF_H_
