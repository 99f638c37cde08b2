#include "kernels/cuda/device_pool.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/grouped_gemm.h"

namespace matmul::cuda {
namespace {
constexpr uint64_t kGranule = 256;
}  // namespace

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(int device, uint64_t bytes) {
  bytes = bytes / kGranule * kGranule;
  if (bytes == 0) return absl::InvalidArgumentError("device pool of 0 bytes");
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return absl::UnavailableError(CudaErrorString(e));
  void* base = nullptr;
  e = cudaMalloc(&base, bytes);
  if (e != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", bytes, " bytes on cuda:", device, ": ", CudaErrorString(e)));
  }
  return std::unique_ptr<DevicePool>(new DevicePool(static_cast<uint8_t*>(base), bytes));
}

DevicePool::DevicePool(uint8_t* base, uint64_t capacity) : base_(base), capacity_(capacity) {
  absl::MutexLock lock(&mu_);
  free_[0] = capacity;
}

DevicePool::~DevicePool() { cudaFree(base_); }

uint64_t DevicePool::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

uint8_t* DevicePool::TryAllocateLocked(uint64_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_[offset + bytes] = rest;
    used_[offset] = bytes;
    in_use_ += bytes;
    return base_ + offset;
  }
  return nullptr;
}

absl::StatusOr<void*> DevicePool::Allocate(uint64_t bytes) {
  bytes = (bytes + kGranule - 1) / kGranule * kGranule;
  if (bytes == 0) bytes = kGranule;
  if (bytes > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "needs ", bytes, " bytes of device memory; the pool holds ", capacity_));
  }
  absl::MutexLock lock(&mu_);
  const uint64_t ticket = next_ticket_++;
  // A pure condition (absl may evaluate it on other threads): our turn, and
  // some free range is large enough.
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (serving_ != ticket) return false;
    for (const auto& [offset, size] : free_) {
      if (size >= bytes) return true;
    }
    return false;
  };
  mu_.Await(absl::Condition(&ready));
  ++serving_;
  return TryAllocateLocked(bytes);
}

absl::StatusOr<void*> DevicePool::TryAllocate(uint64_t bytes) {
  bytes = (bytes + kGranule - 1) / kGranule * kGranule;
  if (bytes == 0) bytes = kGranule;
  absl::MutexLock lock(&mu_);
  // Waiting Allocate calls keep their turn.
  uint8_t* p = serving_ == next_ticket_ ? TryAllocateLocked(bytes) : nullptr;
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("needs ", bytes, " bytes of device memory; ",
                                                     in_use_, " of ", capacity_, " in use"));
  }
  return p;
}

void DevicePool::Free(void* ptr) {
  absl::MutexLock lock(&mu_);
  const uint64_t offset = static_cast<uint8_t*>(ptr) - base_;
  auto used = used_.find(offset);
  if (used == used_.end()) return;
  uint64_t size = used->second;
  in_use_ -= size;
  used_.erase(used);
  // Merge with the following and preceding free ranges.
  uint64_t start = offset;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
}

}  // namespace matmul::cuda
