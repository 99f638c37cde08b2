#include "kernels/reference_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace matmul {
namespace {

// [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50], checked by hand.
TEST(ReferenceGemmTest, SmallProductWorkedByHand) {
  const double a[] = {1, 2, 3, 4};
  const double b[] = {5, 6, 7, 8};
  const double c[] = {1, 1, 1, 1};
  GemmProblem p;
  p.input_type = p.output_type = DType::kFloat64;
  p.m = p.n = p.k = 2;
  p.a = a;
  p.b = b;
  p.c = c;
  p.alpha = 2;
  p.beta = -1;
  EXPECT_EQ(ReferenceGemm(p), (std::vector<double>{37, 43, 85, 99}));
  p.transpose_a = true;  // A^T = [1 3; 2 4]: [26 30; 38 44].
  p.beta = 0;
  EXPECT_EQ(ReferenceGemm(p), (std::vector<double>{52, 60, 76, 88}));
  p.transpose_b = true;  // A^T B^T = [1 3; 2 4] [5 7; 6 8] = [23 31; 34 46].
  EXPECT_EQ(ReferenceGemm(p), (std::vector<double>{46, 62, 68, 92}));
}

TEST(ReferenceGemmTest, RandomMatricesHaveNoZerosAndFreshValues) {
  std::mt19937_64 rng(std::random_device{}());
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const auto first = RandomMatrix(t, 4096, rng);
    const auto second = RandomMatrix(t, 4096, rng);
    EXPECT_NE(first, second);
    for (double v : ToDouble(first.data(), t, 4096)) {
      EXPECT_NE(v, 0.0);
      EXPECT_LE(std::fabs(v), 1.0);
    }
  }
}

TEST(ReferenceGemmTest, RelativeErrorCatchesNaNAndMeasuresDistance) {
  const std::vector<double> ref = {3, 4};
  const float close[] = {3, 4.5f};
  EXPECT_NEAR(RelativeError(ref, close, DType::kFloat32), 0.1, 1e-12);
  const float nan[] = {std::numeric_limits<float>::quiet_NaN(), 4};
  EXPECT_TRUE(std::isinf(RelativeError(ref, nan, DType::kFloat32)));
}


TEST(ReferenceGemmTest, GemmRelativeErrorScalesByTheTermsWhenTheyCancel) {
  // 1x1x1: alpha*a*b + beta*c = 1.5*0.5*0.5 + 0.25*(-1.49) = 0.0025, terms
  // of size ~0.4: an output off by 1e-4 is 4% of the result but 2.7e-4 of
  // the terms whose rounding produced it.
  const float a = 0.5f, b = 0.5f, c = -1.49f;
  GemmProblem p;
  p.m = p.n = p.k = 1;
  p.alpha = 1.5;
  p.beta = 0.25;
  p.a = &a;
  p.b = &b;
  p.c = &c;
  const double ref = 1.5 * 0.25 + 0.25 * -1.49;
  const float off = static_cast<float>(ref + 1e-4);
  EXPECT_GT(RelativeError({ref}, &off, DType::kFloat32), 0.03);
  EXPECT_LT(GemmRelativeError(p, &off), 3e-4);
  // Without cancellation it is the plain relative error: a wrong result
  // is still caught.
  std::mt19937_64 rng(1);
  const std::vector<uint8_t> x = RandomMatrix(DType::kFloat32, 64 * 64, rng);
  const std::vector<uint8_t> y = RandomMatrix(DType::kFloat32, 64 * 64, rng);
  GemmProblem q;
  q.m = q.n = q.k = 64;
  q.a = x.data();
  q.b = y.data();
  const std::vector<double> r = ReferenceGemm(q);
  std::vector<float> wrong(r.begin(), r.end());
  wrong[100] += 1.0f;
  EXPECT_GT(GemmRelativeError(q, wrong.data()), 1e-3);
  const std::vector<float> right(r.begin(), r.end());
  EXPECT_LT(GemmRelativeError(q, right.data()), 1e-6);
}

// The sampled check against the full one on random problems of every
// layout, with C: a result rounded to float32 measures alike both ways
// (the sampled figure is the same norm ratio over a subset); a 64 x 64 block
// gone wrong is caught; a NaN in a sampled row and column is caught; and with
// at least as many samples as elements both are the same number.
TEST(ReferenceGemmTest, SampledErrorAgreesWithTheFullOneAndCatchesABadBlock) {
  std::mt19937_64 rng(std::random_device{}());
  for (int layout = 0; layout < 4; ++layout) {
    GemmProblem p;
    p.m = 300;
    p.n = 200;
    p.k = 150;
    p.transpose_a = layout & 1;
    p.transpose_b = layout & 2;
    p.alpha = 1.25;
    p.beta = layout == 3 ? 0.5 : 0.0;
    const std::vector<uint8_t> a = RandomMatrix(DType::kFloat32, p.m * p.k, rng);
    const std::vector<uint8_t> b = RandomMatrix(DType::kFloat32, p.k * p.n, rng);
    const std::vector<uint8_t> c = RandomMatrix(DType::kFloat32, p.m * p.n, rng);
    p.a = a.data();
    p.b = b.data();
    p.c = c.data();
    const std::vector<double> ref = ReferenceGemm(p);
    std::vector<float> got(ref.begin(), ref.end());
    const double full = GemmRelativeError(p, got.data());
    const double sampled = SampledGemmRelativeError(p, got.data(), 4096, rng);
    ASSERT_GT(full, 0.0) << "rounding to float32 leaves some error";
    EXPECT_LT(sampled, 3 * full) << layout;
    EXPECT_GT(sampled, full / 3) << layout;
    EXPECT_EQ(SampledGemmRelativeError(p, got.data(), p.m * p.n, rng), full);

    std::uniform_int_distribution<int64_t> row(0, p.m - 64), col(0, p.n - 64);
    const int64_t r0 = row(rng), c0 = col(rng);
    std::vector<float> bad = got;
    for (int64_t i = r0; i < r0 + 64; ++i) {
      for (int64_t j = c0; j < c0 + 64; ++j) bad[i * p.n + j] += 1.0f;
    }
    EXPECT_GT(SampledGemmRelativeError(p, bad.data(), 4096, rng), 1e-3)
        << "block at " << r0 << "," << c0;
    std::vector<float> nan = got;
    for (int64_t i = 0; i < p.m; ++i) nan[i * p.n + c0] = std::numeric_limits<float>::quiet_NaN();
    // NaNs down column c0: with all but one element asked for, the grid
    // takes every column.
    EXPECT_TRUE(std::isinf(SampledGemmRelativeError(p, nan.data(), p.m * p.n - 1, rng)));
  }
}

// A row vector (m = 1): the grid takes the one row and `samples` columns.
TEST(ReferenceGemmTest, SampledErrorOfARowVector) {
  std::mt19937_64 rng(std::random_device{}());
  GemmProblem p;
  p.m = 1;
  p.n = 9000;
  p.k = 40;
  const std::vector<uint8_t> a = RandomMatrix(DType::kFloat32, p.m * p.k, rng);
  const std::vector<uint8_t> b = RandomMatrix(DType::kFloat32, p.k * p.n, rng);
  p.a = a.data();
  p.b = b.data();
  const std::vector<double> ref = ReferenceGemm(p);
  std::vector<float> got(ref.begin(), ref.end());
  EXPECT_LT(SampledGemmRelativeError(p, got.data(), 1000, rng), 1e-6);
  // Every element 1% off: 0.01 ||ref|| / max(||ref||, ||scale||) over the
  // sample, just under 0.01 where the scale's norm is the larger.
  for (float& v : got) v *= 1.01f;
  const double err = SampledGemmRelativeError(p, got.data(), 1000, rng);
  EXPECT_GT(err, 5e-3);
  EXPECT_LE(err, 1.001e-2);
}

}  // namespace
}  // namespace matmul
