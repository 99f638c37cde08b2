#include "kernels/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

namespace matmul {
namespace {

// Value of a 16-bit pattern, exactly, as a double.
double HalfValue(uint16_t h) { return HalfToFloat(h); }
double BF16Value(uint16_t b) { return BFloat16ToFloat(b); }

// Checks that `got` is a nearest representable value to `x` among its
// neighbours (ties to an even mantissa), for monotone 16-bit encodings.
template <typename ValueFn>
void ExpectNearestEven(float x, uint16_t got, ValueFn value) {
  const double v = value(got);
  const double err = std::fabs(v - static_cast<double>(x));
  for (int delta : {-1, 1}) {
    const uint16_t neighbour = static_cast<uint16_t>(got + delta);
    // Skip across the sign boundary, into NaN space or from infinity.
    if (((neighbour ^ got) & 0x8000) != 0) continue;
    const double nv = value(neighbour);
    if (!std::isfinite(nv) || !std::isfinite(v)) continue;
    const double nerr = std::fabs(nv - static_cast<double>(x));
    ASSERT_LE(err, nerr) << "x=" << x << " got=0x" << std::hex << got;
    if (err == nerr) {
      EXPECT_EQ(got & 1, 0) << "tie not to even: x=" << x << " got=0x" << std::hex << got;
    }
  }
}

TEST(HalfTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(HalfTest, RoundsToNearestEvenOnRandomFloats) {
  std::mt19937_64 rng(std::random_device{}());
  // Magnitudes across the subnormal, normal and overflow ranges.
  std::uniform_real_distribution<double> log_mag(-26.0, 16.5);
  std::bernoulli_distribution negative(0.5);
  for (int i = 0; i < 200000; ++i) {
    float x = static_cast<float>(std::exp2(log_mag(rng)));
    if (negative(rng)) x = -x;
    const uint16_t h = FloatToHalf(x);
    if (std::fabs(x) >= 65520.0f) {
      EXPECT_EQ(h & 0x7fff, 0x7c00) << x;  // Rounds to infinity.
      continue;
    }
    ExpectNearestEven(x, h, HalfValue);
  }
}

TEST(HalfTest, SpecialValues) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::exp2f(-24)), 0x0001);       // Smallest subnormal.
  EXPECT_EQ(FloatToHalf(std::exp2f(-25)), 0x0000);       // Tie: to even (zero).
  EXPECT_EQ(FloatToHalf(std::exp2f(-25) * 1.5f), 0x0001);
  const uint16_t nan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x3ff, 0);
}

TEST(BFloat16Test, EveryBFloat16RoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(f))));
      continue;
    }
    EXPECT_EQ(FloatToBFloat16(f), b) << std::hex << b;
  }
}

TEST(BFloat16Test, RoundsToNearestEvenOnRandomFloats) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    float x;
    std::memcpy(&x, &u, 4);
    if (!std::isfinite(x)) continue;
    const uint16_t b = FloatToBFloat16(x);
    if (std::isinf(BFloat16ToFloat(b))) {
      EXPECT_GE(std::fabs(x), 3.3895313e38f);  // Only the top half-ulp overflows.
      continue;
    }
    ExpectNearestEven(x, b, BF16Value);
  }
}

TEST(BFloat16Test, SpecialValues) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // Rounds to +inf.
  const uint16_t nan = FloatToBFloat16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(nan)));
  // A signalling NaN whose payload lives only in the low bits stays a NaN.
  uint32_t snan = 0x7f800001;
  float f;
  std::memcpy(&f, &snan, 4);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(f))));
}

TEST(HalfTest, BulkConversionsMatchScalar) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  std::vector<float> in(1000);
  for (float& v : in) v = dist(rng);
  std::vector<uint16_t> h(in.size()), b(in.size());
  FloatToHalf(in.data(), h.data(), in.size());
  FloatToBFloat16(in.data(), b.data(), in.size());
  std::vector<float> hf(in.size()), bf(in.size());
  HalfToFloat(h.data(), hf.data(), in.size());
  BFloat16ToFloat(b.data(), bf.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(h[i], FloatToHalf(in[i]));
    EXPECT_EQ(b[i], FloatToBFloat16(in[i]));
    EXPECT_EQ(hf[i], HalfToFloat(h[i]));
    EXPECT_EQ(bf[i], BFloat16ToFloat(b[i]));
  }
}

// The bulk widening `bulk` gives bit for bit what `scalar` gives on every
// 16-bit pattern (NaN payloads included).
template <typename Bulk, typename Scalar>
void ExpectBulkWideningMatchesScalarOnEveryPattern(Bulk bulk, Scalar scalar) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t b = 0; b < 0x10000; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> widened(all.size());
  bulk(all.data(), widened.data(), all.size());
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float expected = scalar(all[b]);
    ASSERT_EQ(std::memcmp(&widened[b], &expected, 4), 0) << std::hex << b;
  }
}

// The bulk bfloat16 conversions run in vectorizable blocks with a scalar
// tail: every bit pattern, at every length and start offset around a block,
// must give exactly what the scalar functions give (NaNs included).
TEST(BFloat16Test, BulkConversionsMatchScalarOnEveryBitPattern) {
  ASSERT_NO_FATAL_FAILURE(ExpectBulkWideningMatchesScalarOnEveryPattern(
      [](const uint16_t* in, float* out, size_t n) { BFloat16ToFloat(in, out, n); },
      [](uint16_t b) { return BFloat16ToFloat(b); }));

  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> in(4099);
  for (float& v : in) {
    const uint32_t u = bits(rng);
    std::memcpy(&v, &u, 4);
  }
  // Some NaNs (quiet and signalling), infinities and values at rounding ties.
  const uint32_t specials[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u, 0xff800000u,
                               0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00000001u, 0x80000000u};
  for (size_t i = 0; i < std::size(specials); ++i) std::memcpy(&in[7 * i + 3], &specials[i], 4);
  for (size_t offset : {size_t{0}, size_t{1}, size_t{5}}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{33},
                     in.size() - offset}) {
      std::vector<uint16_t> narrowed(n + 1, 0xabcd);
      FloatToBFloat16(in.data() + offset, narrowed.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(narrowed[i], FloatToBFloat16(in[offset + i])) << "offset " << offset << " i " << i;
      }
      EXPECT_EQ(narrowed[n], 0xabcd) << "wrote past n = " << n;
      std::vector<float> back(n + 1, -7.0f);
      BFloat16ToFloat(narrowed.data(), back.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const float scalar = BFloat16ToFloat(narrowed[i]);
        ASSERT_EQ(std::memcmp(&back[i], &scalar, 4), 0) << "offset " << offset << " i " << i;
      }
      EXPECT_EQ(back[n], -7.0f) << "wrote past n = " << n;
    }
  }
}

TEST(HalfTest, BulkConversionsMatchScalarOnEveryBitPattern) {
  ASSERT_NO_FATAL_FAILURE(ExpectBulkWideningMatchesScalarOnEveryPattern(
      [](const uint16_t* in, float* out, size_t n) { HalfToFloat(in, out, n); },
      [](uint16_t h) { return HalfToFloat(h); }));

  // Random bit patterns, and as many again drawn around float16's range
  // (subnormals, normals, the overflow edge), with NaNs, infinities and ties.
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> exponent(-30.0f, 17.0f);
  std::vector<float> in(8197);
  for (size_t i = 0; i < in.size(); ++i) {
    if (i % 2 == 0) {
      const uint32_t u = bits(rng);
      std::memcpy(&in[i], &u, 4);
    } else {
      in[i] = std::exp2(exponent(rng)) * (bits(rng) % 2 ? 1.0f : -1.0f);
    }
  }
  const uint32_t specials[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u, 0xff800000u,
                               0x477fe000u, 0x477ff000u, 0x477fefffu, 0x33800000u, 0x33000000u,
                               0x38800000u, 0x387fffffu, 0x00000001u, 0x80000000u, 0x3f801000u};
  for (size_t i = 0; i < std::size(specials); ++i) std::memcpy(&in[5 * i + 2], &specials[i], 4);
  for (size_t offset : {size_t{0}, size_t{3}}) {
    for (size_t n : {size_t{0}, size_t{7}, size_t{16}, size_t{31}, in.size() - offset}) {
      std::vector<uint16_t> narrowed(n + 1, 0xabcd);
      FloatToHalf(in.data() + offset, narrowed.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(narrowed[i], FloatToHalf(in[offset + i]))
            << "offset " << offset << " i " << i << " value " << in[offset + i];
      }
      EXPECT_EQ(narrowed[n], 0xabcd) << "wrote past n = " << n;
    }
  }
}

}  // namespace
}  // namespace matmul
