#include "kernels/half.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define MATMUL_HALF_F16C 1
#endif

namespace matmul {

// float16: where the CPU has F16C (x86-64 since 2012), its conversion
// instructions, 8 elements at a time, rounding to nearest even; they give
// the same bits as the scalar functions (half_test checks every pattern).
// Elsewhere plain element loops: blocks like the bfloat16 ones below, with
// every case computed and picked by masks, measured slower here on
// normal values (1.6 against 1.35 ms per 2^20 floats narrowed), where the
// scalar code's branches always predict.
#ifdef MATMUL_HALF_F16C
namespace {

// F16C and AVX (for the 256-bit registers), and the OS saving those
// registers; read with cpuid and xgetbv, which GCC and clang both take
// (clang 14's __builtin_cpu_supports has no "f16c").
bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool f16c = (ecx >> 29) & 1u, avx = (ecx >> 28) & 1u, osxsave = (ecx >> 27) & 1u;
  if (!f16c || !avx || !osxsave) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 0x6u) == 0x6u;  // SSE and AVX state enabled.
}

bool HasF16c() {
  static const bool has = CpuHasF16c();
  return has;
}

__attribute__((target("avx,f16c"))) void HalfToFloatF16c(const uint16_t* in, float* out,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) void FloatToHalfF16c(const float* in, uint16_t* out,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

}  // namespace
#endif

void HalfToFloat(const uint16_t* in, float* out, size_t n) {
#ifdef MATMUL_HALF_F16C
  if (HasF16c()) return HalfToFloatF16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
}
void FloatToHalf(const float* in, uint16_t* out, size_t n) {
#ifdef MATMUL_HALF_F16C
  if (HasF16c()) return FloatToHalfF16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

// bfloat16: blocks of kBlock calls of the (branch-free) scalar functions
// with a fixed trip count, which GCC's SLP vectorizer turns into SSE2 code
// at -O2; the plain element loops stayed scalar, one element a cycle (11%
// of a CPU server's time on small bfloat16 requests; half-bench, 2^20
// elements: narrowing 1.1-1.3 -> 0.5-0.6 ms, widening 0.67 -> 0.16 ms).
namespace {
constexpr size_t kBlock = 16;

// out[i] = convert(in[i]) for n elements: kBlock at a time through a local
// block, then the tail one by one.
template <typename In, typename Out, typename Convert>
inline void ConvertInBlocks(const In* in, Out* out, size_t n, Convert convert) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    Out block[kBlock];
    for (size_t j = 0; j < kBlock; ++j) block[j] = convert(in[i + j]);
    std::memcpy(out + i, block, sizeof(block));
  }
  for (; i < n; ++i) out[i] = convert(in[i]);
}
}  // namespace

void BFloat16ToFloat(const uint16_t* in, float* out, size_t n) {
  ConvertInBlocks(in, out, n, [](uint16_t h) { return BFloat16ToFloat(h); });
}
void FloatToBFloat16(const float* in, uint16_t* out, size_t n) {
  ConvertInBlocks(in, out, n, [](float f) { return FloatToBFloat16(f); });
}

}  // namespace matmul
