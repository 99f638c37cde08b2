// The matrix store on its own, with two CPU engines standing in for two
// devices: placement, copies made on demand, budgets, owners, reservations.
#include "server/matrix_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "kernels/cpu/cpu_engine.h"

namespace matmul::server {
namespace {

using ::testing::HasSubstr;

std::string RandomBytes(size_t n) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() | 1);  // Never zero.
  return s;
}

class MatrixStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      auto engine = CpuEngine::Create({.index = i, .threads = 1});
      ASSERT_TRUE(engine.ok());
      engines_.push_back(*std::move(engine));
    }
  }
  std::unique_ptr<MatrixStore> MakeStore(MatrixStore::Options options) {
    auto store = MatrixStore::Create(options, {engines_[0].get(), engines_[1].get()}, nullptr);
    EXPECT_TRUE(store.ok()) << store.status();
    return *std::move(store);
  }
  std::vector<std::unique_ptr<Engine>> engines_;
};

TEST_F(MatrixStoreTest, NewMatricesGoToTheDeviceHoldingLeast) {
  auto store = MakeStore({});
  const std::string big = RandomBytes(64 * 64 * 4), small = RandomBytes(8 * 8 * 4);
  absl::StatusOr<v1::MatrixHandle> a = store->Put("x", 64, 64, DType::kFloat32, big.data(), {});
  absl::StatusOr<v1::MatrixHandle> b = store->Put("x", 8, 8, DType::kFloat32, small.data(), {});
  absl::StatusOr<v1::MatrixHandle> c = store->Put("x", 8, 8, DType::kFloat32, small.data(), {});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->device(), "cpu:0");
  EXPECT_EQ(b->device(), "cpu:1");
  EXPECT_EQ(c->device(), "cpu:1");
  EXPECT_NE(a->id(), b->id());
}

TEST_F(MatrixStoreTest, ABatchOnAnotherDeviceCopiesTheOperandThereOnceAndIsCorrect) {
  auto store = MakeStore({});
  // B (4 x 3 float32) kept on cpu:0; A inline.
  const std::vector<float> b = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  absl::StatusOr<v1::MatrixHandle> h = store->Put("x", 4, 3, DType::kFloat32, b.data(), {});
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->device(), "cpu:0");
  absl::StatusOr<std::shared_ptr<StoredMatrix>> kept = store->Find("x", h->id());
  ASSERT_TRUE(kept.ok());
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<std::unique_ptr<ResidentOperands>> operands =
        store->Bind("x", nullptr, *kept, nullptr, false, 2, 3, DType::kFloat32, {}, nullptr);
    ASSERT_TRUE(operands.ok());
    EXPECT_EQ((*operands)->BytesOn(0), 48u);
    EXPECT_EQ((*operands)->BytesOn(1), round == 0 ? 0u : 48u);  // The copy stays.
    const std::vector<float> a = {1, 0, 2, 0, 0, 1, 0, -1};  // 2 x 4.
    std::vector<float> d(6, -99);
    GemmProblem p;
    p.m = 2;
    p.n = 3;
    p.k = 4;
    p.a = a.data();
    p.d = d.data();
    ASSERT_TRUE((*operands)->Bind(1, *engines_[1], p).ok());
    ASSERT_NE(p.b_resident, nullptr);
    absl::Status s;
    engines_[1]->Run({p}, absl::MakeSpan(&s, 1));
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE((*operands)->Complete(s).ok());
    // Row 0 = B0 + 2 B2; row 1 = B1 - B3.
    EXPECT_EQ(d, (std::vector<float>{15, 18, 21, -6, -6, -6}));
  }
}

TEST_F(MatrixStoreTest, BudgetsAreKeptPerStoreAndPerClient) {
  auto store = MakeStore({.max_bytes = 1000, .max_bytes_per_client = 600});
  const std::string m = RandomBytes(400);
  EXPECT_TRUE(store->Put("alice", 10, 10, DType::kFloat32, m.data(), {}).ok());
  absl::StatusOr<v1::MatrixHandle> over = store->Put("alice", 10, 10, DType::kFloat32, m.data(), {});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("400 bytes needed, 400 of 600"));
  EXPECT_TRUE(store->Put("bob", 10, 10, DType::kFloat32, m.data(), {}).ok());
  over = store->Put("carol", 10, 10, DType::kFloat32, m.data(), {});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("400 bytes needed, 800 of 1000"));
  EXPECT_EQ(store->bytes_in_use(), 800u);
}

// A CPU engine that says it pads each row of a kept matrix to 16 bytes, as
// the CUDA engine does.
class RowPaddingEngine final : public Engine {
 public:
  explicit RowPaddingEngine(std::unique_ptr<Engine> inner) : inner_(std::move(inner)) {}
  const DeviceDescription& Device() const override { return inner_->Device(); }
  absl::string_view Name() const override { return inner_->Name(); }
  void Run(absl::Span<const GemmProblem> problems, absl::Span<absl::Status> status) override {
    inner_->Run(problems, status);
  }
  uint64_t ResidentFootprint(int64_t rows, int64_t cols, DType dtype) const override {
    const uint64_t row = static_cast<uint64_t>(cols) * ElementSize(dtype);
    return static_cast<uint64_t>(rows) * ((row + 15) / 16 * 16);
  }

 private:
  std::unique_ptr<Engine> inner_;
};

TEST_F(MatrixStoreTest, BudgetsCountTheMemoryTheEnginesWouldHold) {
  // One device that pads rows to 16 bytes, one that does not: a 100 x 1
  // float32 column (400 dense bytes) counts 1600 everywhere, so that the
  // budget bounds what any device holds.
  RowPaddingEngine padded(std::move(engines_[1]));
  auto made = MatrixStore::Create({.max_bytes = 2000}, {engines_[0].get(), &padded}, nullptr);
  ASSERT_TRUE(made.ok()) << made.status();
  MatrixStore& store = **made;
  EXPECT_EQ(store.BudgetBytes(100, 1, DType::kFloat32), 1600u);
  EXPECT_EQ(store.BudgetBytes(4, 8, DType::kFloat32), 128u);  // 32-byte rows: no padding.
  const std::string column = RandomBytes(400);
  absl::StatusOr<v1::MatrixHandle> kept = store.Put("x", 100, 1, DType::kFloat32, column.data(), {});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->bytes(), 400u);  // The handle tells the dense size.
  EXPECT_EQ(store.bytes_in_use(), 1600u);
  absl::StatusOr<v1::MatrixHandle> over = store.Put("x", 100, 1, DType::kFloat32, column.data(), {});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("1600 bytes needed, 1600 of 2000"));
  {
    // A kept result reserves its padded size too.
    v1::MatrixHandle handle;
    absl::StatusOr<std::unique_ptr<ResidentOperands>> operands =
        store.Bind("x", nullptr, nullptr, nullptr, true, 10, 1, DType::kFloat32, absl::Hours(1),
                   &handle);
    ASSERT_TRUE(operands.ok()) << operands.status();
    EXPECT_EQ(store.bytes_in_use(), 1760u);
  }
  EXPECT_EQ(store.bytes_in_use(), 1600u);
  ASSERT_TRUE(store.Delete("x", kept->id()).ok());
  EXPECT_EQ(store.bytes_in_use(), 0u);
}

TEST_F(MatrixStoreTest, AKeptResultIsReservedUpFrontAndReleasedWhenItNeverRuns) {
  auto store = MakeStore({.max_bytes = 1000});
  v1::MatrixHandle handle;
  {
    absl::StatusOr<std::unique_ptr<ResidentOperands>> operands =
        store->Bind("x", nullptr, nullptr, nullptr, true, 10, 20, DType::kFloat32, absl::Hours(1),
                    &handle);
    ASSERT_TRUE(operands.ok());
    EXPECT_EQ(store->bytes_in_use(), 800u);
    EXPECT_EQ(store->Bind("x", nullptr, nullptr, nullptr, true, 10, 20, DType::kFloat32,
                          absl::Hours(1), &handle)
                  .status()
                  .code(),
              absl::StatusCode::kResourceExhausted);
  }  // Dropped without running (cancelled, expired in the queue).
  EXPECT_EQ(store->bytes_in_use(), 0u);
  EXPECT_TRUE(handle.id().empty());
}

TEST_F(MatrixStoreTest, OwnersAreEnforcedWhenAsked) {
  auto store = MakeStore({.enforce_owner = true});
  const std::string m = RandomBytes(16);
  absl::StatusOr<v1::MatrixHandle> h = store->Put("alice", 2, 2, DType::kFloat32, m.data(), {});
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(store->Find("alice", h->id()).ok());
  EXPECT_EQ(store->Find("bob", h->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Delete("bob", h->id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->List("bob").size(), 0u);
  EXPECT_EQ(store->List("alice").size(), 1u);
  EXPECT_TRUE(store->Delete("alice", h->id()).ok());
}

TEST_F(MatrixStoreTest, ConcurrentPutsUsesCopiesDeletesAndExpiriesStayConsistent) {
  // Threads store, use on both devices, delete and let expire, while the
  // sweeper runs; the budget must come back to zero and nothing may crash
  // (run under ThreadSanitizer by tests/sanitizers/run.sh thread).
  auto store = MakeStore({.max_bytes = 1 << 20});
  std::vector<std::thread> threads;
  std::atomic<int> used{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      const std::string bytes = RandomBytes(16 * 16 * 4);
      for (int i = 0; i < 60; ++i) {
        absl::StatusOr<v1::MatrixHandle> h =
            store->Put("owner", 16, 16, DType::kFloat32, bytes.data(),
                       i % 3 == 0 ? absl::Milliseconds(1 + rng() % 20) : absl::ZeroDuration());
        if (!h.ok()) continue;  // Full for a moment.
        absl::StatusOr<std::shared_ptr<StoredMatrix>> m = store->Find("owner", h->id());
        if (!m.ok()) continue;  // Expired already.
        absl::StatusOr<std::unique_ptr<ResidentOperands>> operands =
            store->Bind("owner", nullptr, *m, nullptr, false, 1, 16, DType::kFloat32, {}, nullptr);
        if (!operands.ok()) continue;
        GemmProblem p;
        const int device = static_cast<int>(rng() % 2);
        if ((*operands)->Bind(device, *engines_[device], p).ok() && p.b_resident != nullptr) ++used;
        (void)(*operands)->Complete(absl::OkStatus());
        if (i % 2 == 0) (void)store->Delete("owner", h->id());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(used.load(), 0);
  for (const v1::MatrixHandle& h : store->List("owner")) (void)store->Delete("owner", h.id());
  // Expired ones are swept within a second.
  while (store->bytes_in_use() != 0) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(store->List("owner").size(), 0u);
}

TEST_F(MatrixStoreTest, TtlsAreCheckedAgainstTheMaximum) {
  auto store = MakeStore({.default_ttl = absl::Seconds(10), .max_ttl = absl::Seconds(100)});
  EXPECT_EQ(*store->TtlFor(0, "ttl"), absl::Seconds(10));
  EXPECT_EQ(*store->TtlFor(100, "ttl"), absl::Seconds(100));
  EXPECT_EQ(store->TtlFor(101, "ttl").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(MatrixStore::Create({.default_ttl = absl::ZeroDuration()}, {engines_[0].get()}, nullptr).ok());
}

}  // namespace
}  // namespace matmul::server
