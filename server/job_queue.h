// The bounded job queue and the batching policy, as a plain data structure
// driven by an explicit clock: no threads, no locks (the scheduler holds
// its own). Tests drive it with a fake time.
//
//   JobQueue queue(options);
//   if (absl::Status s = queue.Push(job, now); !s.ok()) { ... job is still ours ... }
//   for (auto& j : queue.TakeExpired(now)) { ... DEADLINE_EXCEEDED ... }
//   std::vector<std::unique_ptr<Job>> batch = queue.TakeBatch(now, /*flush=*/false);
//   absl::Time wake = queue.NextEvent();
//
// Policy:
//  * Order: higher priority first, FIFO within a level. A job's effective
//    priority rises by one level per `priority_aging` it has waited, so a
//    starving low level still progresses.
//  * A batch is led by the job of highest effective priority (the older on
//    ties) and filled with jobs of the same BatchKey (dtype in and out,
//    precision), by priority then FIFO, up to `max_batch_size` problems,
//    `max_batch_flops` of work and `max_batch_bytes` of operands and results
//    (the leader always goes, even when it alone is over a budget).
//  * A batch is released when it is full (size or work), when the oldest
//    queued job has waited `max_queue_delay`, when no job has joined the
//    queue for `max_queue_gap` (arrivals paused; off when zero), or when the
//    caller flushes.
//  * Deadlines: TakeExpired hands back every job whose deadline has passed.
#ifndef MATMUL_SERVER_JOB_QUEUE_H_
#define MATMUL_SERVER_JOB_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/job.h"

namespace matmul::server {

class JobQueue {
 public:
  struct Options {
    // Most jobs queued at once.
    size_t capacity = 1024;
    // Most request bytes (ProblemBytes) queued at once.
    uint64_t max_bytes = 4ull << 30;
    // Most problems per batch.
    size_t max_batch_size = 64;
    // Work budget of a batch in FLOPs.
    double max_batch_flops = 1e12;
    // Byte budget of a batch (operands and results, ProblemBytes); keeps a
    // batch of big problems small enough to stage while another computes.
    uint64_t max_batch_bytes = uint64_t{256} << 20;
    // Longest the oldest job waits for companions (the server's default,
    // chosen from GPU sweeps: docs/BENCHMARKS.md, twentieth round).
    absl::Duration max_queue_delay = absl::Microseconds(25);
    // When positive, a partial batch is also due once no job has joined the
    // queue for this long: callers that send in bursts (a closed loop of a
    // few clients, answered together) have all arrived, and waiting out the
    // rest of max_queue_delay would gather nobody. Under steady load the
    // gaps stay short and max_queue_delay decides as before.
    absl::Duration max_queue_gap = absl::ZeroDuration();
    // Waiting this long raises a job's effective priority by one.
    absl::Duration priority_aging = absl::Milliseconds(100);
  };

  explicit JobQueue(const Options& options) : options_(options) {}

  // Queues `job` (moving from it) or, when full, returns RESOURCE_EXHAUSTED
  // and leaves `job` with the caller. The job must have a unique id.
  absl::Status Push(std::unique_ptr<Job>& job, absl::Time now);

  // Takes a queued job out (for cancellation); null when not queued.
  std::unique_ptr<Job> Remove(uint64_t id);

  // Takes out every job whose deadline is at or before `now`.
  std::vector<std::unique_ptr<Job>> TakeExpired(absl::Time now);

  // The next batch when one is due (see the policy above), else empty. With
  // `flush`, any queued job is due.
  std::vector<std::unique_ptr<Job>> TakeBatch(absl::Time now, bool flush);

  // Takes out everything (shutdown).
  std::vector<std::unique_ptr<Job>> TakeAll();

  // The earliest time at which TakeExpired or TakeBatch may give something
  // without a new Push: the next deadline, the oldest job's delay expiry or
  // the end of the current gap in arrivals.
  absl::Time NextEvent() const;

  // The earliest deadline of a queued job (InfiniteFuture when none).
  absl::Time NextDeadline() const;

  size_t size() const { return index_.size(); }
  bool empty() const { return index_.empty(); }
  uint64_t bytes() const { return bytes_; }
  const Options& options() const { return options_; }

 private:
  using Level = std::list<std::unique_ptr<Job>>;
  // Where a queued job sits.
  struct Slot {
    int32_t priority;
    Level::iterator it;
  };

  // Priority of `job` after aging at `now`.
  int64_t EffectivePriority(const Job& job, absl::Time now) const;
  // The job that leads the next batch; queue must not be empty.
  const Job& Leader(absl::Time now) const;
  // Enqueue time of the oldest job; queue must not be empty.
  absl::Time OldestEnqueue() const;
  // When a partial batch is due without a flush (delay or gap); queue must
  // not be empty.
  absl::Time DueAt() const;
  // Unlinks a job from every index and returns it.
  std::unique_ptr<Job> Unlink(uint64_t id);

  const Options options_;
  // Jobs by priority level (highest first), FIFO within a level.
  std::map<int32_t, Level, std::greater<int32_t>> levels_;
  // Every queued job by id.
  absl::flat_hash_map<uint64_t, Slot> index_;
  // (deadline, id) of queued jobs that have a deadline.
  std::set<std::pair<absl::Time, uint64_t>> deadlines_;
  // Sum of ProblemBytes of queued jobs.
  uint64_t bytes_ = 0;
  // When the latest job was pushed (for max_queue_gap).
  absl::Time last_push_ = absl::InfinitePast();
};

}  // namespace matmul::server

#endif  // MATMUL_SERVER_JOB_QUEUE_H_
