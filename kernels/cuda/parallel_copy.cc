#include "kernels/cuda/parallel_copy.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace matmul::cuda {
namespace {

void Copy(const CopyJob& j) {
  if (j.dst_pitch == j.row_bytes && j.src_pitch == j.row_bytes) {
    std::memcpy(j.dst, j.src, j.row_bytes * j.rows);
    return;
  }
  auto* d = static_cast<uint8_t*>(j.dst);
  const auto* s = static_cast<const uint8_t*>(j.src);
  for (size_t r = 0; r < j.rows; ++r) std::memcpy(d + r * j.dst_pitch, s + r * j.src_pitch, j.row_bytes);
}

// A fixed set of threads taking tasks from one queue; lives for the process.
class Pool {
 public:
  static Pool& Get() {
    // Half the cores, at most 8: the GPU lanes and gRPC's threads keep
    // the rest.
    static Pool* pool = new Pool(std::clamp<unsigned>(std::thread::hardware_concurrency() / 2, 1, 8));
    return *pool;
  }
  size_t size() const { return threads_.size(); }
  void Submit(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }

 private:
  explicit Pool(unsigned n) {
    for (unsigned i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        while (true) {
          std::function<void()> task;
          {
            absl::MutexLock lock(&mu_);
            auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !tasks_.empty(); };
            mu_.Await(absl::Condition(&ready));
            task = std::move(tasks_.front());
            tasks_.pop_front();
          }
          task();
        }
      });
      threads_.back().detach();
    }
  }
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// One RunCopies call's pieces, shared with the pool tasks it submits (a
// task may start after the call has returned, and then finds nothing).
struct Shared {
  std::vector<CopyJob> pieces;
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  size_t done ABSL_GUARDED_BY(mu) = 0;  // Pieces copied.

  // Copies pieces until none is left; returns how many it copied.
  size_t Work() {
    size_t copied = 0;
    for (size_t i = next.fetch_add(1); i < pieces.size(); i = next.fetch_add(1)) {
      Copy(pieces[i]);
      ++copied;
    }
    return copied;
  }
  void Report(size_t copied) {
    if (copied == 0) return;
    absl::MutexLock lock(&mu);
    done += copied;
  }
};

}  // namespace

void RunCopies(const std::vector<CopyJob>& jobs, const CopyPolicy& policy) {
  size_t total = 0;
  for (const CopyJob& j : jobs) total += j.row_bytes * j.rows;
  // By default none on a host of fewer than four cores (a pool of one).
  const size_t pool = Pool::Get().size();
  const size_t helpers =
      policy.helpers >= 0 ? static_cast<size_t>(policy.helpers) : (pool < 2 ? 0 : pool);
  if (total < policy.parallel_bytes || helpers == 0 || total == 0) {
    for (const CopyJob& j : jobs) Copy(j);
    return;
  }
  auto shared = std::make_shared<Shared>();
  // Pieces: byte ranges of contiguous jobs, whole rows of the others.
  const size_t piece = std::max<size_t>(policy.piece_bytes, 1);
  for (const CopyJob& j : jobs) {
    auto* dst = static_cast<uint8_t*>(j.dst);
    const auto* src = static_cast<const uint8_t*>(j.src);
    if (j.dst_pitch == j.row_bytes && j.src_pitch == j.row_bytes) {
      const size_t bytes = j.row_bytes * j.rows;
      for (size_t at = 0; at < bytes; at += piece) {
        const size_t n = std::min(piece, bytes - at);
        shared->pieces.push_back({dst + at, n, src + at, n, n, 1});
      }
      continue;
    }
    const size_t rows_per_piece = std::max<size_t>(1, piece / std::max<size_t>(j.row_bytes, 1));
    for (size_t r = 0; r < j.rows; r += rows_per_piece) {
      const size_t n = std::min(rows_per_piece, j.rows - r);
      shared->pieces.push_back(
          {dst + r * j.dst_pitch, j.dst_pitch, src + r * j.src_pitch, j.src_pitch, j.row_bytes, n});
    }
  }
  const size_t count = shared->pieces.size();
  if (count < 2) {
    for (const CopyJob& j : jobs) Copy(j);
    return;
  }
  for (size_t w = 0; w < std::min(helpers, count - 1); ++w) {
    Pool::Get().Submit([shared] { shared->Report(shared->Work()); });
  }
  shared->Report(shared->Work());
  // Wait for the pieces other threads took; not for tasks that have not
  // started (they will find nothing to do).
  absl::MutexLock lock(&shared->mu);
  auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared->mu) { return shared->done == count; };
  shared->mu.Await(absl::Condition(&all_done));
}

}  // namespace matmul::cuda
