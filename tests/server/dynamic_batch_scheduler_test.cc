#include "server/dynamic_batch_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <initializer_list>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "client/requests.h"
#include "kernels/reference_gemm.h"
#include "tests/util/test_util.h"

namespace matmul::server {
namespace {

using matmul::testing::FakeEngine;

TEST(PickDeviceTest, LeastOutstandingWorkWins) {
  EXPECT_EQ(PickDevice({{1, 100, true}, {1, 50, true}, {1, 75, true}}), 1);
}

TEST(PickDeviceTest, KeptOperandsPullTheBatchToTheirDevice) {
  const std::vector<DeviceLoad> loads = {{1, 100, true}, {1, 0, true}, {0, 0, true}, {1, 0, false}};
  // Device 0 holds them: it wins over the idler device 1.
  EXPECT_EQ(PickDeviceFor(loads, std::vector<uint64_t>{512, 0, 0, 0}, 1), 0);
  // The most bytes win.
  EXPECT_EQ(PickDeviceFor(loads, std::vector<uint64_t>{512, 1024, 0, 0}, 0), 1);
  // A device without a free lane or unhealthy is passed over: the fallback
  // (PickDevice's choice) runs it and copies the operands there.
  EXPECT_EQ(PickDeviceFor(loads, std::vector<uint64_t>{0, 0, 4096, 4096}, 1), 1);
  EXPECT_EQ(PickDeviceFor(loads, std::vector<uint64_t>{0, 0, 0, 0}, 1), 1);
}

TEST(PickDeviceTest, TiesGoToMoreFreeLanesThenLowerIndex) {
  EXPECT_EQ(PickDevice({{1, 0, true}, {2, 0, true}}), 1);
  EXPECT_EQ(PickDevice({{2, 0, true}, {2, 0, true}}), 0);
}

TEST(PickDeviceTest, SkipsBusyAndUnhealthyDevices) {
  EXPECT_EQ(PickDevice({{0, 0, true}, {1, 1e12, true}}), 1);
  EXPECT_EQ(PickDevice({{1, 0, false}, {1, 1e12, true}}), 1);
  EXPECT_EQ(PickDevice({{0, 0, true}, {1, 0, false}}), -1);
  EXPECT_EQ(PickDevice({}), -1);
}

// One job's inputs, output and outcome.
struct Call {
  v1::MultiplyRequest request;
  ResultBuffer output;
  JobOutcome outcome;
  std::atomic<int> done_count{0};
};

std::unique_ptr<Job> MakeJob(DynamicBatchScheduler& s, Call& call, int64_t size = 4,
                             int32_t priority = 0) {
  // One generator per thread: producers run concurrently.
  thread_local std::mt19937_64 rng(std::random_device{}());
  client::ProblemSpec spec;
  spec.m = spec.n = spec.k = size;
  call.request = client::RandomRequest(spec, rng);
  auto job = std::make_unique<Job>();
  job->id = s.NewJobId();
  job->problem = *client::ProblemOf(call.request);
  job->output = &call.output;
  job->output_bytes = size * size * 4;
  job->priority = priority;
  job->arrival = absl::Now();
  job->on_done = [&call](const JobOutcome& outcome) {
    call.outcome = outcome;
    call.done_count.fetch_add(1);
  };
  return job;
}

DynamicBatchScheduler::Options Options(size_t batch = 8, absl::Duration delay = absl::ZeroDuration()) {
  DynamicBatchScheduler::Options o;
  o.queue.max_batch_size = batch;
  o.queue.max_queue_delay = delay;
  o.queue.max_batch_flops = 1e15;
  o.lanes_per_device = 1;
  return o;
}

void WaitDone(const Call& call) {
  while (call.done_count.load() == 0) absl::SleepFor(absl::Milliseconds(1));
}

// Waits for each call and expects it to have succeeded.
void WaitAllOk(std::initializer_list<Call*> calls) {
  for (Call* c : calls) {
    WaitDone(*c);
    ASSERT_TRUE(c->outcome.status.ok()) << c->outcome.status;
  }
}

TEST(DynamicBatchSchedulerTest, RunsJobsWithCorrectResults) {
  FakeEngine engine("fake:0");
  auto s = DynamicBatchScheduler::Create(Options(), {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 20; ++i) {
    calls.push_back(std::make_unique<Call>());
    ASSERT_TRUE((*s)->Submit(MakeJob(**s, *calls.back(), 3 + i)).ok());
  }
  ASSERT_TRUE((*s)->Drain(absl::InfiniteFuture()));
  for (auto& c : calls) {
    EXPECT_EQ(c->done_count.load(), 1);
    ASSERT_TRUE(c->outcome.status.ok()) << c->outcome.status;
    EXPECT_EQ(c->outcome.device, "fake:0");
    EXPECT_GE(c->outcome.batch_size, 1u);
    absl::StatusOr<GemmProblem> p = client::ProblemOf(c->request);
    EXPECT_LE(RelativeError(ReferenceGemm(*p), c->output.data(), DType::kFloat32), 1e-5);
  }
}

TEST(DynamicBatchSchedulerTest, JobsQueuedBehindABusyDeviceShareABatch) {
  FakeEngine engine("fake:0");
  engine.Block();
  auto s = DynamicBatchScheduler::Create(Options(16), {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  Call first;
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, first)).ok());
  engine.WaitForBatches(1);  // The device is now busy with `first`.
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 10; ++i) {
    calls.push_back(std::make_unique<Call>());
    ASSERT_TRUE((*s)->Submit(MakeJob(**s, *calls.back())).ok());
  }
  engine.Unblock();
  ASSERT_TRUE((*s)->Drain(absl::InfiniteFuture()));
  EXPECT_EQ(engine.batch_sizes(), (std::vector<size_t>{1, 10}));
  for (auto& c : calls) EXPECT_EQ(c->outcome.batch_size, 10u);
}

// The scheduler thread sleeps with nothing to wait for; a lone job must
// wake it, since only a timer releases the job when its delay ends.
TEST(DynamicBatchSchedulerTest, ALoneJobLeavesWhenItsDelayEnds) {
  FakeEngine engine("fake:0");
  const absl::Duration delay = absl::Milliseconds(20);
  auto s = DynamicBatchScheduler::Create(Options(16, delay), {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  for (int round = 0; round < 3; ++round) {
    Call call;
    ASSERT_TRUE((*s)->Submit(MakeJob(**s, call)).ok());
    WaitDone(call);
    ASSERT_TRUE(call.outcome.status.ok()) << call.outcome.status;
    EXPECT_EQ(call.outcome.batch_size, 1u);
    EXPECT_GE(call.outcome.queue_time, delay);
  }
}

// With dispatch_when_idle, a job finding its device idle leaves at once,
// however long the delay; one arriving while the device is busy waits for
// companions, and leaves when the device goes idle again.
TEST(DynamicBatchSchedulerTest, AnIdleDeviceTakesAJobWithoutTheDelay) {
  FakeEngine engine("fake:0");
  engine.Block();
  DynamicBatchScheduler::Options options = Options(16, absl::Hours(1));
  options.lanes_per_device = 2;
  options.dispatch_when_idle = true;
  auto s = DynamicBatchScheduler::Create(options, {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  Call first, second, third;
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, first)).ok());
  engine.WaitForBatches(1);  // Gone at once: the device was idle.
  // One lane of two is busy, so these wait for each other (and the delay).
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, second)).ok());
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, third)).ok());
  EXPECT_EQ((*s)->QueueDepth(), 2u);
  engine.Unblock();
  ASSERT_NO_FATAL_FAILURE(WaitAllOk({&first, &second, &third}));
  EXPECT_EQ(first.outcome.batch_size, 1u);
  EXPECT_EQ(second.outcome.batch_size, 2u);
  EXPECT_EQ(third.outcome.batch_size, 2u);
  EXPECT_LT(second.outcome.queue_time, absl::Hours(1));
}

// With dispatch_below_running = 2, a second batch starts while the first
// runs; only once two run do jobs wait for companions.
TEST(DynamicBatchSchedulerTest, ASecondBatchStartsWhileOneRuns) {
  FakeEngine engine("fake:0");
  engine.Block();
  DynamicBatchScheduler::Options options = Options(16, absl::Hours(1));
  options.lanes_per_device = 3;
  options.dispatch_below_running = 2;
  auto s = DynamicBatchScheduler::Create(options, {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  Call first, second, third, fourth;
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, first)).ok());
  engine.WaitForBatches(1);
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, second)).ok());
  // Gone from Submit itself: only one batch was running.
  const size_t queued_beside_one = (*s)->QueueDepth();
  EXPECT_EQ(queued_beside_one, 0u);
  if (queued_beside_one == 0) engine.WaitForBatches(2);
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, third)).ok());
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, fourth)).ok());
  EXPECT_EQ((*s)->QueueDepth(), 2u) << "two batches run, so these wait for companions";
  engine.Unblock();
  ASSERT_NO_FATAL_FAILURE(WaitAllOk({&first, &second, &third, &fourth}));
  EXPECT_EQ(first.outcome.batch_size, 1u);
  EXPECT_EQ(second.outcome.batch_size, 1u);
  EXPECT_EQ(third.outcome.batch_size, 2u);
  EXPECT_EQ(fourth.outcome.batch_size, 2u);
}

// With max_queue_gap, jobs queued behind a busy lane leave once arrivals
// pause, not after the (hour-long) delay.
TEST(DynamicBatchSchedulerTest, APauseInArrivalsSendsAPartialBatch) {
  FakeEngine engine("fake:0");
  engine.Block();
  DynamicBatchScheduler::Options options = Options(16, absl::Hours(1));
  options.lanes_per_device = 2;
  options.dispatch_when_idle = true;
  const absl::Duration gap = absl::Milliseconds(200);
  options.queue.max_queue_gap = gap;
  auto s = DynamicBatchScheduler::Create(options, {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  Call first, second, third;
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, first)).ok());
  engine.WaitForBatches(1);
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, second)).ok());
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, third)).ok());
  engine.WaitForBatches(2);  // Only the gap can release them: one lane is busy.
  engine.Unblock();
  ASSERT_NO_FATAL_FAILURE(WaitAllOk({&first, &second, &third}));
  EXPECT_EQ(second.outcome.batch_size, 2u);
  EXPECT_EQ(third.outcome.batch_size, 2u);
  EXPECT_GE(third.outcome.queue_time, gap);
  EXPECT_LT(second.outcome.queue_time, absl::Hours(1));
}

TEST(DynamicBatchSchedulerTest, RejectsANegativeQueueGap) {
  FakeEngine engine("fake:0");
  DynamicBatchScheduler::Options options = Options();
  options.queue.max_queue_gap = absl::Microseconds(-1);
  auto s = DynamicBatchScheduler::Create(options, {&engine}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("max_queue_gap"), std::string::npos) << s.status();
}

TEST(DynamicBatchSchedulerTest, RejectsANegativeDispatchBelowRunning) {
  FakeEngine engine("fake:0");
  DynamicBatchScheduler::Options options = Options();
  options.dispatch_below_running = -1;
  auto s = DynamicBatchScheduler::Create(options, {&engine}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("dispatch_below_running"), std::string::npos) << s.status();
}

// Without it (the default), an idle device still waits out the delay.
TEST(DynamicBatchSchedulerTest, WithoutDispatchWhenIdleTheDelayHolds) {
  FakeEngine engine("fake:0");
  auto s = DynamicBatchScheduler::Create(Options(16, absl::Hours(1)), {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  Call call;
  std::unique_ptr<Job> job = MakeJob(**s, call);
  const uint64_t id = job->id;
  ASSERT_TRUE((*s)->Submit(std::move(job)).ok());
  EXPECT_EQ((*s)->QueueDepth(), 1u);
  EXPECT_TRUE((*s)->Cancel(id));
  WaitDone(call);
  EXPECT_EQ(call.outcome.status.code(), absl::StatusCode::kCancelled);
}

// A batch that is full leaves from Submit itself, however long the delay.
TEST(DynamicBatchSchedulerTest, AFullBatchLeavesWithoutWaitingForTheDelay) {
  FakeEngine engine("fake:0");
  auto s = DynamicBatchScheduler::Create(Options(4, absl::Hours(1)), {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 4; ++i) {
    calls.push_back(std::make_unique<Call>());
    ASSERT_TRUE((*s)->Submit(MakeJob(**s, *calls.back())).ok());
  }
  for (auto& c : calls) {
    WaitDone(*c);
    ASSERT_TRUE(c->outcome.status.ok()) << c->outcome.status;
    EXPECT_EQ(c->outcome.batch_size, 4u);
  }
  EXPECT_EQ((*s)->QueueDepth(), 0u);
}

TEST(DynamicBatchSchedulerTest, DeadlineExpiresWhileQueuedNotAfterTheBatch) {
  FakeEngine engine("fake:0");
  engine.Block();
  auto s = DynamicBatchScheduler::Create(Options(), {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  Call running, waiting;
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, running)).ok());
  engine.WaitForBatches(1);
  auto job = MakeJob(**s, waiting);
  job->deadline = absl::Now() + absl::Milliseconds(50);
  ASSERT_TRUE((*s)->Submit(std::move(job)).ok());
  // The device stays blocked: the answer must come from the queue itself.
  WaitDone(waiting);
  EXPECT_EQ(waiting.outcome.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(running.done_count.load(), 0);
  engine.Unblock();
  ASSERT_TRUE((*s)->Drain(absl::InfiniteFuture()));
  EXPECT_TRUE(running.outcome.status.ok());
  EXPECT_EQ(engine.problems(), 1);  // The expired job never ran.
}

TEST(DynamicBatchSchedulerTest, CancelRemovesAQueuedJobOnly) {
  FakeEngine engine("fake:0");
  engine.Block();
  auto s = DynamicBatchScheduler::Create(Options(), {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  Call running, queued;
  auto job = MakeJob(**s, running);
  const uint64_t running_id = job->id;
  ASSERT_TRUE((*s)->Submit(std::move(job)).ok());
  engine.WaitForBatches(1);
  job = MakeJob(**s, queued);
  const uint64_t queued_id = job->id;
  ASSERT_TRUE((*s)->Submit(std::move(job)).ok());
  EXPECT_TRUE((*s)->Cancel(queued_id));
  EXPECT_EQ(queued.done_count.load(), 1);  // Ended inside Cancel.
  EXPECT_EQ(queued.outcome.status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE((*s)->Cancel(running_id));  // Already running: left alone.
  EXPECT_FALSE((*s)->Cancel(queued_id));
  engine.Unblock();
  ASSERT_TRUE((*s)->Drain(absl::InfiniteFuture()));
  EXPECT_TRUE(running.outcome.status.ok());
  EXPECT_EQ(queued.done_count.load(), 1);
  EXPECT_EQ(engine.problems(), 1);
}

TEST(DynamicBatchSchedulerTest, FullQueueRefusesAtOnce) {
  FakeEngine engine("fake:0");
  engine.Block();
  DynamicBatchScheduler::Options o = Options(1);
  o.queue.capacity = 2;
  auto s = DynamicBatchScheduler::Create(o, {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  Call a, b, c, d;
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, a)).ok());
  engine.WaitForBatches(1);
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, b)).ok());
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, c)).ok());
  absl::Status full = (*s)->Submit(MakeJob(**s, d));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.done_count.load(), 0);  // Refused jobs are never "done".
  engine.Unblock();
  ASSERT_TRUE((*s)->Drain(absl::InfiniteFuture()));
  EXPECT_EQ(engine.problems(), 3);
}

TEST(DynamicBatchSchedulerTest, SpreadsBatchesOverDevices) {
  FakeEngine e0("fake:0"), e1("fake:1");
  e0.Block();
  e1.Block();
  auto s = DynamicBatchScheduler::Create(Options(1), {&e0, &e1}, nullptr);
  ASSERT_TRUE(s.ok());
  Call a, b;
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, a)).ok());
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, b)).ok());
  // Both devices get one batch each; neither can finish, so this only
  // returns if the second batch went to the idle device.
  e0.WaitForBatches(1);
  e1.WaitForBatches(1);
  e0.Unblock();
  e1.Unblock();
  ASSERT_TRUE((*s)->Drain(absl::InfiniteFuture()));
  EXPECT_NE(a.outcome.device, b.outcome.device);
}

TEST(DynamicBatchSchedulerTest, AFailingDeviceFailsOnlyItsBatchAndStopsGettingWork) {
  FakeEngine e0("fake:0"), e1("fake:1");
  e0.FailAfter(0);  // Its first batch fails and it turns unhealthy.
  auto s = DynamicBatchScheduler::Create(Options(1), {&e0, &e1}, nullptr);
  ASSERT_TRUE(s.ok());
  Call first;
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, first)).ok());  // Goes to e0 (tie -> index 0).
  WaitDone(first);
  EXPECT_EQ(first.outcome.status.code(), absl::StatusCode::kInternal);
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 10; ++i) {
    calls.push_back(std::make_unique<Call>());
    ASSERT_TRUE((*s)->Submit(MakeJob(**s, *calls.back())).ok());
  }
  ASSERT_TRUE((*s)->Drain(absl::InfiniteFuture()));
  for (auto& c : calls) {
    EXPECT_TRUE(c->outcome.status.ok()) << c->outcome.status;
    EXPECT_EQ(c->outcome.device, "fake:1");
  }
  EXPECT_EQ(e0.batches(), 1);
}

TEST(DynamicBatchSchedulerTest, NoHealthyDeviceMeansUnavailable) {
  FakeEngine e0("fake:0");
  e0.FailAfter(0);
  Call first, second;
  {
    auto s = DynamicBatchScheduler::Create(Options(1), {&e0}, nullptr);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Submit(MakeJob(**s, first)).ok());
    e0.WaitForBatches(1);
  }  // Destruction waits for the running batch.
  EXPECT_EQ(first.outcome.status.code(), absl::StatusCode::kInternal);
  ASSERT_FALSE(e0.Healthy());
  auto s = DynamicBatchScheduler::Create(Options(1), {&e0}, nullptr);
  ASSERT_TRUE(s.ok());
  absl::Status status = (*s)->Submit(MakeJob(**s, second));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status.message(), "no healthy device to run on");
}

TEST(DynamicBatchSchedulerTest, DrainFlushesWithoutWaitingForTheDelay) {
  FakeEngine engine("fake:0");
  // Batches of 64 with an hour's delay: only a flush can send 3 jobs.
  auto s = DynamicBatchScheduler::Create(Options(64, absl::Hours(1)), {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::make_unique<Call>());
    ASSERT_TRUE((*s)->Submit(MakeJob(**s, *calls.back())).ok());
  }
  EXPECT_EQ((*s)->QueueDepth(), 3u);
  EXPECT_TRUE((*s)->Drain(absl::Now() + absl::Seconds(60)));
  for (auto& c : calls) EXPECT_TRUE(c->outcome.status.ok());
  Call late;
  EXPECT_EQ((*s)->Submit(MakeJob(**s, late)).code(), absl::StatusCode::kUnavailable);
}

TEST(DynamicBatchSchedulerTest, StopAnswersQueuedJobsUnavailable) {
  FakeEngine engine("fake:0");
  auto s = DynamicBatchScheduler::Create(Options(64, absl::Hours(1)), {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  Call a;
  ASSERT_TRUE((*s)->Submit(MakeJob(**s, a)).ok());
  (*s)->Stop();
  EXPECT_EQ(a.done_count.load(), 1);
  EXPECT_EQ(a.outcome.status.code(), absl::StatusCode::kUnavailable);
}

// Eight threads submit, some with deadlines, some cancelling; every job must
// end exactly once, with a correct result where it ran.
void ConcurrentProducersLoseNothingAndNeverAnswerTwice(absl::Duration lane_spin) {
  FakeEngine e0("fake:0"), e1("fake:1");
  DynamicBatchScheduler::Options o = Options(8, absl::Microseconds(200));
  o.lanes_per_device = 2;
  o.lane_spin = lane_spin;
  o.queue.capacity = 100000;
  auto s = DynamicBatchScheduler::Create(o, {&e0, &e1}, nullptr);
  ASSERT_TRUE(s.ok());
  constexpr int kThreads = 8, kPerThread = 300;
  std::vector<std::unique_ptr<Call>> calls(kThreads * kPerThread);
  std::vector<uint64_t> ids(calls.size());
  std::vector<char> has_deadline(calls.size(), 0);
  std::atomic<int> cancelled{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < kPerThread; ++i) {
        const int index = t * kPerThread + i;
        calls[index] = std::make_unique<Call>();
        auto job = MakeJob(**s, *calls[index], 2 + index % 5, static_cast<int32_t>(rng() % 3));
        if (rng() % 7 == 0) {
          job->deadline = absl::Now() + absl::Microseconds(rng() % 500);
          has_deadline[index] = 1;
        }
        ids[index] = job->id;
        ASSERT_TRUE((*s)->Submit(std::move(job)).ok());
        if (rng() % 5 == 0) {
          // Cancel one of this thread's jobs without a deadline (a cancel
          // close to a deadline counts as the deadline); it may already be
          // running or done.
          const int victim = t * kPerThread + static_cast<int>(rng() % (i + 1));
          if (!has_deadline[victim] && (*s)->Cancel(ids[victim])) cancelled.fetch_add(1);
        }
      }
    });
  }
  for (auto& p : producers) p.join();
  ASSERT_TRUE((*s)->Drain(absl::InfiniteFuture()));
  int ok = 0, deadline = 0, cancel = 0;
  for (auto& c : calls) {
    ASSERT_EQ(c->done_count.load(), 1);
    switch (c->outcome.status.code()) {
      case absl::StatusCode::kOk:
        ++ok;
        EXPECT_LE(RelativeError(ReferenceGemm(*client::ProblemOf(c->request)), c->output.data(),
                                DType::kFloat32),
                  1e-5);
        break;
      case absl::StatusCode::kDeadlineExceeded: ++deadline; break;
      case absl::StatusCode::kCancelled: ++cancel; break;
      default: ADD_FAILURE() << c->outcome.status;
    }
  }
  EXPECT_EQ(cancel, cancelled.load());
  EXPECT_EQ(ok + deadline + cancel, kThreads * kPerThread);
  EXPECT_EQ(ok, e0.problems() + e1.problems());
  EXPECT_GT(e0.problems(), 0);
  EXPECT_GT(e1.problems(), 0);
}

TEST(DynamicBatchSchedulerTest, ConcurrentProducersLoseNothingAndNeverAnswerTwice) {
  ConcurrentProducersLoseNothingAndNeverAnswerTwice(absl::ZeroDuration());
}

// The same with polling lanes: batches handed to a polling lane, and those
// pushed while it stops polling, all run.
TEST(DynamicBatchSchedulerTest, PollingLanesLoseNothingAndNeverAnswerTwice) {
  ConcurrentProducersLoseNothingAndNeverAnswerTwice(absl::Microseconds(300));
}

// A lane polls for the next batch for an hour here: each job in turn must
// still run (handed to the polling lane, or to the lane on its next look),
// and Stop must end the polling rather than wait it out.
TEST(DynamicBatchSchedulerTest, APollingLaneTakesTheNextBatchAndStopsOnStop) {
  FakeEngine engine("fake:0");
  DynamicBatchScheduler::Options options = Options();
  options.lane_spin = absl::Hours(1);
  auto s = DynamicBatchScheduler::Create(options, {&engine}, nullptr);
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 50; ++i) {
    Call call;
    ASSERT_TRUE((*s)->Submit(MakeJob(**s, call, 3 + i % 4)).ok());
    WaitDone(call);
    ASSERT_TRUE(call.outcome.status.ok()) << call.outcome.status;
    EXPECT_LE(RelativeError(ReferenceGemm(*client::ProblemOf(call.request)), call.output.data(),
                            DType::kFloat32),
              1e-5);
  }
  EXPECT_EQ(engine.problems(), 50);
  (*s)->Stop();
}

TEST(DynamicBatchSchedulerTest, RejectsANegativeLaneSpin) {
  FakeEngine engine("fake:0");
  DynamicBatchScheduler::Options options = Options();
  options.lane_spin = absl::Microseconds(-1);
  auto s = DynamicBatchScheduler::Create(options, {&engine}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("lane_spin"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace matmul::server
