// CheckResponse (client/requests.h) on responses built from the float64
// reference: right ones pass, wrong ones fail, small and large alike (large
// results are checked over a random grid: SampledGemmRelativeError).
#include "client/requests.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/reference_gemm.h"

namespace matmul::client {
namespace {

// The response a correct server gives `request`: its reference rounded to
// the output dtype.
v1::MultiplyResponse ReferenceResponse(const v1::MultiplyRequest& request, DType out) {
  absl::StatusOr<GemmProblem> p = ProblemOf(request);
  EXPECT_TRUE(p.ok()) << p.status();
  const std::vector<double> ref = ReferenceGemm(*p);
  std::string bytes(ref.size() * ElementSize(out), '\0');
  FromDouble(ref, out, bytes.data());
  v1::MultiplyResponse response;
  *response.mutable_c() = MakeMatrix(p->m, p->n, out, std::move(bytes));
  return response;
}

TEST(CheckResponseTest, RightResultsPassAndAWrongBlockFailsAtEverySize) {
  std::mt19937_64 rng(std::random_device{}());
  // 64 x 64 is checked whole; 700 x 600 (420,000 elements) on a grid.
  for (int64_t side : {64, 600}) {
    ProblemSpec spec;
    spec.m = side + (side > 64 ? 100 : 0);
    spec.n = side;
    spec.k = 96;
    spec.dtype = DType::kBFloat16;
    spec.output_dtype = DType::kFloat32;
    spec.transpose_b = true;
    const v1::MultiplyRequest request = RandomRequest(spec, rng);
    v1::MultiplyResponse response = ReferenceResponse(request, DType::kFloat32);
    absl::StatusOr<double> err = CheckResponse(request, response);
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_LT(*err, 1e-6) << side;

    // A 64 x 64 block off by 1 (values are of order sqrt(96) / 3).
    std::string* data = response.mutable_c()->mutable_data();
    std::uniform_int_distribution<int64_t> row(0, spec.m - 64), col(0, spec.n - 64);
    const int64_t r0 = row(rng), c0 = col(rng);
    for (int64_t i = r0; i < r0 + 64; ++i) {
      for (int64_t j = c0; j < c0 + 64; ++j) {
        float v;
        std::memcpy(&v, data->data() + 4 * (i * spec.n + j), 4);
        v += 1.0f;
        std::memcpy(data->data() + 4 * (i * spec.n + j), &v, 4);
      }
    }
    err = CheckResponse(request, response);
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_GT(*err, 1e-2) << side << ": block at " << r0 << "," << c0;
  }
}

TEST(CheckResponseTest, ShapeAndDTypeMismatchesAreErrors) {
  std::mt19937_64 rng(std::random_device{}());
  ProblemSpec spec;
  spec.m = 300;
  spec.n = 400;
  spec.k = 8;
  spec.dtype = DType::kFloat32;
  const v1::MultiplyRequest request = RandomRequest(spec, rng);
  v1::MultiplyResponse response = ReferenceResponse(request, DType::kFloat32);
  response.mutable_c()->set_cols(399);
  EXPECT_FALSE(CheckResponse(request, response).ok());
  response = ReferenceResponse(request, DType::kFloat32);
  response.mutable_c()->set_dtype(ToWire(DType::kFloat64));
  EXPECT_FALSE(CheckResponse(request, response).ok());
  response = ReferenceResponse(request, DType::kFloat32);
  response.mutable_c()->mutable_data()->pop_back();
  EXPECT_FALSE(CheckResponse(request, response).ok());
}

}  // namespace
}  // namespace matmul::client
