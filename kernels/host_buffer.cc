#include "kernels/host_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <utility>

namespace matmul {

// What a buffer owns: its memory, and the pool that memory returns to.
struct HostBuffer::Block {
  // The pool of pinned memory; null for heap memory.
  HostBufferPool* pool = nullptr;
  void* data = nullptr;
  // Bytes asked for, and the class capacity behind them (pinned only).
  size_t size = 0;
  size_t capacity = 0;
};

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    block_ = std::exchange(other.block_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    pinned_ = std::exchange(other.pinned_, false);
  }
  return *this;
}

HostBuffer::HostBuffer(Block* block)
    : block_(block), data_(block->data), size_(block->size), pinned_(block->pool != nullptr) {}

HostBuffer HostBuffer::Allocate(HostBufferPool* pool, size_t bytes) {
  Block* block = new (std::nothrow) Block;
  if (block == nullptr) return HostBuffer();
  block->size = bytes;
  if (pool != nullptr) {
    block->data = pool->TakePinned(bytes, &block->capacity);
    if (block->data != nullptr) {
      block->pool = pool;
      return HostBuffer(block);
    }
    pool->CountHeap();
  }
  block->data = std::malloc(bytes == 0 ? 1 : bytes);
  if (block->data == nullptr) {
    delete block;
    return HostBuffer();
  }
  return HostBuffer(block);
}

void HostBuffer::Reset() {
  FreeToken(ReleaseToken());
}

void* HostBuffer::ReleaseToken() {
  Block* block = std::exchange(block_, nullptr);
  data_ = nullptr;
  size_ = 0;
  pinned_ = false;
  return block;
}

void HostBuffer::FreeToken(void* token) {
  Block* block = static_cast<Block*>(token);
  if (block == nullptr) return;
  if (block->pool != nullptr) {
    block->pool->GivePinned(block->data, block->capacity);
  } else {
    std::free(block->data);
  }
  delete block;
}

HostBufferPool::HostBufferPool(PinFn pin, UnpinFn unpin, uint64_t budget, size_t min_bytes)
    : pin_(pin), unpin_(unpin), budget_(budget), min_bytes_(min_bytes) {}

HostBufferPool::~HostBufferPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [capacity, buffers] : free_) {
    for (void* p : buffers) unpin_(p);
  }
}

size_t HostBufferPool::ClassBytes(size_t bytes) {
  // 4096-byte pages at least; above that, 4 steps per power of two.
  if (bytes <= 4096) return 4096;
  int octave = 63 - __builtin_clzll(static_cast<unsigned long long>(bytes - 1));
  const size_t base = size_t{1} << octave;  // base < bytes <= 2 * base
  const size_t step = base / 4;
  return base + (bytes - base + step - 1) / step * step;
}

HostBufferPool::Stats HostBufferPool::GetStats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void HostBufferPool::CountHeap() {
  absl::MutexLock lock(&mu_);
  ++stats_.heap_allocations;
}

void* HostBufferPool::TakePinned(size_t bytes, size_t* capacity) {
  if (bytes < min_bytes_ || bytes == 0) return nullptr;
  const size_t want = ClassBytes(bytes);
  std::vector<void*> to_unpin;
  bool fits = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [cap, buffers] : free_) {
      if (cap == want && !buffers.empty()) {
        void* p = buffers.back();
        buffers.pop_back();
        stats_.in_use_bytes += want;
        ++stats_.pinned_allocations;
        *capacity = want;
        return p;
      }
    }
    // Room for a new one, unpinning cached buffers of other sizes if that
    // makes it.
    if (want > budget_) return nullptr;
    for (auto& [cap, buffers] : free_) {
      while (stats_.pinned_bytes + want > budget_ && !buffers.empty()) {
        to_unpin.push_back(buffers.back());
        buffers.pop_back();
        stats_.pinned_bytes -= cap;
      }
    }
    fits = stats_.pinned_bytes + want <= budget_;
    if (fits) {
      // Reserve the bytes before pinning outside the lock.
      stats_.pinned_bytes += want;
      stats_.in_use_bytes += want;
    }
  }
  for (void* p : to_unpin) unpin_(p);
  // Everything pinned is in use: the caller goes to the heap.
  if (!fits) return nullptr;
  void* p = pin_(want);
  absl::MutexLock lock(&mu_);
  if (p == nullptr) {
    stats_.pinned_bytes -= want;
    stats_.in_use_bytes -= want;
    return nullptr;
  }
  ++stats_.pinned_allocations;
  *capacity = want;
  return p;
}

void HostBufferPool::GivePinned(void* data, size_t capacity) {
  absl::MutexLock lock(&mu_);
  stats_.in_use_bytes -= capacity;
  for (auto& [cap, buffers] : free_) {
    if (cap == capacity) {
      buffers.push_back(data);
      return;
    }
  }
  free_.emplace_back(capacity, std::vector<void*>{data});
}

}  // namespace matmul
