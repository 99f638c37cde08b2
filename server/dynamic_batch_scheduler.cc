#include "server/dynamic_batch_scheduler.h"

#include <pthread.h>

#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace matmul::server {
namespace {

// Names the calling thread (at most 15 characters), so top -H, perf and
// /proc show which part of the server a thread is.
void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

// Tells the core that this thread busy-waits (frees pipeline resources for
// a sibling hyperthread, saves power).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

int PickDevice(absl::Span<const DeviceLoad> devices) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(devices.size()); ++i) {
    const DeviceLoad& d = devices[i];
    if (!d.healthy || d.free_lanes <= 0) continue;
    if (best < 0) {
      best = i;
      continue;
    }
    const DeviceLoad& b = devices[best];
    if (d.outstanding_flops < b.outstanding_flops ||
        (d.outstanding_flops == b.outstanding_flops && d.free_lanes > b.free_lanes)) {
      best = i;
    }
  }
  return best;
}

int PickDeviceFor(absl::Span<const DeviceLoad> devices, absl::Span<const uint64_t> resident_bytes,
                  int fallback) {
  int best = fallback;
  uint64_t best_bytes = 0;
  for (int i = 0; i < static_cast<int>(devices.size()); ++i) {
    const DeviceLoad& d = devices[i];
    if (!d.healthy || d.free_lanes <= 0) continue;
    if (resident_bytes[i] > best_bytes) {
      best = i;
      best_bytes = resident_bytes[i];
    }
  }
  return best;
}

absl::StatusOr<std::unique_ptr<DynamicBatchScheduler>> DynamicBatchScheduler::Create(
    const Options& options, std::vector<Engine*> engines, Metrics* metrics) {
  if (engines.empty()) return absl::InvalidArgumentError("scheduler needs at least one engine");
  if (options.lanes_per_device < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lanes_per_device must be >= 1, got ", options.lanes_per_device));
  }
  if (options.dispatch_below_running < 0) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch_below_running must be >= 0, got ",
                                                   options.dispatch_below_running));
  }
  if (options.lane_spin < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lane_spin must be >= 0");
  }
  if (options.queue.capacity < 1) {
    return absl::InvalidArgumentError("queue_capacity must be >= 1");
  }
  if (options.queue.max_batch_size < 1) {
    return absl::InvalidArgumentError("max_batch_size must be >= 1");
  }
  if (options.queue.max_queue_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("max_queue_delay must be >= 0");
  }
  if (options.queue.max_queue_gap < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("max_queue_gap must be >= 0");
  }
  return std::unique_ptr<DynamicBatchScheduler>(
      new DynamicBatchScheduler(options, std::move(engines), metrics));
}

DynamicBatchScheduler::DynamicBatchScheduler(const Options& options, std::vector<Engine*> engines,
                                             Metrics* metrics)
    : options_(options),
      dispatch_eager_below_(
          std::max(options.dispatch_when_idle ? 1 : 0, options.dispatch_below_running)),
      metrics_(metrics),
      queue_(options.queue) {
  absl::MutexLock lock(&mu_);
  devices_ = std::vector<DeviceState>(engines.size());
  for (size_t d = 0; d < engines.size(); ++d) {
    devices_[d].engine = engines[d];
    devices_[d].load.free_lanes = options_.lanes_per_device;
    devices_[d].load.healthy = engines[d]->Healthy();
    devices_[d].last_change = absl::Now();
    for (int lane = 0; lane < options_.lanes_per_device; ++lane) {
      devices_[d].lanes.emplace_back([this, d] { LaneLoop(static_cast<int>(d)); });
    }
  }
  scheduler_thread_ = std::thread([this] { SchedulerLoop(); });
}

DynamicBatchScheduler::~DynamicBatchScheduler() { Stop(); }

void DynamicBatchScheduler::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  std::vector<std::unique_ptr<Job>> leftover;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    leftover = queue_.TakeAll();
    scheduler_cv_.SignalAll();
    for (DeviceState& d : devices_) {
      d.inbox_cv->SignalAll();
      d.HandToPollingLane();  // It stops polling and finds stopping_.
    }
  }
  Fail(std::move(leftover), absl::UnavailableError("server is shutting down"),
       RejectReason::kShutdown);
  scheduler_thread_.join();
  std::vector<std::thread> lanes;
  {
    absl::MutexLock lock(&mu_);
    for (DeviceState& d : devices_) {
      for (std::thread& t : d.lanes) lanes.push_back(std::move(t));
    }
  }
  for (std::thread& t : lanes) t.join();
}

absl::Status DynamicBatchScheduler::Submit(std::unique_ptr<Job> job) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || draining_) {
    if (metrics_ != nullptr) metrics_->Rejected(RejectReason::kShutdown);
    return absl::UnavailableError("server is shutting down; retry on another replica");
  }
  if (!AnyHealthyLocked()) {
    return absl::UnavailableError("no healthy device to run on");
  }
  absl::Status status = queue_.Push(job, absl::Now());
  if (!status.ok()) {
    if (metrics_ != nullptr) metrics_->Rejected(RejectReason::kQueueFull);
    return status;
  }
  ++accepted_;
  // A due batch goes to a free lane now, from this thread; the scheduler
  // thread is woken only if the job brings its next timed event forward.
  // Expired jobs are left to it (failing them here would run other jobs'
  // callbacks inside this call).
  WakeSchedulerIfLateLocked(StepLocked(absl::Now(), /*reaped=*/nullptr, /*self_device=*/-1));
  return absl::OkStatus();
}

bool DynamicBatchScheduler::Cancel(uint64_t id) {
  std::unique_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    job = queue_.Remove(id);
    if (job == nullptr) return false;
    if (metrics_ != nullptr) metrics_->SetQueueDepth(queue_.size());
    wake_ = true;
    scheduler_cv_.Signal();
  }
  // gRPC cancels a call whose deadline passes; its timers work in whole
  // milliseconds and can fire just before the deadline we hold.
  constexpr absl::Duration kTimerSlack = absl::Milliseconds(5);
  const bool expired = absl::Now() + kTimerSlack >= job->deadline;
  std::vector<std::unique_ptr<Job>> jobs;
  jobs.push_back(std::move(job));
  if (expired) {
    Fail(std::move(jobs), absl::DeadlineExceededError("deadline passed while the request was queued"),
         RejectReason::kDeadline);
  } else {
    Fail(std::move(jobs), absl::CancelledError("cancelled by the client while queued"),
         RejectReason::kCancelled);
  }
  return true;
}

bool DynamicBatchScheduler::Drain(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  wake_ = true;
  scheduler_cv_.Signal();
  auto all_ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return accepted_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&all_ended), deadline);
}

size_t DynamicBatchScheduler::QueueDepth() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

bool DynamicBatchScheduler::AnyHealthyLocked() const {
  for (const DeviceState& d : devices_) {
    if (d.load.healthy) return true;
  }
  return false;
}

void DynamicBatchScheduler::UpdateBusyLocked(int device, absl::Time now) {
  DeviceState& d = devices_[device];
  if (d.running > 0 && metrics_ != nullptr) {
    metrics_->AddDeviceBusy(device, absl::ToDoubleSeconds(now - d.last_change));
  }
  d.last_change = now;
}

void DynamicBatchScheduler::Fail(std::vector<std::unique_ptr<Job>> jobs,
                                 const absl::Status& status, RejectReason reason) {
  if (jobs.empty()) return;
  for (std::unique_ptr<Job>& job : jobs) {
    JobOutcome outcome;
    outcome.status = status;
    if (metrics_ != nullptr) metrics_->Rejected(reason);
    job->on_done(outcome);
  }
  absl::MutexLock lock(&mu_);
  accepted_ -= static_cast<int64_t>(jobs.size());
}

bool DynamicBatchScheduler::StepLocked(absl::Time now, Reaped* reaped, int self_device) {
  if (reaped != nullptr) {
    reaped->expired = queue_.TakeExpired(now);
    if (!AnyHealthyLocked()) reaped->stranded = queue_.TakeAll();
  }
  std::vector<DeviceLoad> loads;
  bool self_claimed = false;
  while (true) {
    loads.clear();
    for (const DeviceState& d : devices_) loads.push_back(d.load);
    int device = PickDevice(loads);
    std::vector<std::unique_ptr<Job>> jobs;
    if (device >= 0) {
      const int running = options_.lanes_per_device - devices_[device].load.free_lanes;
      jobs = queue_.TakeBatch(now, draining_ || running < dispatch_eager_below_);
    }
    if (jobs.empty()) {
      if (metrics_ != nullptr) metrics_->SetQueueDepth(queue_.size());
      return device >= 0;
    }
    // A batch with kept operands goes where most of their bytes are.
    std::vector<uint64_t> resident(devices_.size(), 0);
    for (const auto& job : jobs) {
      if (job->resident == nullptr) continue;
      for (size_t d = 0; d < devices_.size(); ++d) resident[d] += job->resident->BytesOn(static_cast<int>(d));
    }
    device = PickDeviceFor(loads, resident, device);
    Batch batch;
    for (const auto& job : jobs) batch.flops += ProblemFlops(job->problem);
    batch.jobs = std::move(jobs);
    batch.dispatched = now;
    DeviceState& d = devices_[device];
    --d.load.free_lanes;
    d.load.outstanding_flops += batch.flops;
    d.inbox.push_back(std::move(batch));
    if (device == self_device && !self_claimed) {
      self_claimed = true;  // The calling lane takes it on its next look.
    } else if (!d.HandToPollingLane()) {  // A polling lane takes only one.
      d.inbox_cv->Signal();
    }
  }
}

absl::Time DynamicBatchScheduler::NextWakeLocked(bool lane_free) const {
  return lane_free ? queue_.NextEvent() : queue_.NextDeadline();
}

void DynamicBatchScheduler::WakeSchedulerIfLateLocked(bool lane_free) {
  if (NextWakeLocked(lane_free) < scheduler_sleeps_until_) {
    wake_ = true;
    scheduler_cv_.Signal();
  }
}

void DynamicBatchScheduler::FailReaped(Reaped reaped) {
  Fail(std::move(reaped.expired),
       absl::DeadlineExceededError("deadline passed while the request was queued"),
       RejectReason::kDeadline);
  Fail(std::move(reaped.stranded), absl::UnavailableError("no healthy device to run on"),
       RejectReason::kShutdown);
}

void DynamicBatchScheduler::SchedulerLoop() {
  NameThisThread("batch-sched");
  mu_.Lock();
  while (!stopping_) {
    Reaped reaped;
    const bool lane_free = StepLocked(absl::Now(), &reaped, /*self_device=*/-1);

    if (!reaped.expired.empty() || !reaped.stranded.empty()) {
      mu_.Unlock();
      FailReaped(std::move(reaped));
      mu_.Lock();
      continue;
    }

    // With a free lane, wake for the next batch or deadline; with none, only
    // for deadlines (a lane finishing applies the policy itself).
    const absl::Time wake = NextWakeLocked(lane_free);
    scheduler_sleeps_until_ = wake;
    while (!wake_ && !stopping_ && absl::Now() < wake) {
      scheduler_cv_.WaitWithDeadline(&mu_, wake);
    }
    scheduler_sleeps_until_ = absl::InfinitePast();
    wake_ = false;
  }
  mu_.Unlock();
}

void DynamicBatchScheduler::LaneLoop(int device) {
  NameThisThread(absl::StrCat("lane-", device));
  while (true) {
    Batch batch;
    {
      absl::MutexLock lock(&mu_);
      DeviceState& d = devices_[device];
      if (d.inbox.empty() && !stopping_) PollInboxLocked(device);
      while (d.inbox.empty() && !stopping_) d.inbox_cv->Wait(&mu_);
      if (d.inbox.empty()) return;  // Stopping, and nothing left to run.
      batch = std::move(d.inbox.front());
      d.inbox.pop_front();
      UpdateBusyLocked(device, absl::Now());
      ++d.running;
    }
    RunBatch(device, std::move(batch));
  }
}

void DynamicBatchScheduler::PollInboxLocked(int device) {
  DeviceState& d = devices_[device];
  if (options_.lane_spin <= absl::ZeroDuration() || d.polling_ticket != 0) return;
  const uint64_t ticket = ++d.last_ticket;
  d.polling_ticket = ticket;
  const std::atomic<uint64_t>& claimed = *d.claimed_ticket;
  mu_.Unlock();
  const absl::Time until = absl::Now() + options_.lane_spin;
  while (claimed.load(std::memory_order_acquire) != ticket) {
    for (int i = 0; i < 32; ++i) CpuRelax();
    if (absl::Now() >= until) break;
  }
  mu_.Lock();
  // Unclaimed, later batches wake a sleeping lane instead. Claimed, the
  // batch is in the inbox, or a lane that looked first took it and left its
  // own; either way the caller finds work or sleeps with nothing lost.
  if (d.polling_ticket == ticket) d.polling_ticket = 0;
}

void DynamicBatchScheduler::RunBatch(int device, Batch batch) {
  Engine* engine;
  {
    absl::MutexLock lock(&mu_);
    engine = devices_[device].engine;
  }
  const size_t n = batch.jobs.size();
  std::vector<absl::Status> status(n);
  // Jobs whose output could be allocated go to the engine; the others fail.
  std::vector<GemmProblem> problems;
  std::vector<size_t> runnable;
  problems.reserve(n);
  runnable.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Job& job = *batch.jobs[i];
    if (job.resident != nullptr) {
      status[i] = job.resident->Bind(device, *engine, job.problem);
      if (!status[i].ok()) continue;
    }
    if (job.output != nullptr) {
      status[i] = job.output->Allocate(job.output_bytes, engine->HostBuffers());
      if (!status[i].ok()) continue;
      job.problem.d = job.output->data();
      if (job.output->pinned()) job.problem.host_pinned |= kResidentD;
    }
    problems.push_back(job.problem);
    runnable.push_back(i);
  }
  const absl::Time start = absl::Now();
  if (!problems.empty()) {
    std::vector<absl::Status> engine_status(problems.size());
    engine->Run(problems, absl::MakeSpan(engine_status));
    for (size_t r = 0; r < runnable.size(); ++r) status[runnable[r]] = std::move(engine_status[r]);
  }
  for (size_t i = 0; i < n; ++i) {
    Job& job = *batch.jobs[i];
    if (job.resident != nullptr) status[i] = job.resident->Complete(status[i]);
  }
  const absl::Time end = absl::Now();
  // Metrics first: a caller that reads /metrics right after its answer sees
  // its batch counted.
  if (metrics_ != nullptr && !batch.jobs.empty()) {
    metrics_->BatchFinished(device, n, batch.flops, absl::ToDoubleSeconds(end - start),
                            batch.jobs.front()->problem.input_type);
    const EngineStats stats = engine->Stats();
    metrics_->SetDeviceMemory(device, stats.memory_in_use_bytes, stats.memory_capacity_bytes);
  }
  const std::string& device_id = engine->Device().id;
  for (size_t i = 0; i < n; ++i) {
    Job& job = *batch.jobs[i];
    JobOutcome outcome;
    outcome.status = std::move(status[i]);
    outcome.queue_time = start - job.arrival;
    outcome.compute_time = end - start;
    outcome.batch_size = static_cast<uint32_t>(n);
    outcome.device = device_id;
    if (metrics_ != nullptr) metrics_->QueueTime(absl::ToDoubleSeconds(outcome.queue_time));
    job.on_done(outcome);
  }
  const bool healthy = engine->Healthy();
  int failed_healthy_left = -1;
  Reaped reaped;
  {
    absl::MutexLock lock(&mu_);
    DeviceState& d = devices_[device];
    UpdateBusyLocked(device, absl::Now());
    --d.running;
    ++d.load.free_lanes;
    d.load.outstanding_flops -= batch.flops;
    if (d.load.healthy && !healthy) {
      if (metrics_ != nullptr) metrics_->SetDeviceHealthy(device, false);
      failed_healthy_left = 0;
      for (const DeviceState& other : devices_) {
        if (&other != &d && other.load.healthy) ++failed_healthy_left;
      }
    }
    d.load.healthy = healthy;
    accepted_ -= static_cast<int64_t>(n);
    // This lane is free again: apply the policy here, so the next due batch
    // (possibly its own) leaves without waking the scheduler thread.
    // (A device that just failed gets nothing: PickDevice skips it.)
    WakeSchedulerIfLateLocked(StepLocked(absl::Now(), &reaped, device));
  }
  FailReaped(std::move(reaped));
  if (failed_healthy_left >= 0 && options_.on_device_failed) {
    options_.on_device_failed(device, failed_healthy_left);
  }
}

}  // namespace matmul::server
