#include "server/request_validation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "client/requests.h"

namespace matmul::server {
namespace {

using ::testing::HasSubstr;
using v1::MultiplyRequest;

MultiplyRequest Valid(int64_t m = 3, int64_t n = 4, int64_t k = 5,
                      DType dtype = DType::kFloat32) {
  static std::mt19937_64 rng(std::random_device{}());
  client::ProblemSpec spec;
  spec.m = m;
  spec.n = n;
  spec.k = k;
  spec.dtype = dtype;
  return client::RandomRequest(spec, rng);
}

// Expects INVALID_ARGUMENT whose message contains every one of `parts`.
void ExpectInvalid(const MultiplyRequest& request, std::vector<std::string> parts,
                   RequestLimits limits = {}) {
  absl::StatusOr<ValidatedRequest> v = ValidateMultiplyRequest(request, limits);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
  for (const std::string& part : parts) EXPECT_THAT(v.status().message(), HasSubstr(part));
}

TEST(RequestValidationTest, AcceptsValidRequestAndPointsIntoIt) {
  MultiplyRequest r = Valid(3, 4, 5);
  absl::StatusOr<ValidatedRequest> v = ValidateMultiplyRequest(r, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->problem.m, 3);
  EXPECT_EQ(v->problem.n, 4);
  EXPECT_EQ(v->problem.k, 5);
  EXPECT_EQ(v->problem.a, r.a().data().data());
  EXPECT_EQ(v->problem.b, r.b().data().data());
  EXPECT_EQ(v->problem.alpha, 1.0);
  EXPECT_EQ(v->problem.beta, 0.0);
  EXPECT_EQ(v->output_bytes, 3u * 4 * 4);
}

TEST(RequestValidationTest, TransposesChangeTheShapes) {
  MultiplyRequest r = Valid(3, 4, 5);
  // a is 3x5; with transpose_a it is read as op(a) = 5x3, so b (5x4) no longer fits.
  r.set_transpose_a(true);
  ExpectInvalid(r, {"b.rows", "inner dimensions differ", "op(a) is 5 x 3"});
  // b^T is 4x5: also wrong.
  r.set_transpose_b(true);
  ExpectInvalid(r, {"b.cols", "inner dimensions differ"});
  r.set_transpose_a(false);
  // op(a) 3x5, op(b) = b^T = 4x5: inner 5 vs 4.
  ExpectInvalid(r, {"b.cols"});
  *r.mutable_b() = Valid(4, 5, 1).a();  // b is 4x1 -> b^T is 1x4; still mismatch.
  ExpectInvalid(r, {"inner dimensions"});
  *r.mutable_b() = Valid(4, 1, 5).a();  // b is 4x5 -> b^T is 5x4: fits.
  absl::StatusOr<ValidatedRequest> v = ValidateMultiplyRequest(r, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->problem.n, 4);
}

TEST(RequestValidationTest, MissingOperands) {
  MultiplyRequest r = Valid();
  r.clear_a();
  ExpectInvalid(r, {"a: required"});
  r = Valid();
  r.clear_b();
  ExpectInvalid(r, {"b: required"});
}

TEST(RequestValidationTest, DTypes) {
  MultiplyRequest r = Valid();
  r.mutable_a()->set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectInvalid(r, {"a.dtype", "DTYPE_FLOAT32"});
  r = Valid();
  r.mutable_b()->set_dtype(static_cast<v1::DType>(99));
  ExpectInvalid(r, {"b.dtype", "unknown value 99"});
  r = Valid();
  r.mutable_b()->set_dtype(v1::DTYPE_FLOAT16);
  r.mutable_b()->mutable_data()->resize(r.b().data().size() / 2);
  ExpectInvalid(r, {"b.dtype", "must match a.dtype (DTYPE_FLOAT32)", "DTYPE_FLOAT16"});
}

TEST(RequestValidationTest, ZeroAndOversizeDimensions) {
  MultiplyRequest r = Valid();
  r.mutable_a()->set_rows(0);
  r.mutable_a()->clear_data();
  ExpectInvalid(r, {"a.rows", "at least 1, got 0"});
  r = Valid();
  r.mutable_b()->set_cols(0);
  ExpectInvalid(r, {"b.cols", "at least 1"});
  r = Valid();
  ExpectInvalid(r, {"a.cols", "over the server's max_dim of 4"}, {.max_dim = 4});
}

TEST(RequestValidationTest, SizesThatOverflow64Bits) {
  MultiplyRequest r = Valid();
  r.mutable_a()->set_rows(uint64_t{1} << 40);
  r.mutable_a()->set_cols(uint64_t{1} << 40);
  RequestLimits limits;
  limits.max_dim = ~uint64_t{0};
  ExpectInvalid(r, {"a", "overflows 64-bit sizes"}, limits);
  // Product fits, times the element size does not.
  r.mutable_a()->set_rows(uint64_t{1} << 31);
  r.mutable_a()->set_cols(uint64_t{1} << 31);
  ExpectInvalid(r, {"overflows"}, limits);
  // Enormous declared sizes with a tiny payload: a data-length error.
  r.mutable_a()->set_rows(uint64_t{1} << 20);
  r.mutable_a()->set_cols(uint64_t{1} << 20);
  ExpectInvalid(r, {"a.data", "expected 4398046511104 bytes"}, limits);
}

TEST(RequestValidationTest, DataOneByteShortOrLong) {
  for (int delta : {-1, 1}) {
    MultiplyRequest r = Valid(3, 4, 5);
    r.mutable_a()->mutable_data()->resize(r.a().data().size() + delta);
    ExpectInvalid(r, {"a.data", "expected 60 bytes (3 x 5 float32)",
                      absl::StrCat("got ", 60 + delta)});
    r = Valid(3, 4, 5);
    r.mutable_b()->mutable_data()->resize(r.b().data().size() + delta);
    ExpectInvalid(r, {"b.data", "expected 80 bytes"});
  }
}

TEST(RequestValidationTest, OutputDType) {
  MultiplyRequest r = Valid();
  r.set_output_dtype(v1::DTYPE_FLOAT16);
  ExpectInvalid(r, {"output_dtype", "DTYPE_FLOAT16 is not available for DTYPE_FLOAT32 inputs",
                    "expected DTYPE_FLOAT32"});
  r.set_output_dtype(static_cast<v1::DType>(42));
  ExpectInvalid(r, {"output_dtype", "unknown value 42"});
  r = Valid(2, 2, 2, DType::kBFloat16);
  for (v1::DType out : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    r.set_output_dtype(out);
    absl::StatusOr<ValidatedRequest> v = ValidateMultiplyRequest(r, {});
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->output_bytes, 4u * (out == v1::DTYPE_FLOAT32 ? 4 : 2));
  }
  r.set_output_dtype(v1::DTYPE_FLOAT64);
  ExpectInvalid(r, {"output_dtype", "DTYPE_FLOAT64 is not available for DTYPE_BFLOAT16"});
}

TEST(RequestValidationTest, Precision) {
  MultiplyRequest r = Valid();
  r.set_precision(static_cast<v1::Precision>(7));
  ExpectInvalid(r, {"precision", "unknown value 7"});
}

TEST(RequestValidationTest, AddendC) {
  MultiplyRequest r = Valid(3, 4, 5);
  r.set_beta(0.5);
  ExpectInvalid(r, {"c: required when beta is non-zero"});
  *r.mutable_c() = Valid(4, 3, 1).a();  // 4x1, wrong shape.
  ExpectInvalid(r, {"c: must be 3 x 4", "got 4 x 1"});
  *r.mutable_c() = Valid(3, 1, 4, DType::kFloat64).a();  // 3x4 float64.
  ExpectInvalid(r, {"c.dtype", "must be the output dtype (DTYPE_FLOAT32)"});
  *r.mutable_c() = Valid(3, 1, 4).a();  // 3x4 float32: right.
  absl::StatusOr<ValidatedRequest> v = ValidateMultiplyRequest(r, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->problem.c, r.c().data().data());
  EXPECT_EQ(v->problem.beta, 0.5);
  r.mutable_c()->mutable_data()->pop_back();
  ExpectInvalid(r, {"c.data", "expected 48 bytes"});
  // Beta unset: C is validated but not used.
  *r.mutable_c() = Valid(3, 1, 4).a();
  r.clear_beta();
  v = ValidateMultiplyRequest(r, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->problem.c, nullptr);
}

TEST(RequestValidationTest, ResultOverTheLimitIsResourceExhausted) {
  MultiplyRequest r = Valid(64, 64, 1);
  RequestLimits limits;
  limits.max_response_bytes = 64 * 64 * 4 - 1;
  absl::StatusOr<ValidatedRequest> v = ValidateMultiplyRequest(r, limits);
  ASSERT_EQ(v.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(v.status().message(), HasSubstr("16384 bytes"));
  limits.max_response_bytes = 1 << 20;
  limits.max_problem_bytes = 100;
  v = ValidateMultiplyRequest(r, limits);
  ASSERT_EQ(v.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(v.status().message(), HasSubstr("budget of 100 bytes"));
}

}  // namespace
}  // namespace matmul::server
