// The CUDA engine (staging, pool, chunking, concurrency) on a real GPU
// against the float64 reference. Without a GPU every test skips with a
// message.
#include "kernels/cuda/cuda_engine.h"

#include <gtest/gtest.h>

#include <cstring>
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
  const double err = GemmRelativeError(o.p, o.d.data());
  EXPECT_LE(err, ErrorBound(o.p.input_type, o.p.output_type, o.p.precision)) << what;
}

// Option checks come before the GPU probe: these run on any machine.
TEST(CudaEngineOptionsTest, BadOptionsAreInvalidArgumentWithOrWithoutAGpu) {
  CudaEngineOptions options;
  options.host_wait = "sleepy";
  absl::StatusOr<CudaEngineSet> set = CreateCudaEngines(options);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("auto, spin, yield or block"), absl::string_view::npos)
      << set.status();
  options.host_wait = "block";
  options.kernels = "fastest";
  set = CreateCudaEngines(options);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("\"fastest\""), absl::string_view::npos) << set.status();
  options.kernels = "persistent";
  options.resident_row_align = 48;
  set = CreateCudaEngines(options);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("16, 32, 64 or 128"), absl::string_view::npos)
      << set.status();
  options.resident_row_align = 32;
  options.memory_fraction = 0.99;
  set = CreateCudaEngines(options);
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("gpu_memory_fraction"), absl::string_view::npos)
      << set.status();
}

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MATMUL_REQUIRE_GPU();
    CudaEngineOptions options;
    options.devices = {0};
    options.memory_fraction = 0.1;
    options.resident_bytes = 512ull << 20;
    // Long resident rows on 128-byte lines (the default, 32-byte sectors,
    // is what every other resident path in the tests and the server uses).
    options.resident_row_align = 128;
    options.pinned_host_bytes = 1ull << 30;
    // Small enough that the pinned test's operands of tens of KiB get it.
    options.pinned_min_bytes = 16 << 10;
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

TEST_F(CudaEngineTest, ResidentOperandsAndResultsMatchTheReference) {
  // Every combination of resident A, B, C and D, odd widths (rows padded on
  // the device: short rows to 16 bytes, rows of 1 KiB or more to 128 here),
  // transposes, beta with C inline or resident.
  int checked = 0;
  for (auto [in, out, precision] :
       {std::tuple{DType::kBFloat16, DType::kBFloat16, Precision::kDefault},
        std::tuple{DType::kFloat16, DType::kFloat32, Precision::kDefault},
        std::tuple{DType::kFloat32, DType::kFloat32, Precision::kTF32},
        std::tuple{DType::kFloat32, DType::kFloat32, Precision::kDefault},
        std::tuple{DType::kFloat64, DType::kFloat64, Precision::kDefault}}) {
    std::vector<Owned> owned;
    std::vector<std::unique_ptr<ResidentMatrix>> kept;
    std::vector<GemmProblem> problems;
    std::vector<ResidentMatrix*> results;
    for (int shape = 0; shape < 32; ++shape) {
      const int mask = shape % 16, v = mask % 4;
      const bool long_rows = shape >= 16;
      Owned o = MakeOwned(67 + mask, (long_rows ? 517 : 129) + 2 * mask, long_rows ? 525 : 95, in,
                          out, rng_, v & 1, v & 2, mask % 3 == 0 ? 0.5 : 0.0, precision);
      GemmProblem p = o.p;
      auto make = [&](const std::vector<uint8_t>& host, int64_t rows, int64_t cols, DType t) {
        absl::StatusOr<std::unique_ptr<ResidentMatrix>> r =
            engine_->CreateResident(rows, cols, t, host.empty() ? nullptr : host.data());
        EXPECT_TRUE(r.ok()) << r.status();
        kept.push_back(*std::move(r));
        return kept.back().get();
      };
      if (mask & 1) p.a_resident = make(o.a, p.transpose_a ? p.k : p.m, p.transpose_a ? p.m : p.k, in);
      if (mask & 2) p.b_resident = make(o.b, p.transpose_b ? p.n : p.k, p.transpose_b ? p.k : p.n, in);
      if ((mask & 4) && p.beta != 0.0) p.c_resident = make(o.c, p.m, p.n, out);
      ResidentMatrix* d = nullptr;
      if (mask & 8) {
        d = make({}, p.m, p.n, out);
        p.d_resident = d;
      }
      results.push_back(d);
      problems.push_back(p);
      owned.push_back(std::move(o));
    }
    std::vector<absl::Status> status(problems.size());
    engine_->Run(problems, absl::MakeSpan(status));
    for (size_t i = 0; i < owned.size(); ++i) {
      ASSERT_TRUE(status[i].ok()) << status[i];
      if (results[i] != nullptr) {
        ASSERT_TRUE(engine_->ReadResident(*results[i], owned[i].d.data()).ok());
      }
      ExpectCorrect(owned[i], absl::StrCat(DTypeName(in), " resident mask ", i % 16,
                                           i >= 16 ? " long rows" : ""));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 5 * 32);
  EXPECT_EQ(engine_->Stats().memory_in_use_bytes, 0u);
}

TEST_F(CudaEngineTest, PinnedHostOperandsAndResultsMatchTheReference) {
  // Operands and results in the engine's pinned buffers (as the server
  // parses them) go to and from the device without staging when their rows
  // need no padding; the others, and every unpinned one, are staged. Each
  // batch mixes both, so the staged ranges between direct copies are
  // exercised, with C inline (beta) into a host or resident D.
  HostBufferPool* pool = engine_->HostBuffers();
  ASSERT_NE(pool, nullptr) << "the CUDA engine offers pinned host buffers";
  int pinned = 0, checked = 0;
  for (auto [in, out, precision] :
       {std::tuple{DType::kBFloat16, DType::kBFloat16, Precision::kDefault},
        std::tuple{DType::kFloat16, DType::kFloat32, Precision::kDefault},
        std::tuple{DType::kFloat32, DType::kFloat32, Precision::kTF32},
        std::tuple{DType::kFloat64, DType::kFloat64, Precision::kDefault}}) {
    std::vector<Owned> owned;
    std::vector<HostBuffer> buffers;
    buffers.reserve(4 * 32);  // pinned_d points into it.
    std::vector<std::unique_ptr<ResidentMatrix>> kept;
    std::vector<GemmProblem> problems;
    std::vector<HostBuffer*> pinned_d(32, nullptr);
    for (int i = 0; i < 32; ++i) {
      const int mask = i % 16;
      // Widths that are multiples of 16 bytes go direct; +1 needs padding.
      const int64_t pad = (i / 16) == 1 ? 1 : 0;
      Owned o = MakeOwned(96 + i, 256 + pad, 128 + pad, in, out, rng_, mask & 1, (mask >> 1) & 1,
                          mask % 3 == 0 ? -1.25 : 0.0, precision);
      GemmProblem p = o.p;
      auto pin = [&](const std::vector<uint8_t>& host, uint32_t bit) -> void* {
        HostBuffer b = HostBuffer::Allocate(pool, host.size());
        EXPECT_NE(b.data(), nullptr);
        std::memcpy(b.data(), host.data(), host.size());
        if (b.pinned()) p.host_pinned |= bit;
        buffers.push_back(std::move(b));
        return buffers.back().data();
      };
      if (mask & 4) p.a = pin(o.a, kResidentA);
      if (mask & 8) p.b = pin(o.b, kResidentB);
      if (p.beta != 0.0 && (mask & 1)) p.c = pin(o.c, kResidentC);
      if (i % 5 == 4) {
        absl::StatusOr<std::unique_ptr<ResidentMatrix>> d =
            engine_->CreateResident(p.m, p.n, out, nullptr);
        ASSERT_TRUE(d.ok()) << d.status();
        p.d_resident = d->get();
        kept.push_back(*std::move(d));
      } else if (mask & 2) {
        HostBuffer b = HostBuffer::Allocate(pool, o.d.size());
        std::memset(b.data(), 0xff, b.size());  // Poison: every byte must be written.
        if (b.pinned()) p.host_pinned |= kResidentD;
        buffers.push_back(std::move(b));
        pinned_d[i] = &buffers.back();
        p.d = buffers.back().data();
      }
      pinned += p.host_pinned != 0;
      problems.push_back(p);
      owned.push_back(std::move(o));
    }
    std::vector<absl::Status> status(problems.size());
    engine_->Run(problems, absl::MakeSpan(status));
    for (size_t i = 0; i < owned.size(); ++i) {
      ASSERT_TRUE(status[i].ok()) << status[i];
      if (problems[i].d_resident != nullptr) {
        ASSERT_TRUE(engine_->ReadResident(*problems[i].d_resident, owned[i].d.data()).ok());
      } else if (pinned_d[i] != nullptr) {
        std::memcpy(owned[i].d.data(), pinned_d[i]->data(), owned[i].d.size());
      }
      ExpectCorrect(owned[i], absl::StrCat(DTypeName(in), " pinned case ", i, " bits ",
                                           problems[i].host_pinned));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * 32);
  EXPECT_GT(pinned, 60) << "the pool handed out pinned buffers";
  EXPECT_EQ(engine_->Stats().memory_in_use_bytes, 0u);
}

TEST_F(CudaEngineTest, ResidentMatricesRoundTripAndTheirPoolIsBounded) {
  const std::vector<uint8_t> host = RandomMatrix(DType::kBFloat16, 77 * 333, rng_);
  absl::StatusOr<std::unique_ptr<ResidentMatrix>> m =
      engine_->CreateResident(77, 333, DType::kBFloat16, host.data());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->bytes(), host.size());
  EXPECT_GE((*m)->footprint(), host.size());  // Rows padded to 16 bytes.
  std::vector<uint8_t> back(host.size());
  ASSERT_TRUE(engine_->ReadResident(**m, back.data()).ok());
  EXPECT_EQ(back, host);
  // Rows of 1 KiB or more start on resident_row_align (128 here): 1000
  // bf16 (2000 bytes) take 2048 a row.
  const std::vector<uint8_t> wide = RandomMatrix(DType::kBFloat16, 77 * 1000, rng_);
  absl::StatusOr<std::unique_ptr<ResidentMatrix>> w =
      engine_->CreateResident(77, 1000, DType::kBFloat16, wide.data());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->bytes(), wide.size());
  EXPECT_GE((*w)->footprint(), 77u * 2048);
  std::vector<uint8_t> wide_back(wide.size());
  ASSERT_TRUE(engine_->ReadResident(**w, wide_back.data()).ok());
  EXPECT_EQ(wide_back, wide);
  w->reset();
  EXPECT_GT(engine_->Stats().memory_in_use_bytes, 0u);
  // Larger than the resident pool: a clean RESOURCE_EXHAUSTED.
  absl::StatusOr<std::unique_ptr<ResidentMatrix>> huge =
      engine_->CreateResident(65536, 65536, DType::kFloat32, nullptr);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  m->reset();
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
