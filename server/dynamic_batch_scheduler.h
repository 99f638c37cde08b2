// The dynamic batch scheduler: owns the job queue, forms batches and hands
// each one to the least-loaded device worker.
//
// The JobQueue policy (delay, size and work limits, priorities, deadlines)
// is applied wherever something changes: in Submit, on the caller's thread,
// and by a lane as it finishes a batch, which takes the next one without a
// hand-off. A scheduler thread sleeps until the next timed event (the oldest
// job's delay, a deadline) and is woken only when a Submit makes that event
// earlier. Every device has `lanes` worker threads, each running one batch
// at a time on the device's engine (two lanes let one batch's copies overlap
// the next one's compute). With Options::lane_spin, a lane that finds no
// batch polls for one a while before it sleeps, and a batch for that device
// goes to it without a thread wake-up.
//
//   auto scheduler = DynamicBatchScheduler::Create(options, engines, &metrics);
//   auto job = std::make_unique<Job>();
//   job->id = (*scheduler)->NewJobId();
//   ... fill the job ...
//   absl::Status s = (*scheduler)->Submit(std::move(job));
//   // !s.ok(): refused (queue full, draining); on_done will not run.
//   (*scheduler)->Cancel(id);  // a queued job ends CANCELLED at once
//
// Every submitted job's on_done runs exactly once: with the result, or with
// DEADLINE_EXCEEDED (deadline passed while queued), CANCELLED (cancelled
// while queued), UNAVAILABLE (no healthy device, or shut down).
#ifndef MATMUL_SERVER_DYNAMIC_BATCH_SCHEDULER_H_
#define MATMUL_SERVER_DYNAMIC_BATCH_SCHEDULER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/engine.h"
#include "server/job.h"
#include "server/job_queue.h"
#include "server/metrics.h"

namespace matmul::server {

// What the dispatcher knows of one device when it places a batch.
struct DeviceLoad {
  // Lanes (worker threads) not running a batch.
  int free_lanes = 0;
  // FLOPs of the batches the device is running now.
  double outstanding_flops = 0;
  // False once the engine failed.
  bool healthy = true;
};

// The device for the next batch: among healthy devices with a free lane,
// the one with the least outstanding work; ties go to more free lanes, then
// to the lower index. -1 when none can take it.
int PickDevice(absl::Span<const DeviceLoad> devices);

// The device for a batch whose kept operands have `resident_bytes[i]`
// bytes on device i: among healthy devices with a free lane, the one
// holding the most of them; `fallback` (PickDevice's choice) when none
// holds any. Operands missing on the chosen device are copied there on
// demand (and stay, so the next batch finds them).
int PickDeviceFor(absl::Span<const DeviceLoad> devices, absl::Span<const uint64_t> resident_bytes,
                  int fallback);

class DynamicBatchScheduler {
 public:
  struct Options {
    JobQueue::Options queue;
    // Concurrent batches per device.
    int lanes_per_device = 1;
    // When a device has no batch running, queued jobs go to it at once
    // instead of waiting out queue.max_queue_delay: the delay gathers
    // companions while devices are busy, and an idle device gains nothing
    // from waiting. Under load the devices stay busy and batches still form.
    bool dispatch_when_idle = false;
    // Generalises dispatch_when_idle: while fewer than this many batches run
    // on a device, queued jobs go to it at once (1 is dispatch_when_idle).
    // With several lanes, a second batch can then start while the first
    // computes, which shortens the wait of requests arriving below
    // saturation; at saturation every lane is busy and batches form as
    // before.
    int dispatch_below_running = 0;
    // How long a lane that finds no batch waiting polls for one before it
    // sleeps; zero: it sleeps at once. One lane per device polls at a time,
    // and the next batch for that device goes to it without a thread wake-up
    // (a futex round trip of tens of microseconds on a quiet core, which
    // small requests feel). It keeps a core busy while it polls.
    absl::Duration lane_spin = absl::ZeroDuration();
    // Called (from a worker thread) when a device turns unhealthy, with the
    // number of healthy devices left.
    std::function<void(int device, int healthy_left)> on_device_failed;
  };

  // `engines` must outlive the scheduler; `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<DynamicBatchScheduler>> Create(
      const Options& options, std::vector<Engine*> engines, Metrics* metrics);

  // Stop()s.
  ~DynamicBatchScheduler();

  // Fails every job still queued with UNAVAILABLE, lets running batches
  // finish (their jobs end normally), and stops the threads. Later Submits
  // are refused with UNAVAILABLE. Idempotent.
  void Stop();

  uint64_t NewJobId() { return next_id_.fetch_add(1, std::memory_order_relaxed); }

  // Queues a job. RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE
  // when draining or no device is healthy; on error `on_done` is not called
  // and the job is destroyed.
  absl::Status Submit(std::unique_ptr<Job> job);

  // Ends a queued job with CANCELLED (its on_done runs in this call). A job
  // already running is left alone: it completes and its owner drops the
  // result. Returns whether the job was still queued. A job whose deadline
  // has passed ends DEADLINE_EXCEEDED instead (gRPC cancels calls whose
  // deadline passes, and that race must not change the answer).
  bool Cancel(uint64_t id);

  // Stops taking jobs, releases queued ones without waiting for companions,
  // and waits until every accepted job has ended or `deadline` passes.
  // Returns whether everything ended.
  bool Drain(absl::Time deadline);

  // Jobs waiting in the queue.
  size_t QueueDepth() const;

 private:
  struct Batch {
    std::vector<std::unique_ptr<Job>> jobs;
    double flops = 0;
    absl::Time dispatched;
  };
  struct DeviceState {
    Engine* engine;
    DeviceLoad load;
    // Batches handed to this device, waiting for a lane.
    std::deque<Batch> inbox;
    // Signalled when the inbox gets a batch or on stop (one per device, so
    // a batch wakes one of its own lanes, not every lane of every device).
    std::unique_ptr<absl::CondVar> inbox_cv = std::make_unique<absl::CondVar>();
    // Lane threads.
    std::vector<std::thread> lanes;
    // The ticket of the lane polling for the next batch (Options::lane_spin)
    // that has not been handed one yet, 0 when none; a batch pushed
    // meanwhile goes to that lane.
    uint64_t polling_ticket = 0;
    // Tickets handed out to polling lanes, so far.
    uint64_t last_ticket = 0;
    // The ticket of the last polling lane handed a batch: written under mu_,
    // read by the polling lane without it. A pointer, as DeviceState must
    // stay movable.
    std::unique_ptr<std::atomic<uint64_t>> claimed_ticket =
        std::make_unique<std::atomic<uint64_t>>(0);
    // With mu_ held: ends the polling lane's poll as if handed a batch (it
    // then looks at the inbox). Returns false when no lane polls.
    bool HandToPollingLane() {
      if (polling_ticket == 0) return false;
      claimed_ticket->store(polling_ticket, std::memory_order_release);
      polling_ticket = 0;
      return true;
    }
    // Batches running now, and when that count last changed (busy time).
    int running = 0;
    absl::Time last_change;
  };

  DynamicBatchScheduler(const Options& options, std::vector<Engine*> engines, Metrics* metrics);

  // Jobs a policy step took out to fail, outside the lock.
  struct Reaped {
    std::vector<std::unique_ptr<Job>> expired;
    std::vector<std::unique_ptr<Job>> stranded;
  };

  void SchedulerLoop();
  // One step of the policy at `now`: with `reaped`, takes out expired jobs
  // (and every job when no device is healthy) into it; then hands due
  // batches to free lanes and publishes the queue depth. A batch for
  // `self_device` (>= 0: the calling lane will look at its inbox next) does
  // not wake another lane. Returns whether a device still has a free lane.
  bool StepLocked(absl::Time now, Reaped* reaped, int self_device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the scheduler thread should next look: the next batch or deadline
  // with a free lane, only deadlines without one.
  absl::Time NextWakeLocked(bool lane_free) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the scheduler thread if it sleeps past NextWakeLocked.
  void WakeSchedulerIfLateLocked(bool lane_free) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailReaped(Reaped reaped);
  void LaneLoop(int device);
  // Called by a lane with mu_ held and its device's inbox empty: polls for
  // up to Options::lane_spin (mu_ released meanwhile) when no other lane of
  // the device polls. Returns with mu_ held.
  void PollInboxLocked(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunBatch(int device, Batch batch);
  // Ends jobs outside the lock.
  void Fail(std::vector<std::unique_ptr<Job>> jobs, const absl::Status& status,
            RejectReason reason);
  bool AnyHealthyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the time since the last change to the device's busy time.
  void UpdateBusyLocked(int device, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  // While fewer batches than this run on a device, queued jobs go to it at
  // once (from dispatch_when_idle and dispatch_below_running).
  const int dispatch_eager_below_;
  Metrics* const metrics_;
  std::atomic<uint64_t> next_id_{1};

  mutable absl::Mutex mu_;
  // Signalled when the scheduler thread has something to look at before
  // the time it sleeps until.
  absl::CondVar scheduler_cv_;
  JobQueue queue_ ABSL_GUARDED_BY(mu_);
  std::vector<DeviceState> devices_ ABSL_GUARDED_BY(mu_);
  // Set to wake the scheduler thread; cleared by it when it looks.
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  // When the sleeping scheduler thread wakes by itself (InfinitePast while
  // it is awake, so nobody wakes it needlessly: it looks again anyway).
  absl::Time scheduler_sleeps_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Jobs submitted and not yet ended.
  int64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;

  std::thread scheduler_thread_;
  // Guards the joining of threads in Stop().
  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace matmul::server

#endif  // MATMUL_SERVER_DYNAMIC_BATCH_SCHEDULER_H_
