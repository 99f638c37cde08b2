#include "kernels/cpu/cpu_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/reference_gemm.h"

namespace matmul {
namespace {

struct Case {
  int64_t m, n, k;
  DType in, out;
  bool ta = false, tb = false;
  double alpha = 1, beta = 0;
  Precision precision = Precision::kDefault;
};

std::string Name(const Case& c) {
  return absl::StrCat(c.m, "x", c.n, "x", c.k, "_", DTypeName(c.in), "_to_", DTypeName(c.out),
                      c.ta ? "_ta" : "", c.tb ? "_tb" : "", "_alpha", c.alpha, "_beta", c.beta);
}

// Owns a problem's buffers.
struct Buffers {
  std::vector<uint8_t> a, b, c, d;
  GemmProblem problem;
};

Buffers MakeProblem(const Case& c, std::mt19937_64& rng) {
  Buffers buf;
  buf.a = RandomMatrix(c.in, c.m * c.k, rng);
  buf.b = RandomMatrix(c.in, c.k * c.n, rng);
  if (c.beta != 0) buf.c = RandomMatrix(c.out, c.m * c.n, rng);
  // Poison: every byte 0xff is a NaN in each format, so an unwritten element
  // fails the comparison.
  buf.d.assign(c.m * c.n * ElementSize(c.out), 0xff);
  GemmProblem& p = buf.problem;
  p.input_type = c.in;
  p.output_type = c.out;
  p.precision = c.precision;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.transpose_a = c.ta;
  p.transpose_b = c.tb;
  p.alpha = c.alpha;
  p.beta = c.beta;
  p.a = buf.a.data();
  p.b = buf.b.data();
  p.c = c.beta != 0 ? buf.c.data() : nullptr;
  p.d = buf.d.data();
  return buf;
}

class CpuEngineCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(CpuEngineCaseTest, MatchesFloat64Reference) {
  const Case& c = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  Buffers buf = MakeProblem(c, rng);
  ASSERT_TRUE(CpuEngine::RunOne(buf.problem).ok());
  const double err = GemmRelativeError(buf.problem, buf.d.data());
  EXPECT_LE(err, ErrorBound(c.in, c.out, c.precision)) << Name(c);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const DType kAll[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1}, {1, 4097, 3}, {333, 1, 777}, {17, 33, 5}, {64, 64, 64}, {100, 80, 1},
      {129, 65, 257}};
  for (DType in : kAll) {
    for (DType out : kAll) {
      if (!IsSupportedOutput(in, out)) continue;
      for (const auto& s : shapes) {
        for (int t = 0; t < 4; ++t) {
          cases.push_back({s[0], s[1], s[2], in, out, (t & 1) != 0, (t & 2) != 0});
        }
      }
      cases.push_back({48, 40, 56, in, out, false, true, -0.5, 0.75});
      cases.push_back({31, 7, 9, in, out, true, false, 2.0, -1.0});
    }
  }
  cases.push_back({1000, 1000, 1000, DType::kFloat32, DType::kFloat32});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuEngineCaseTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           std::string name = Name(info.param);
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

TEST(CpuEngineTest, RunsMixedBatchAndReportsEachProblem) {
  auto engine = CpuEngine::Create({});
  ASSERT_TRUE(engine.ok());
  std::mt19937_64 rng(std::random_device{}());
  std::vector<Buffers> buffers;
  for (const Case& c : {Case{3, 4, 5, DType::kBFloat16, DType::kFloat32},
                        Case{64, 1, 64, DType::kFloat64, DType::kFloat64},
                        Case{7, 9, 11, DType::kFloat16, DType::kFloat16, true, true, 1.5, 0.5}}) {
    buffers.push_back(MakeProblem(c, rng));
  }
  std::vector<GemmProblem> problems;
  for (auto& b : buffers) problems.push_back(b.problem);
  GemmProblem bad = problems[0];
  bad.output_type = DType::kFloat64;  // Not a valid output for bfloat16 inputs.
  problems.push_back(bad);
  std::vector<absl::Status> status(problems.size());
  (*engine)->Run(problems, absl::MakeSpan(status));
  for (size_t i = 0; i < buffers.size(); ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i];
    EXPECT_LE(RelativeError(ReferenceGemm(problems[i]), buffers[i].d.data(),
                            problems[i].output_type),
              ErrorBound(problems[i].input_type, problems[i].output_type, Precision::kDefault));
  }
  EXPECT_EQ(status.back().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->Device().id, "cpu:0");
  EXPECT_GT((*engine)->Device().compute_units, 0u);
}

TEST(CpuEngineTest, NaNAndInfinityPropagateAsIEEESays) {
  std::mt19937_64 rng(std::random_device{}());
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
    Buffers buf = MakeProblem({4, 3, 5, t, t}, rng);
    // A[1][2] = NaN: row 1 of D is NaN. A[3][0] = +inf with B[0][j] of
    // mixed signs: row 3 holds infinities (or NaN where inf - inf meets).
    const std::vector<double> a = ToDouble(buf.a.data(), t, 20);
    std::vector<double> poisoned = a;
    poisoned[1 * 5 + 2] = std::numeric_limits<double>::quiet_NaN();
    poisoned[3 * 5 + 0] = std::numeric_limits<double>::infinity();
    FromDouble(poisoned, t, buf.a.data());
    ASSERT_TRUE(CpuEngine::RunOne(buf.problem).ok());
    const std::vector<double> d = ToDouble(buf.d.data(), t, 12);
    for (int j = 0; j < 3; ++j) {
      EXPECT_TRUE(std::isnan(d[1 * 3 + j])) << DTypeName(t) << " col " << j;
      EXPECT_FALSE(std::isfinite(d[3 * 3 + j])) << DTypeName(t) << " col " << j;
      EXPECT_TRUE(std::isfinite(d[0 * 3 + j]));
      EXPECT_TRUE(std::isfinite(d[2 * 3 + j]));
    }
  }
}

// The engine keeps its widening buffers per thread between calls, without
// zeroing them: what one problem leaves there (here NaN everywhere) must
// never show in the next problem's result, for each 16-bit type and for
// beta zero (C not read) and nonzero.
TEST(CpuEngineTest, LeftoversOfOneProblemNeverReachTheNext) {
  std::mt19937_64 rng(std::random_device{}());
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    for (double beta : {0.0, 0.5}) {
      Buffers nan_problem = MakeProblem({33, 17, 9, t, t, false, false, 1.0, beta}, rng);
      const std::vector<double> nans(33 * 9, std::numeric_limits<double>::quiet_NaN());
      FromDouble(nans, t, nan_problem.a.data());
      ASSERT_TRUE(CpuEngine::RunOne(nan_problem.problem).ok());
      ASSERT_TRUE(std::isnan(ToDouble(nan_problem.d.data(), t, 1)[0]));
      // Smaller, same and larger than what is left in the buffers.
      for (const Case& c : {Case{5, 3, 2, t, t, false, false, 1.0, beta},
                            Case{33, 17, 9, t, t, false, false, 1.0, beta},
                            Case{40, 20, 12, t, t, true, false, 2.0, beta}}) {
        Buffers buf = MakeProblem(c, rng);
        ASSERT_TRUE(CpuEngine::RunOne(buf.problem).ok());
        EXPECT_LE(RelativeError(ReferenceGemm(buf.problem), buf.d.data(), t),
                  ErrorBound(t, t, Precision::kDefault))
            << Name(c);
      }
    }
  }
}

TEST(CpuEngineTest, HandlesUnalignedBuffers) {
  std::mt19937_64 rng(std::random_device{}());
  const Case c{5, 6, 7, DType::kFloat64, DType::kFloat64, false, false, 1.0, 1.0};
  Buffers buf = MakeProblem(c, rng);
  // Shift every operand by one byte.
  std::vector<uint8_t> a(buf.a.size() + 1), b(buf.b.size() + 1), cc(buf.c.size() + 1),
      d(buf.d.size() + 1, 0xff);
  std::memcpy(a.data() + 1, buf.a.data(), buf.a.size());
  std::memcpy(b.data() + 1, buf.b.data(), buf.b.size());
  std::memcpy(cc.data() + 1, buf.c.data(), buf.c.size());
  GemmProblem p = buf.problem;
  p.a = a.data() + 1;
  p.b = b.data() + 1;
  p.c = cc.data() + 1;
  p.d = d.data() + 1;
  ASSERT_TRUE(CpuEngine::RunOne(p).ok());
  EXPECT_LE(RelativeError(ReferenceGemm(buf.problem), d.data() + 1, DType::kFloat64), 1e-12);
}

}  // namespace
}  // namespace matmul
