#include "kernels/cuda/parallel_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"

namespace matmul::cuda {
namespace {

// Below this many bytes in total, copying on the calling thread is faster
// than handing work out.
constexpr size_t kParallelBytes = size_t{8} << 20;
// Pieces of about this size are handed to the pool.
constexpr size_t kPieceBytes = size_t{2} << 20;

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

}  // namespace

void RunCopies(const std::vector<CopyJob>& jobs) {
  size_t total = 0;
  for (const CopyJob& j : jobs) total += j.row_bytes * j.rows;
  if (total < kParallelBytes || Pool::Get().size() < 2) {
    for (const CopyJob& j : jobs) Copy(j);
    return;
  }
  // Split every job into pieces of whole rows.
  std::vector<CopyJob> pieces;
  for (const CopyJob& j : jobs) {
    const size_t rows_per_piece =
        std::max<size_t>(1, kPieceBytes / std::max<size_t>(j.row_bytes, 1));
    for (size_t r = 0; r < j.rows; r += rows_per_piece) {
      const size_t n = std::min(rows_per_piece, j.rows - r);
      pieces.push_back({static_cast<uint8_t*>(j.dst) + r * j.dst_pitch, j.dst_pitch,
                        static_cast<const uint8_t*>(j.src) + r * j.src_pitch, j.src_pitch,
                        j.row_bytes, n});
    }
  }
  // The pool's threads and this one share the pieces.
  const size_t workers = std::min(pieces.size(), Pool::Get().size() + 1);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < pieces.size(); i = next.fetch_add(1)) Copy(pieces[i]);
  };
  absl::BlockingCounter done(static_cast<int>(workers - 1));
  for (size_t w = 1; w < workers; ++w) {
    Pool::Get().Submit([&] {
      work();
      done.DecrementCount();
    });
  }
  work();
  done.Wait();
}

}  // namespace matmul::cuda
