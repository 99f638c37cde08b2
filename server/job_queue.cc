#include "server/job_queue.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace matmul::server {

absl::Status JobQueue::Push(std::unique_ptr<Job>& job, absl::Time now) {
  if (index_.size() >= options_.capacity) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("queue is full (%d jobs waiting, queue_capacity %d); retry later",
                        index_.size(), options_.capacity));
  }
  const uint64_t job_bytes = ProblemBytes(job->problem);
  if (bytes_ + job_bytes > options_.max_bytes && !index_.empty()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "queue is full (%d bytes waiting, this job needs %d, limit %d); retry later", bytes_,
        job_bytes, options_.max_bytes));
  }
  job->enqueued = now;
  last_push_ = std::max(last_push_, now);
  const uint64_t id = job->id;
  const int32_t priority = job->priority;
  const absl::Time deadline = job->deadline;
  Level& level = levels_[priority];
  level.push_back(std::move(job));
  index_[id] = Slot{priority, std::prev(level.end())};
  if (deadline != absl::InfiniteFuture()) deadlines_.emplace(deadline, id);
  bytes_ += job_bytes;
  return absl::OkStatus();
}

std::unique_ptr<Job> JobQueue::Unlink(uint64_t id) {
  auto slot = index_.find(id);
  if (slot == index_.end()) return nullptr;
  auto level = levels_.find(slot->second.priority);
  std::unique_ptr<Job> job = std::move(*slot->second.it);
  level->second.erase(slot->second.it);
  if (level->second.empty()) levels_.erase(level);
  index_.erase(slot);
  if (job->deadline != absl::InfiniteFuture()) deadlines_.erase({job->deadline, id});
  bytes_ -= ProblemBytes(job->problem);
  return job;
}

std::unique_ptr<Job> JobQueue::Remove(uint64_t id) { return Unlink(id); }

std::vector<std::unique_ptr<Job>> JobQueue::TakeExpired(absl::Time now) {
  std::vector<std::unique_ptr<Job>> expired;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    expired.push_back(Unlink(deadlines_.begin()->second));
  }
  return expired;
}

int64_t JobQueue::EffectivePriority(const Job& job, absl::Time now) const {
  int64_t boost = 0;
  if (options_.priority_aging > absl::ZeroDuration() && now > job.enqueued) {
    absl::Duration remainder;  // IDivDuration requires somewhere to put it.
    boost = absl::IDivDuration(now - job.enqueued, options_.priority_aging, &remainder);
  }
  return static_cast<int64_t>(job.priority) + boost;
}

const Job& JobQueue::Leader(absl::Time now) const {
  const Job* best = nullptr;
  int64_t best_priority = 0;
  // The front of each level is its oldest, hence most aged, job.
  for (const auto& [priority, level] : levels_) {
    const Job& front = *level.front();
    const int64_t p = EffectivePriority(front, now);
    if (best == nullptr || p > best_priority ||
        (p == best_priority && front.enqueued < best->enqueued)) {
      best = &front;
      best_priority = p;
    }
  }
  return *best;
}

absl::Time JobQueue::OldestEnqueue() const {
  absl::Time oldest = absl::InfiniteFuture();
  for (const auto& [priority, level] : levels_) {
    oldest = std::min(oldest, level.front()->enqueued);
  }
  return oldest;
}

absl::Time JobQueue::DueAt() const {
  absl::Time due = OldestEnqueue() + options_.max_queue_delay;
  if (options_.max_queue_gap > absl::ZeroDuration()) {
    due = std::min(due, last_push_ + options_.max_queue_gap);
  }
  return due;
}

std::vector<std::unique_ptr<Job>> JobQueue::TakeBatch(absl::Time now, bool flush) {
  if (empty()) return {};
  const Job& leader = Leader(now);
  const BatchKey key = KeyOf(leader.problem);
  const size_t max_size = std::max<size_t>(1, options_.max_batch_size);

  std::vector<uint64_t> members = {leader.id};
  double flops = ProblemFlops(leader.problem);
  uint64_t bytes = ProblemBytes(leader.problem);
  bool full = members.size() >= max_size;
  for (auto level = levels_.begin(); level != levels_.end() && !full; ++level) {
    for (const std::unique_ptr<Job>& job : level->second) {
      if (job.get() == &leader || !(KeyOf(job->problem) == key)) continue;
      const double job_flops = ProblemFlops(job->problem);
      const uint64_t job_bytes = ProblemBytes(job->problem);
      if (flops + job_flops > options_.max_batch_flops ||
          (options_.max_batch_bytes > 0 && bytes + job_bytes > options_.max_batch_bytes)) {
        full = true;  // A budget is reached.
        break;
      }
      members.push_back(job->id);
      flops += job_flops;
      bytes += job_bytes;
      if (members.size() >= max_size) {
        full = true;
        break;
      }
    }
  }
  if (!full && !flush && now < DueAt()) return {};

  std::vector<std::unique_ptr<Job>> batch;
  batch.reserve(members.size());
  for (uint64_t id : members) batch.push_back(Unlink(id));
  return batch;
}

std::vector<std::unique_ptr<Job>> JobQueue::TakeAll() {
  std::vector<std::unique_ptr<Job>> all;
  all.reserve(index_.size());
  for (auto& [priority, level] : levels_) {
    for (auto& job : level) all.push_back(std::move(job));
  }
  levels_.clear();
  index_.clear();
  deadlines_.clear();
  bytes_ = 0;
  return all;
}

absl::Time JobQueue::NextEvent() const {
  if (empty()) return absl::InfiniteFuture();
  absl::Time next = DueAt();
  if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
  return next;
}

absl::Time JobQueue::NextDeadline() const {
  return deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
}

}  // namespace matmul::server
