// RunCopies: every byte of every job lands where it should, nothing around
// it is touched, on the calling thread alone and spread over pool tasks
// (including tasks that start after the call has returned).
#include "kernels/cuda/parallel_copy.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace matmul::cuda {
namespace {

// A job over its own source and destination buffers, with what the
// destination must hold afterwards.
struct Case {
  std::vector<uint8_t> src, dst, want;
  CopyJob job;
};

// `count` jobs of random shapes: contiguous ones, pitched ones whose rows
// leave a gap on both sides, single rows, empty ones. The destination
// starts as random bytes, which must survive outside the copied rows.
std::vector<Case> RandomCases(std::mt19937_64& rng, int count) {
  std::uniform_int_distribution<size_t> row_bytes(1, 3000), rows(0, 400), gap(0, 64);
  std::uniform_int_distribution<int> byte(0, 255), kind(0, 3);
  std::vector<Case> cases(count);
  for (Case& c : cases) {
    const int k = kind(rng);
    const size_t w = row_bytes(rng);
    const size_t r = k == 2 ? 1 : rows(rng);
    const size_t src_pitch = k == 0 || k == 2 ? w : w + gap(rng);
    const size_t dst_pitch = k == 0 || k == 2 ? w : w + gap(rng);
    c.src.resize(src_pitch * r + 1);
    c.dst.resize(dst_pitch * r + 1);
    for (uint8_t& b : c.src) b = static_cast<uint8_t>(byte(rng));
    for (uint8_t& b : c.dst) b = static_cast<uint8_t>(byte(rng));
    c.want = c.dst;
    for (size_t i = 0; i < r; ++i) {
      for (size_t j = 0; j < w; ++j) c.want[i * dst_pitch + j] = c.src[i * src_pitch + j];
    }
    c.job = {c.dst.data(), dst_pitch, c.src.data(), src_pitch, w, r};
  }
  return cases;
}

void ExpectCopied(const std::vector<Case>& cases) {
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(cases[i].dst, cases[i].want) << "job " << i << ": " << cases[i].job.rows
                                           << " rows of " << cases[i].job.row_bytes << " bytes";
  }
}

std::vector<CopyJob> Jobs(const std::vector<Case>& cases) {
  std::vector<CopyJob> jobs;
  for (const Case& c : cases) jobs.push_back(c.job);
  return jobs;
}

TEST(ParallelCopyTest, CopiesWithoutHelpers) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<Case> cases = RandomCases(rng, 20);
  CopyPolicy alone;
  alone.helpers = 0;
  RunCopies(Jobs(cases), alone);
  ExpectCopied(cases);
}

TEST(ParallelCopyTest, SpreadsPiecesOverPoolTasks) {
  std::mt19937_64 rng(std::random_device{}());
  for (int round = 0; round < 50; ++round) {
    std::vector<Case> cases = RandomCases(rng, 12);
    CopyPolicy spread;
    spread.parallel_bytes = 0;  // Always spread...
    spread.piece_bytes = 1 + rng() % 5000;  // ...in pieces smaller than most jobs.
    spread.helpers = 1 + static_cast<int>(rng() % 4);
    RunCopies(Jobs(cases), spread);
    ExpectCopied(cases);
  }
}

TEST(ParallelCopyTest, DefaultPolicyCopiesLargeBatches) {
  // Above the default threshold: spread on hosts of four cores or more.
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> src(3 << 20), dst(3 << 20, 0);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  RunCopies({{dst.data(), dst.size(), src.data(), src.size(), src.size(), 1}});
  EXPECT_EQ(dst, src);
}

TEST(ParallelCopyTest, EmptyJobListIsFine) {
  CopyPolicy spread;
  spread.parallel_bytes = 0;
  RunCopies({}, spread);
  RunCopies({});
}

}  // namespace
}  // namespace matmul::cuda
