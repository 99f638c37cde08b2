// The host buffer pool: size classes, reuse, its budget, and the heap
// fallback, with counting stand-ins for cudaHostAlloc / cudaFreeHost.
#include "kernels/host_buffer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "tests/util/test_util.h"

namespace matmul {
namespace {

using matmul::testing::Rng;

std::atomic<int> pins{0};
std::atomic<int> unpins{0};
std::atomic<bool> pin_fails{false};

void* Pin(size_t bytes) {
  if (pin_fails.load()) return nullptr;
  ++pins;
  return std::malloc(bytes);
}
void Unpin(void* p) {
  ++unpins;
  std::free(p);
}

class HostBufferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pins = 0;
    unpins = 0;
    pin_fails = false;
  }
};

TEST_F(HostBufferTest, ClassBytesRoundsUpByAtMostAQuarter) {
  for (int i = 0; i < 10000; ++i) {
    const size_t bytes = 1 + Rng()() % (size_t{1} << (1 + Rng()() % 34));
    const size_t c = HostBufferPool::ClassBytes(bytes);
    ASSERT_GE(c, bytes);
    ASSERT_LE(c, std::max<size_t>(4096, bytes + bytes / 4 + 1)) << bytes;
    ASSERT_EQ(HostBufferPool::ClassBytes(c), c) << "a class is its own class";
  }
  EXPECT_EQ(HostBufferPool::ClassBytes(1 << 20), size_t{1} << 20);
  EXPECT_EQ(HostBufferPool::ClassBytes((1 << 20) + 1), (size_t{1} << 20) + (1 << 18));
}

TEST_F(HostBufferTest, SmallRequestsComeFromTheHeap) {
  HostBufferPool pool(&Pin, &Unpin, 1 << 30, 64 << 10);
  HostBuffer small = HostBuffer::Allocate(&pool, (64 << 10) - 1);
  ASSERT_NE(small.data(), nullptr);
  EXPECT_FALSE(small.pinned());
  EXPECT_EQ(small.size(), (64u << 10) - 1);
  HostBuffer big = HostBuffer::Allocate(&pool, 64 << 10);
  EXPECT_TRUE(big.pinned());
  EXPECT_EQ(pins.load(), 1);
  EXPECT_EQ(pool.GetStats().heap_allocations, 1u);
  EXPECT_EQ(pool.GetStats().pinned_allocations, 1u);
  HostBuffer none = HostBuffer::Allocate(nullptr, 1 << 20);
  ASSERT_NE(none.data(), nullptr);
  EXPECT_FALSE(none.pinned());
}

TEST_F(HostBufferTest, FreedBuffersAreReusedNotRepinned) {
  HostBufferPool pool(&Pin, &Unpin, 1 << 30);
  const size_t bytes = (1 << 20) + Rng()() % 100000;
  void* first;
  {
    HostBuffer b = HostBuffer::Allocate(&pool, bytes);
    ASSERT_TRUE(b.pinned());
    first = b.data();
    // All of it is writable.
    std::memset(b.data(), 0x5a, b.size());
    EXPECT_EQ(pool.GetStats().in_use_bytes, HostBufferPool::ClassBytes(bytes));
  }
  EXPECT_EQ(pool.GetStats().in_use_bytes, 0u);
  for (int i = 0; i < 50; ++i) {
    // Any size of the same class takes the cached buffer. (A size up to
    // 1000 bytes smaller can fall in the class below when `bytes` lies just
    // above a class boundary: about one run in a hundred did.)
    size_t smaller;
    do {
      smaller = bytes - Rng()() % 1000;
    } while (HostBufferPool::ClassBytes(smaller) != HostBufferPool::ClassBytes(bytes));
    HostBuffer b = HostBuffer::Allocate(&pool, smaller);
    EXPECT_EQ(b.data(), first) << smaller << " bytes after " << bytes;
  }
  EXPECT_EQ(pins.load(), 1);
  EXPECT_EQ(unpins.load(), 0);
}

TEST_F(HostBufferTest, BudgetSpentFallsBackToHeapAndCachedBuffersMakeRoom) {
  const size_t mib = 1 << 20;
  HostBufferPool pool(&Pin, &Unpin, 4 * mib);
  std::vector<HostBuffer> held;
  for (int i = 0; i < 4; ++i) held.push_back(HostBuffer::Allocate(&pool, mib));
  for (const HostBuffer& b : held) EXPECT_TRUE(b.pinned());
  HostBuffer over = HostBuffer::Allocate(&pool, mib);
  ASSERT_NE(over.data(), nullptr);
  EXPECT_FALSE(over.pinned()) << "the budget is spent: heap memory, marked so";
  EXPECT_EQ(pool.GetStats().pinned_bytes, 4 * mib);
  // Freed 1 MiB buffers stay cached; a 2 MiB request unpins two of them.
  held.clear();
  EXPECT_EQ(pool.GetStats().in_use_bytes, 0u);
  EXPECT_EQ(pool.GetStats().pinned_bytes, 4 * mib);
  HostBuffer two = HostBuffer::Allocate(&pool, 2 * mib);
  EXPECT_TRUE(two.pinned());
  EXPECT_EQ(unpins.load(), 2);
  EXPECT_EQ(pool.GetStats().pinned_bytes, 4 * mib);
  // Larger than the whole budget: heap.
  HostBuffer huge = HostBuffer::Allocate(&pool, 5 * mib);
  EXPECT_FALSE(huge.pinned());
}

TEST_F(HostBufferTest, FailedPinningFallsBackToHeap) {
  HostBufferPool pool(&Pin, &Unpin, 1 << 30);
  pin_fails = true;
  HostBuffer b = HostBuffer::Allocate(&pool, 1 << 20);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_FALSE(b.pinned());
  EXPECT_EQ(pool.GetStats().pinned_bytes, 0u);
  EXPECT_EQ(pool.GetStats().in_use_bytes, 0u);
}

TEST_F(HostBufferTest, TokensFreeFromOtherThreads) {
  HostBufferPool pool(&Pin, &Unpin, 1 << 30);
  std::vector<void*> tokens;
  std::set<void*> distinct;
  for (int i = 0; i < 64; ++i) {
    HostBuffer b = HostBuffer::Allocate(&pool, (i % 2 ? 1 : 3) << 17);
    distinct.insert(b.data());
    tokens.push_back(b.ReleaseToken());
    EXPECT_EQ(b.data(), nullptr);
  }
  EXPECT_EQ(distinct.size(), 64u) << "buffers in use are never handed out twice";
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < tokens.size(); i += 4) HostBuffer::FreeToken(tokens[i]);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(pool.GetStats().in_use_bytes, 0u);
  HostBuffer::FreeToken(nullptr);  // Harmless.
}

TEST_F(HostBufferTest, MoveHandsOwnershipOver) {
  HostBufferPool pool(&Pin, &Unpin, 1 << 30);
  HostBuffer a = HostBuffer::Allocate(&pool, 1 << 20);
  void* p = a.data();
  HostBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), p);
  EXPECT_TRUE(b.pinned());
  b = HostBuffer();
  EXPECT_EQ(pool.GetStats().in_use_bytes, 0u);
}

}  // namespace
}  // namespace matmul
