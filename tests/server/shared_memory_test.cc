// Same-host shared memory end to end: a client maps a POSIX shared-memory
// object, registers it, and passes operands and receives results through
// it; regions are checked for bounds, sizes and ownership.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "kernels/reference_gemm.h"
#include "server/server.h"
#include "tests/util/test_util.h"

namespace matmul::server {
namespace {

using matmul::testing::Connect;
using matmul::testing::Rng;

using client::MatmulClient;
using client::ProblemSpec;
using ::testing::HasSubstr;

// A POSIX shared-memory object of `bytes`, mapped here; unlinked at the end.
class SharedObject {
 public:
  explicit SharedObject(size_t bytes)
      : key_(absl::StrCat("/matmul-test-", getpid(), "-", Rng()() % 1000000)), bytes_(bytes) {
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    data_ = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~SharedObject() {
    munmap(data_, bytes_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  uint8_t* data() { return data_; }

 private:
  std::string key_;
  size_t bytes_;
  uint8_t* data_;
};

std::unique_ptr<MatmulServer> StartServer(bool shared_memory, const std::string& tokens = "") {
  ServerConfig config;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "";
  config.engine.backend = "cpu";
  config.shared_memory = shared_memory;
  config.auth_tokens_file = tokens;
  auto server = MatmulServer::Create(std::move(config));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

absl::Status Register(const MatmulClient& c, const std::string& name, const std::string& key,
                      uint64_t offset, uint64_t size) {
  grpc::ClientContext context;
  c.PrepareContext(&context);
  v1::RegisterSharedMemoryRequest request;
  request.set_name(name);
  request.set_key(key);
  request.set_offset(offset);
  request.set_byte_size(size);
  v1::RegisterSharedMemoryResponse response;
  return client::FromGrpc(c.stub()->RegisterSharedMemory(&context, request, &response));
}

v1::SharedMemoryRef Ref(const std::string& region, uint64_t offset, uint64_t bytes) {
  v1::SharedMemoryRef ref;
  ref.set_region(region);
  ref.set_offset(offset);
  ref.set_bytes(bytes);
  return ref;
}

// `m` with its data moved to `object` at `offset` and named by `ref`.
void MoveToShared(v1::Matrix* m, SharedObject& object, uint64_t region_offset, uint64_t offset) {
  std::memcpy(object.data() + region_offset + offset, m->data().data(), m->data().size());
  *m->mutable_shm() = Ref("r", offset, m->data().size());
  m->clear_data();
}

TEST(SharedMemoryTest, OperandsAndResultsThroughSharedMemoryAreCorrect) {
  auto server = StartServer(true);
  auto c = Connect(*server);
  SharedObject object(8 << 20);
  // The registered range starts 4096 bytes into the object.
  ASSERT_TRUE(Register(*c, "r", object.key(), 4096, (8 << 20) - 4096).ok());
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
    ProblemSpec spec{.m = 70, .n = 50, .k = 90, .dtype = dtype, .alpha = 0.5, .beta = 2.0};
    const v1::MultiplyRequest inline_request = client::RandomRequest(spec, Rng());
    v1::MultiplyRequest request = inline_request;
    MoveToShared(request.mutable_a(), object, 4096, 0);
    MoveToShared(request.mutable_b(), object, 4096, 1 << 20);
    MoveToShared(request.mutable_c(), object, 4096, 2 << 20);
    const uint64_t out_bytes = 70 * 50 * ElementSize(dtype);
    *request.mutable_output_shm() = Ref("r", 3 << 20, out_bytes);
    std::memset(object.data() + 4096 + (3 << 20), 0xff, out_bytes);
    absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(response->c().data().empty());
    EXPECT_EQ(response->c().rows(), 70u);
    // The result is in shared memory.
    v1::MultiplyResponse as_inline = *response;
    as_inline.mutable_c()->set_data(
        std::string(reinterpret_cast<const char*>(object.data() + 4096 + (3 << 20)), out_bytes));
    absl::StatusOr<double> err = client::CheckResponse(inline_request, as_inline);
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_LE(*err, ErrorBound(dtype, dtype, Precision::kDefault)) << DTypeName(dtype);
  }
}

TEST(SharedMemoryTest, RangesSizesAndRegistrationsAreChecked) {
  auto server = StartServer(true);
  auto c = Connect(*server);
  SharedObject object(1 << 20);
  EXPECT_EQ(Register(*c, "r", "/no-such-object-matmul", 0, 64).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Register(*c, "r", "no-slash", 0, 64).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Register(*c, "r", object.key(), 0, (1 << 20) + 1).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Register(*c, "r", object.key(), 0, 1 << 20).ok());
  EXPECT_EQ(Register(*c, "r", object.key(), 0, 64).code(), absl::StatusCode::kAlreadyExists);

  ProblemSpec spec{.m = 16, .n = 16, .k = 16, .dtype = DType::kFloat32};
  const v1::MultiplyRequest good = client::RandomRequest(spec, Rng());
  v1::MultiplyRequest r = good;
  MoveToShared(r.mutable_b(), object, 0, (1 << 20) - 1024);  // Fits exactly.
  EXPECT_TRUE(c->Multiply(r).ok());
  r.mutable_b()->mutable_shm()->set_offset((1 << 20) - 1023);  // One byte past the end.
  absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("b.shm"));
  r.mutable_b()->mutable_shm()->set_offset(0);
  r.mutable_b()->mutable_shm()->set_bytes(1000);  // Not 16 x 16 x 4.
  response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("b.shm.bytes: expected 1024"));
  r.mutable_b()->mutable_shm()->set_bytes(1024);
  r.mutable_b()->mutable_shm()->set_region("other");
  EXPECT_EQ(c->Multiply(r).status().code(), absl::StatusCode::kNotFound);
  r = good;
  *r.mutable_output_shm() = Ref("r", 0, 100);
  response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("output_shm.bytes"));
  r = good;
  r.mutable_b()->mutable_shm()->set_region("r");  // Data and shm both.
  EXPECT_EQ(c->Multiply(r).status().code(), absl::StatusCode::kInvalidArgument);

  // Unregistered: its name is unknown again.
  grpc::ClientContext context;
  v1::UnregisterSharedMemoryRequest unregister;
  unregister.set_name("r");
  v1::UnregisterSharedMemoryResponse unused;
  ASSERT_TRUE(c->stub()->UnregisterSharedMemory(&context, unregister, &unused).ok());
  r = good;
  MoveToShared(r.mutable_b(), object, 0, 0);
  EXPECT_EQ(c->Multiply(r).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(c->Multiply(good).ok());
}

TEST(SharedMemoryTest, ARegionIsOnlyItsOwnersWhenTokensAreOn) {
  const std::string tokens = ::testing::TempDir() + "/shm_tokens";
  std::ofstream(tokens) << "alice alice-secret-token\nbob bob-secret-token\n";
  auto server = StartServer(true, tokens);
  auto alice = Connect(*server, "alice-secret-token");
  auto bob = Connect(*server, "bob-secret-token");
  SharedObject object(1 << 16);
  ASSERT_TRUE(Register(*alice, "r", object.key(), 0, 1 << 16).ok());
  ProblemSpec spec{.m = 8, .n = 8, .k = 8, .dtype = DType::kFloat32};
  v1::MultiplyRequest r = client::RandomRequest(spec, Rng());
  MoveToShared(r.mutable_b(), object, 0, 0);
  EXPECT_TRUE(alice->Multiply(r).ok());
  absl::StatusOr<v1::MultiplyResponse> response = bob->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kNotFound);
  // Bob may register the same object under his own name for himself.
  EXPECT_TRUE(Register(*bob, "r", object.key(), 0, 1 << 16).ok());
  EXPECT_TRUE(bob->Multiply(r).ok());
}

TEST(SharedMemoryTest, OffByDefault) {
  auto server = StartServer(false);
  auto c = Connect(*server);
  SharedObject object(4096);
  EXPECT_EQ(Register(*c, "r", object.key(), 0, 4096).code(), absl::StatusCode::kFailedPrecondition);
  ProblemSpec spec{.m = 4, .n = 4, .k = 4, .dtype = DType::kFloat32};
  v1::MultiplyRequest r = client::RandomRequest(spec, Rng());
  MoveToShared(r.mutable_b(), object, 0, 0);
  absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("--shared_memory"));
}

}  // namespace
}  // namespace matmul::server
