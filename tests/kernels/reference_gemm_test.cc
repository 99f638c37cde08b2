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

}  // namespace
}  // namespace matmul
