// Shared-memory regions registered by same-host clients (sidecars), so that
// operands and results move through memory both processes map instead of
// through gRPC message bytes, as NVIDIA Triton's system shared memory does.
//
//   SharedMemoryRegistry registry;
//   registry.Register("alice", "weights", "/alice-weights", 0, 64 << 20);
//   absl::StatusOr<SharedBytes> b = registry.Resolve("alice", ref, "b.shm");
//   // b->data points into the mapping; b->hold keeps it mapped.
//
// A region is registered under the caller's identity (token name, or peer
// address without authentication) and only that caller may name it; every
// reference is checked against the registered range. The server maps the
// object read-write with the permissions it runs under; what the client
// writes while a product runs is the client's business (as with Triton).
#ifndef MATMUL_SERVER_SHARED_MEMORY_H_
#define MATMUL_SERVER_SHARED_MEMORY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul::server {

// A checked range of a mapped region.
struct SharedBytes {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  // Keeps the region mapped while held (e.g. by a running job).
  std::shared_ptr<const void> hold;
};

class SharedMemoryRegistry {
 public:
  // Most regions one client may register.
  static constexpr int kMaxRegionsPerClient = 64;

  SharedMemoryRegistry() = default;
  SharedMemoryRegistry(const SharedMemoryRegistry&) = delete;
  SharedMemoryRegistry& operator=(const SharedMemoryRegistry&) = delete;

  // Maps [offset, offset + byte_size) of the POSIX shared-memory object
  // `key` for `owner` as `name`. INVALID_ARGUMENT for a bad key or a range
  // beyond the object, NOT_FOUND when the object does not exist,
  // ALREADY_EXISTS for a name the owner uses, RESOURCE_EXHAUSTED past
  // kMaxRegionsPerClient.
  absl::Status Register(const std::string& owner, const std::string& name, const std::string& key,
                        uint64_t offset, uint64_t byte_size);
  // The region stays mapped until the last running job using it ends.
  absl::Status Unregister(const std::string& owner, const std::string& name);

  // The bytes `ref` names, for operand `field` ("a.shm", "output_shm"):
  // NOT_FOUND when `owner` registered no such region, INVALID_ARGUMENT when
  // the range leaves the region.
  absl::StatusOr<SharedBytes> Resolve(const std::string& owner, const v1::SharedMemoryRef& ref,
                                      const std::string& field) const;

 private:
  struct Region;

  mutable absl::Mutex mu_;
  // (owner, name) -> region.
  std::map<std::pair<std::string, std::string>, std::shared_ptr<Region>> regions_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace matmul::server

#endif  // MATMUL_SERVER_SHARED_MEMORY_H_
