// A device-memory pool carved out of one cudaMalloc made at start-up, so
// that no request pays for (or fails in) cudaMalloc.
//
//   auto pool = DevicePool::Create(/*device=*/0, 40ull << 30);
//   absl::StatusOr<void*> p = (*pool)->Allocate(bytes);   // waits its turn
//   ...
//   (*pool)->Free(*p);
//
// First fit over free ranges (256-byte granularity). Requests are served in
// arrival order: one that does not fit now waits, and later ones queue
// behind it, so a large batch is not starved by small ones. A request larger
// than the whole pool fails at once with RESOURCE_EXHAUSTED.
#ifndef MATMUL_KERNELS_CUDA_DEVICE_POOL_H_
#define MATMUL_KERNELS_CUDA_DEVICE_POOL_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace matmul::cuda {

class DevicePool {
 public:
  // Allocates `bytes` on `device` (the calling thread's device is set).
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(int device, uint64_t bytes);
  ~DevicePool();

  absl::StatusOr<void*> Allocate(uint64_t bytes);
  // Like Allocate, but RESOURCE_EXHAUSTED at once instead of waiting when
  // no free range fits now.
  absl::StatusOr<void*> TryAllocate(uint64_t bytes);
  void Free(void* ptr);

  uint64_t capacity() const { return capacity_; }
  uint64_t in_use() const;

 private:
  DevicePool(uint8_t* base, uint64_t capacity);
  // First free range that fits, or nullptr.
  uint8_t* TryAllocateLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint8_t* const base_;
  const uint64_t capacity_;
  mutable absl::Mutex mu_;
  // Free ranges by offset -> size; adjacent ranges are merged.
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);
  // Allocated ranges by offset -> size.
  std::map<uint64_t, uint64_t> used_ ABSL_GUARDED_BY(mu_);
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  // FIFO tickets: next to hand out, and the one being served.
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t serving_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace matmul::cuda

#endif  // MATMUL_KERNELS_CUDA_DEVICE_POOL_H_
