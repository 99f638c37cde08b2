#include "server/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace matmul::server {

// One mapping; unmapped when the last holder lets go.
struct SharedMemoryRegistry::Region {
  ~Region() {
    if (mapping != nullptr) munmap(mapping, mapped_bytes);
  }
  std::string key;
  void* mapping = nullptr;
  size_t mapped_bytes = 0;
  // The registered range within the mapping.
  uint8_t* base = nullptr;
  uint64_t byte_size = 0;
};

absl::Status SharedMemoryRegistry::Register(const std::string& owner, const std::string& name,
                                            const std::string& key, uint64_t offset,
                                            uint64_t byte_size) {
  if (name.empty()) return absl::InvalidArgumentError("name: required");
  if (key.size() < 2 || key[0] != '/' || key.find('/', 1) != std::string::npos || key.size() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: expected a POSIX shared-memory name like \"/my-region\", got \"", key, "\""));
  }
  if (byte_size == 0) return absl::InvalidArgumentError("byte_size: must be at least 1");
  uint64_t end;
  if (__builtin_add_overflow(offset, byte_size, &end)) {
    return absl::InvalidArgumentError("offset + byte_size overflows 64 bits");
  }
  {
    absl::MutexLock lock(&mu_);
    if (regions_.contains({owner, name})) {
      return absl::AlreadyExistsError(absl::StrCat("name: region \"", name, "\" is already registered"));
    }
    int count = 0;
    for (const auto& [k, r] : regions_) count += k.first == owner;
    if (count >= kMaxRegionsPerClient) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this client has ", count, " shared-memory regions registered (the most allowed)"));
    }
  }
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return absl::NotFoundError(absl::StrCat("key: no shared-memory object ", key));
    return absl::PermissionDeniedError(
        absl::StrCat("key: cannot open ", key, ": ", std::strerror(e)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < end) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("offset, byte_size: [", offset, ", ", end,
                                                   ") is beyond ", key, " (", st.st_size, " bytes)"));
  }
  auto region = std::make_shared<Region>();
  region->key = key;
  region->mapped_bytes = static_cast<size_t>(end);
  region->mapping = mmap(nullptr, region->mapped_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (region->mapping == MAP_FAILED) {
    region->mapping = nullptr;
    return absl::InternalError(absl::StrCat("mapping ", key, ": ", std::strerror(errno)));
  }
  region->base = static_cast<uint8_t*>(region->mapping) + offset;
  region->byte_size = byte_size;
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = regions_.emplace(std::make_pair(owner, name), std::move(region));
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("name: region \"", name, "\" is already registered"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegistry::Unregister(const std::string& owner, const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (regions_.erase({owner, name}) == 0) {
    return absl::NotFoundError(absl::StrCat("name: no shared-memory region \"", name, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<SharedBytes> SharedMemoryRegistry::Resolve(const std::string& owner,
                                                          const v1::SharedMemoryRef& ref,
                                                          const std::string& field) const {
  std::shared_ptr<Region> region;
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find({owner, ref.region()});
    if (it != regions_.end()) region = it->second;
  }
  if (region == nullptr) {
    return absl::NotFoundError(absl::StrCat(field, ".region: no shared-memory region \"",
                                            ref.region(), "\" registered by this client"));
  }
  uint64_t end;
  if (__builtin_add_overflow(ref.offset(), ref.bytes(), &end) || end > region->byte_size) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": bytes [", ref.offset(), ", +",
                                                   ref.bytes(), ") leave region \"", ref.region(),
                                                   "\" of ", region->byte_size, " bytes"));
  }
  SharedBytes out;
  out.data = region->base + ref.offset();
  out.bytes = ref.bytes();
  out.hold = region;
  return out;
}

}  // namespace matmul::server
