// The batching policy, driven by a fake clock (explicit times).
#include "server/job_queue.h"

#include <gtest/gtest.h>

namespace matmul::server {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

std::unique_ptr<Job> MakeJob(uint64_t id, int32_t priority = 0, DType dtype = DType::kFloat32,
                             int64_t size = 8) {
  auto job = std::make_unique<Job>();
  job->id = id;
  job->priority = priority;
  job->problem.input_type = job->problem.output_type = dtype;
  job->problem.m = job->problem.n = job->problem.k = size;
  job->arrival = kT0;
  return job;
}

std::vector<uint64_t> Ids(const std::vector<std::unique_ptr<Job>>& jobs) {
  std::vector<uint64_t> ids;
  for (const auto& j : jobs) ids.push_back(j->id);
  return ids;
}

JobQueue::Options Opts(size_t batch = 4, absl::Duration delay = absl::Milliseconds(2)) {
  JobQueue::Options o;
  o.max_batch_size = batch;
  o.max_queue_delay = delay;
  o.max_batch_flops = 1e18;
  o.priority_aging = absl::ZeroDuration();
  return o;
}

void Push(JobQueue& q, std::unique_ptr<Job> job, absl::Time now = kT0) {
  ASSERT_TRUE(q.Push(job, now).ok());
}

TEST(JobQueueTest, DelayIsHonouredForAPartialBatch) {
  JobQueue q(Opts(4, absl::Milliseconds(2)));
  Push(q, MakeJob(1));
  Push(q, MakeJob(2), kT0 + absl::Milliseconds(1));
  EXPECT_EQ(q.NextEvent(), kT0 + absl::Milliseconds(2));
  EXPECT_TRUE(q.TakeBatch(kT0 + absl::Microseconds(1999), false).empty());
  EXPECT_EQ(Ids(q.TakeBatch(kT0 + absl::Milliseconds(2), false)),
            (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.NextEvent(), absl::InfiniteFuture());
}

TEST(JobQueueTest, ZeroDelayDispatchesAtOnce) {
  JobQueue q(Opts(4, absl::ZeroDuration()));
  Push(q, MakeJob(1));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{1}));
}

TEST(JobQueueTest, GapInArrivalsReleasesAPartialBatchEarly) {
  JobQueue::Options o = Opts(100, absl::Milliseconds(1));
  o.max_queue_gap = absl::Microseconds(50);
  JobQueue q(o);
  Push(q, MakeJob(1));
  Push(q, MakeJob(2), kT0 + absl::Microseconds(30));
  // The gap counts from the newest arrival, not the oldest.
  EXPECT_EQ(q.NextEvent(), kT0 + absl::Microseconds(80));
  EXPECT_TRUE(q.TakeBatch(kT0 + absl::Microseconds(79), false).empty());
  EXPECT_EQ(Ids(q.TakeBatch(kT0 + absl::Microseconds(80), false)),
            (std::vector<uint64_t>{1, 2}));
}

TEST(JobQueueTest, SteadyArrivalsWaitOutTheDelayDespiteAGap) {
  JobQueue::Options o = Opts(100, absl::Microseconds(500));
  o.max_queue_gap = absl::Microseconds(50);
  JobQueue q(o);
  // A job every 40 us: no gap of 50 us, so only the delay releases them.
  absl::Time now = kT0;
  uint64_t id = 1;
  for (; now < kT0 + absl::Microseconds(480); now += absl::Microseconds(40)) {
    Push(q, MakeJob(id++), now);
    EXPECT_TRUE(q.TakeBatch(now + absl::Microseconds(39), false).empty()) << now - kT0;
  }
  Push(q, MakeJob(id++), now);  // At 480 us: its gap would end at 530.
  EXPECT_EQ(q.NextEvent(), kT0 + absl::Microseconds(500));
  EXPECT_TRUE(q.TakeBatch(kT0 + absl::Microseconds(499), false).empty());
  EXPECT_EQ(q.TakeBatch(kT0 + absl::Microseconds(500), false).size(), id - 1);
}

TEST(JobQueueTest, FullBatchGoesWithoutWaiting) {
  JobQueue q(Opts(4, absl::Hours(1)));
  for (uint64_t id = 1; id <= 10; ++id) Push(q, MakeJob(id));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{5, 6, 7, 8}));
  EXPECT_TRUE(q.TakeBatch(kT0, false).empty());  // Two left: wait for companions.
  EXPECT_EQ(Ids(q.TakeBatch(kT0, true)), (std::vector<uint64_t>{9, 10}));  // Flush.
}

TEST(JobQueueTest, WorkBudgetSplitsBatchesAndBigJobsRunAlone) {
  JobQueue::Options o = Opts(100, absl::Hours(1));
  o.max_batch_flops = 3 * 2.0 * 8 * 8 * 8;  // Three 8^3 problems.
  JobQueue q(o);
  Push(q, MakeJob(1, 0, DType::kFloat32, 1000));  // Far over the budget alone.
  for (uint64_t id = 2; id <= 6; ++id) Push(q, MakeJob(id));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{1}));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_TRUE(q.TakeBatch(kT0, false).empty());
  EXPECT_EQ(Ids(q.TakeBatch(kT0, true)), (std::vector<uint64_t>{5, 6}));
}

TEST(JobQueueTest, ByteBudgetSplitsBatches) {
  JobQueue::Options o = Opts(100, absl::Hours(1));
  o.max_batch_bytes = 2 * 3 * 8 * 8 * 4;  // Two 8x8x8 float32 jobs (A, B, D).
  JobQueue q(o);
  for (uint64_t id = 1; id <= 5; ++id) Push(q, MakeJob(id));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{3, 4}));
  EXPECT_TRUE(q.TakeBatch(kT0, false).empty());
  EXPECT_EQ(Ids(q.TakeBatch(kT0, true)), (std::vector<uint64_t>{5}));
}

TEST(JobQueueTest, BatchesNeverMixDTypesOrPrecisions) {
  JobQueue q(Opts(10, absl::ZeroDuration()));
  Push(q, MakeJob(1, 0, DType::kFloat32));
  Push(q, MakeJob(2, 0, DType::kBFloat16));
  Push(q, MakeJob(3, 0, DType::kFloat32));
  auto tf32 = MakeJob(4, 0, DType::kFloat32);
  tf32->problem.precision = Precision::kTF32;
  Push(q, std::move(tf32));
  auto bf16_out32 = MakeJob(5, 0, DType::kBFloat16);
  bf16_out32->problem.output_type = DType::kFloat32;
  Push(q, std::move(bf16_out32));
  auto bf16_tf32 = MakeJob(6, 0, DType::kBFloat16);  // Precision is moot for bf16.
  bf16_tf32->problem.precision = Precision::kTF32;
  Push(q, std::move(bf16_tf32));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{2, 6}));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{4}));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{5}));
  EXPECT_TRUE(q.empty());
}

TEST(JobQueueTest, HigherPriorityFirstFifoWithinALevel) {
  JobQueue q(Opts(2, absl::ZeroDuration()));
  Push(q, MakeJob(1, 0));
  Push(q, MakeJob(2, 5));
  Push(q, MakeJob(3, 0));
  Push(q, MakeJob(4, 5));
  Push(q, MakeJob(5, -3));
  Push(q, MakeJob(6, 9));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{6, 2}));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{4, 1}));
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{3, 5}));
}

TEST(JobQueueTest, AgingLetsAStarvingLowPriorityLead) {
  JobQueue::Options o = Opts(1, absl::ZeroDuration());
  o.priority_aging = absl::Milliseconds(10);
  JobQueue q(o);
  Push(q, MakeJob(1, 0), kT0);
  // A steady stream of priority-3 jobs, each arriving just before the next batch.
  for (int step = 1; step <= 2; ++step) {
    const absl::Time now = kT0 + absl::Milliseconds(10) * step;
    Push(q, MakeJob(100 + step, 3), now);
    auto batch = q.TakeBatch(now, false);
    ASSERT_EQ(batch.size(), 1u);
    EXPECT_EQ(batch[0]->id, static_cast<uint64_t>(100 + step)) << "step " << step;
  }
  // After 30 ms the old job has gained 3 levels: a tie with the new one,
  // which the older job wins.
  const absl::Time now = kT0 + absl::Milliseconds(30);
  Push(q, MakeJob(103, 3), now);
  EXPECT_EQ(Ids(q.TakeBatch(now, false)), (std::vector<uint64_t>{1}));
  EXPECT_EQ(Ids(q.TakeBatch(now, false)), (std::vector<uint64_t>{103}));
}

TEST(JobQueueTest, DeadlinesExpireWhileQueued) {
  JobQueue q(Opts(4, absl::Hours(1)));
  auto a = MakeJob(1);
  a->deadline = kT0 + absl::Milliseconds(5);
  auto b = MakeJob(2);
  b->deadline = kT0 + absl::Milliseconds(3);
  Push(q, std::move(a));
  Push(q, std::move(b));
  Push(q, MakeJob(3));
  EXPECT_EQ(q.NextEvent(), kT0 + absl::Milliseconds(3));
  EXPECT_EQ(q.NextDeadline(), kT0 + absl::Milliseconds(3));
  EXPECT_TRUE(q.TakeExpired(kT0 + absl::Microseconds(2999)).empty());
  EXPECT_EQ(Ids(q.TakeExpired(kT0 + absl::Milliseconds(3))), (std::vector<uint64_t>{2}));
  EXPECT_EQ(Ids(q.TakeExpired(kT0 + absl::Milliseconds(10))), (std::vector<uint64_t>{1}));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.NextDeadline(), absl::InfiniteFuture());
}

TEST(JobQueueTest, RemovedJobsLeaveEveryIndex) {
  JobQueue q(Opts(4, absl::ZeroDuration()));
  auto a = MakeJob(1);
  a->deadline = kT0 + absl::Milliseconds(1);
  Push(q, std::move(a));
  Push(q, MakeJob(2));
  const uint64_t bytes = q.bytes();
  std::unique_ptr<Job> removed = q.Remove(1);
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->id, 1u);
  EXPECT_EQ(q.Remove(1), nullptr);
  EXPECT_LT(q.bytes(), bytes);
  EXPECT_TRUE(q.TakeExpired(kT0 + absl::Seconds(1)).empty());
  EXPECT_EQ(Ids(q.TakeBatch(kT0, false)), (std::vector<uint64_t>{2}));
}

TEST(JobQueueTest, CapacityAndBytesLimitRefuseAndKeepTheJob) {
  JobQueue::Options o = Opts();
  o.capacity = 2;
  JobQueue q(o);
  Push(q, MakeJob(1));
  Push(q, MakeJob(2));
  auto third = MakeJob(3);
  absl::Status s = q.Push(third, kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_NE(third, nullptr);  // Still ours.
  EXPECT_EQ(third->id, 3u);

  o.capacity = 100;
  o.max_bytes = 3 * 8 * 8 * 4;  // Room for one 8x8x8 float32 job (A, B, D).
  JobQueue small(o);
  Push(small, MakeJob(1));
  auto second = MakeJob(2);
  EXPECT_EQ(small.Push(second, kT0).code(), absl::StatusCode::kResourceExhausted);
  // A job over the byte limit is still taken into an empty queue.
  JobQueue empty(o);
  Push(empty, MakeJob(1, 0, DType::kFloat32, 100));
}

TEST(JobQueueTest, TakeAllEmptiesTheQueue) {
  JobQueue q(Opts());
  for (uint64_t id = 1; id <= 5; ++id) Push(q, MakeJob(id, static_cast<int32_t>(id % 2)));
  EXPECT_EQ(q.TakeAll().size(), 5u);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.bytes(), 0u);
}

}  // namespace
}  // namespace matmul::server
