// Host buffers that an engine copies to and from at full speed.
//
// A GPU copies page-locked ("pinned") host memory by DMA at ~55 GB/s, and
// pageable memory at a tenth of that through a driver bounce buffer. So the
// server parses large operands straight into buffers from the engine's pool
// and lets the engine write large results into them: each operand and
// result then crosses host memory once, with no staging copy in between.
//
// A pool hands out buffers by size class and keeps freed ones for reuse
// (pinning memory is slow: milliseconds per large allocation). Past its
// budget it hands out ordinary heap memory instead, marked unpinned, which
// engines stage as before. Pools live as long as the process, so a buffer
// may be freed from any thread at any time (gRPC frees a response's slices
// after the call has ended).
//
//   HostBufferPool* pool = engine->HostBuffers();   // null: plain heap
//   HostBuffer buffer = HostBuffer::Allocate(pool, bytes);
//   if (buffer.data() == nullptr) ...               // out of memory
//   problem.a = buffer.data();
//   if (buffer.pinned()) problem.host_pinned |= kResidentA;
#ifndef MATMUL_KERNELS_HOST_BUFFER_H_
#define MATMUL_KERNELS_HOST_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace matmul {

class HostBufferPool;

// One buffer of host memory, owned (move-only). Empty when default-made.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { Reset(); }

  // `bytes` of uninitialised memory from `pool` (pinned while its budget
  // lasts), or from the heap when `pool` is null. data() is null when no
  // memory could be had.
  static HostBuffer Allocate(HostBufferPool* pool, size_t bytes);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // Page-locked memory: an engine may copy it to its device directly.
  bool pinned() const { return pinned_; }

  // Frees the memory now; empty afterwards.
  void Reset();

  // Gives up ownership for a C-style callback: returns a token that
  // FreeToken frees later, from any thread. Empty afterwards.
  void* ReleaseToken();
  static void FreeToken(void* token);

 private:
  struct Block;
  explicit HostBuffer(Block* block);

  // Where the memory came from; null when empty.
  Block* block_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

// Size-classed cache of page-locked buffers. Thread-safe.
class HostBufferPool {
 public:
  // How the pool pins and unpins memory (cudaHostAlloc / cudaFreeHost for a
  // GPU). `pin` returns null on failure.
  using PinFn = void* (*)(size_t bytes);
  using UnpinFn = void (*)(void* data);

  // `budget`: most bytes pinned at once, buffers in use and cached together.
  // Requests under `min_bytes` come from the heap: copying them twice costs
  // less than pinning.
  HostBufferPool(PinFn pin, UnpinFn unpin, uint64_t budget, size_t min_bytes = 64 << 10);
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;
  ~HostBufferPool();

  uint64_t budget() const { return budget_; }
  size_t min_bytes() const { return min_bytes_; }

  struct Stats {
    // Pinned bytes held (in use and cached) and in use by buffers now.
    uint64_t pinned_bytes = 0;
    uint64_t in_use_bytes = 0;
    // Buffers handed out pinned, and handed out from the heap because they
    // were small or the budget was spent.
    uint64_t pinned_allocations = 0;
    uint64_t heap_allocations = 0;
  };
  Stats GetStats() const;

  // The size class (capacity) a request of `bytes` is rounded up to: steps
  // of a quarter octave, so at most 25% of a buffer is unused.
  static size_t ClassBytes(size_t bytes);

 private:
  friend class HostBuffer;
  // Pinned memory of ClassBytes(bytes), from the cache or newly pinned;
  // null when small, over budget or when pinning fails.
  void* TakePinned(size_t bytes, size_t* capacity);
  void GivePinned(void* data, size_t capacity);
  void CountHeap();

  const PinFn pin_;
  const UnpinFn unpin_;
  const uint64_t budget_;
  const size_t min_bytes_;

  mutable absl::Mutex mu_;
  // Free pinned buffers by class capacity (small vectors; few classes are
  // ever used).
  std::vector<std::pair<size_t, std::vector<void*>>> free_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace matmul

#endif  // MATMUL_KERNELS_HOST_BUFFER_H_
