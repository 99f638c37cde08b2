// The CUDA engine (staging, pool, chunking, concurrency) on a real GPU
// against the float64 reference. Without a GPU every test skips with a
// message.
#include "kernels/cuda/cuda_engine.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace matmul {
namespace {

// A host problem plus its output buffer.
struct Owned {
  std::vector<uint8_t> a, b, c, d;
  GemmProblem p;
};

Owned MakeOwned(int64_t m, int64_t n, int64_t k, DType in, DType out, std::mt19937_64& rng,
                bool ta = false, bool tb = false, double beta = 0.0,
                Precision precision = Precision::kDefault) {
  Owned o;
  o.a = RandomMatrix(in, m * k, rng);
  o.b = RandomMatrix(in, k * n, rng);
  if (beta != 0.0) o.c = RandomMatrix(out, m * n, rng);
  o.d.assign(m * n * ElementSize(out), 0xff);
  o.p.input_type = in;
  o.p.output_type = out;
  o.p.precision = precision;
  o.p.m = m;
  o.p.n = n;
  o.p.k = k;
  o.p.transpose_a = ta;
  o.p.transpose_b = tb;
  o.p.alpha = 0.75;
  o.p.beta = beta;
  o.p.a = o.a.data();
  o.p.b = o.b.data();
  o.p.c = beta != 0.0 ? o.c.data() : nullptr;
  o.p.d = o.d.data();
  return o;
}

void ExpectCorrect(const Owned& o, const std::string& what) {
  const double err = RelativeError(ReferenceGemm(o.p), o.d.data(), o.p.output_type);
  EXPECT_LE(err, ErrorBound(o.p.input_type, o.p.output_type, o.p.precision)) << what;
}

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MATMUL_REQUIRE_GPU();
    CudaEngineOptions options;
    options.devices = {0};
    options.memory_fraction = 0.1;
    auto set = CreateCudaEngines(options);
    ASSERT_TRUE(set.ok()) << set.status();
    for (const std::string& note : set->notes) std::printf("note: %s\n", note.c_str());
    engine_ = std::move(set->engines.front());
  }
  std::mt19937_64 rng_{std::random_device{}()};
  std::unique_ptr<Engine> engine_;
};

TEST_F(CudaEngineTest, DescribesTheDevice) {
  const DeviceDescription& d = engine_->Device();
  EXPECT_EQ(d.id, "cuda:0");
  EXPECT_EQ(d.kind, "cuda");
  EXPECT_GT(d.memory_bytes, 0u);
  EXPECT_GT(d.compute_units, 0u);
  EXPECT_FALSE(d.compute_capability.empty());
  EXPECT_TRUE(engine_->Healthy());
  EXPECT_GT(engine_->Stats().memory_capacity_bytes, 0u);
}

TEST_F(CudaEngineTest, MixedBatchOfEveryDTypeOddShapesAndTransposes) {
  std::vector<Owned> owned;
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1}, {1, 4097, 3}, {333, 1, 777},
                                                      {129, 65, 257}, {512, 384, 256}};
  for (auto [in, out, precision] :
       {std::tuple{DType::kBFloat16, DType::kBFloat16, Precision::kDefault},
        std::tuple{DType::kBFloat16, DType::kFloat32, Precision::kDefault},
        std::tuple{DType::kFloat16, DType::kFloat16, Precision::kDefault},
        std::tuple{DType::kFloat32, DType::kFloat32, Precision::kTF32},
        std::tuple{DType::kFloat32, DType::kFloat32, Precision::kDefault},
        std::tuple{DType::kFloat64, DType::kFloat64, Precision::kDefault}}) {
    for (const auto& s : shapes) {
      for (int v = 0; v < 4; ++v) {
        owned.push_back(MakeOwned(s[0], s[1], s[2], in, out, rng_, v & 1, v & 2,
                                  v == 3 ? -0.5 : 0.0, precision));
      }
    }
  }
  std::vector<GemmProblem> problems;
  for (auto& o : owned) problems.push_back(o.p);
  std::vector<absl::Status> status(problems.size());
  engine_->Run(problems, absl::MakeSpan(status));
  for (size_t i = 0; i < owned.size(); ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i];
    ExpectCorrect(owned[i], absl::StrCat("problem ", i));
  }
  EXPECT_EQ(engine_->Stats().memory_in_use_bytes, 0u);
}

TEST_F(CudaEngineTest, ConcurrentCallersEachGetTheirOwnResults) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t + std::random_device{}());
      for (int rep = 0; rep < 10; ++rep) {
        std::vector<Owned> owned;
        for (int i = 0; i < 8; ++i) {
          owned.push_back(MakeOwned(1 + rng() % 300, 1 + rng() % 300, 1 + rng() % 300,
                                    DType::kBFloat16, DType::kBFloat16, rng));
        }
        std::vector<GemmProblem> problems;
        for (auto& o : owned) problems.push_back(o.p);
        std::vector<absl::Status> status(problems.size());
        engine_->Run(problems, absl::MakeSpan(status));
        for (size_t i = 0; i < owned.size(); ++i) {
          const double err = RelativeError(ReferenceGemm(owned[i].p), owned[i].d.data(),
                                           DType::kBFloat16);
          if (!status[i].ok() || !(err <= 1e-2)) failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(CudaEngineTest, ProblemLargerThanThePoolIsResourceExhausted) {
  const uint64_t capacity = engine_->Stats().memory_capacity_bytes;
  // A float32 problem whose operands alone exceed the pool; only sizes are
  // read before the refusal, so tiny host buffers are enough.
  const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(capacity) / 4)) + 1024;
  std::vector<uint8_t> dummy(16);
  GemmProblem p;
  p.input_type = p.output_type = DType::kFloat32;
  p.m = p.n = p.k = side;
  p.a = p.b = dummy.data();
  p.d = dummy.data();
  Owned small = MakeOwned(32, 32, 32, DType::kFloat32, DType::kFloat32, rng_);
  std::vector<GemmProblem> problems = {p, small.p};
  std::vector<absl::Status> status(2);
  engine_->Run(problems, absl::MakeSpan(status));
  EXPECT_EQ(status[0].code(), absl::StatusCode::kResourceExhausted) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  ExpectCorrect(small, "small companion");
  EXPECT_TRUE(engine_->Healthy());
}

TEST_F(CudaEngineTest, BatchLargerThanHalfThePoolIsSplitAndStillCorrect) {
  const uint64_t capacity = engine_->Stats().memory_capacity_bytes;
  // Each problem takes about a fifth of the pool: several chunks.
  const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(capacity) / 5 / 6));
  std::vector<Owned> owned;
  for (int i = 0; i < 4; ++i) {
    owned.push_back(MakeOwned(side, side, 8, DType::kBFloat16, DType::kBFloat16, rng_));
  }
  std::vector<GemmProblem> problems;
  for (auto& o : owned) problems.push_back(o.p);
  std::vector<absl::Status> status(problems.size());
  engine_->Run(problems, absl::MakeSpan(status));
  for (size_t i = 0; i < owned.size(); ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i];
    ExpectCorrect(owned[i], absl::StrCat("chunked problem ", i));
  }
}

}  // namespace
}  // namespace matmul
