// Helpers shared by the tests: a controllable fake engine, a matmul-server
// child process, an in-process server on loopback, a per-thread random
// generator, and a tiny HTTP client for /metrics.
//
//   FakeEngine engine("fake:0");
//   engine.Block();                    // batches wait until Unblock()
//   auto server = ServerProcess::Start({"--backend=cpu"});
//   std::string text = HttpGet((*server)->metrics_port(), "/metrics");
//   double n = MetricSum(text, "matmul_requests_total{code=\"OK\"");
#ifndef MATMUL_TESTS_UTIL_TEST_UTIL_H_
#define MATMUL_TESTS_UTIL_TEST_UTIL_H_

#include <sys/types.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/matmul_client.h"
#include "kernels/engine.h"
#include "server/server.h"

namespace matmul::testing {

// An engine that computes real results (through the CPU engine) but can be
// held, counted and made to fail.
class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(std::string id);

  const DeviceDescription& Device() const override { return device_; }
  absl::string_view Name() const override { return "fake"; }
  void Run(absl::Span<const GemmProblem> problems, absl::Span<absl::Status> status) override;
  bool Healthy() const override;
  HostBufferPool* HostBuffers() const override { return host_buffers_; }

  // Offers `pool` (which must outlive the server) as HostBuffers(), as the
  // CUDA engine offers its pinned memory. Before the server starts.
  void UseHostBuffers(HostBufferPool* pool) { host_buffers_ = pool; }
  // Of the problems run so far, how many had each host_pinned bit
  // (kResidentA, B, C, D) set; bit i's count is element log2(bit).
  std::vector<int> pinned_counts() const;

  // Batches that start from now on wait until Unblock().
  void Block();
  void Unblock();
  // Blocks until `n` batches have started (in total).
  void WaitForBatches(int n);
  // After `n` more batches, the engine fails them with INTERNAL and reports
  // itself unhealthy.
  void FailAfter(int n);

  int batches() const;
  int problems() const;
  std::vector<size_t> batch_sizes() const;

 private:
  DeviceDescription device_;
  mutable absl::Mutex mu_;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  int batches_ ABSL_GUARDED_BY(mu_) = 0;
  int problems_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_after_ ABSL_GUARDED_BY(mu_) = -1;
  bool healthy_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<size_t> sizes_ ABSL_GUARDED_BY(mu_);
  std::vector<int> pinned_counts_ ABSL_GUARDED_BY(mu_) = std::vector<int>(4, 0);
  HostBufferPool* host_buffers_ = nullptr;
};

// matmul-server started from the built binary on loopback ports chosen by
// the kernel (port 0). Killed on destruction if still running.
class ServerProcess {
 public:
  // `log_file`, when set, receives the server's stdout and stderr.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::vector<std::string>& flags, const std::string& log_file = "");
  ~ServerProcess();

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }

  void Signal(int signal);
  // Waits for the process to exit; returns its exit code (128+signal when
  // killed by a signal).
  int Wait();

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  bool exited_ = false;
  int exit_code_ = 0;
  std::string dir_;
};

// A freshly seeded generator per thread: every run draws new inputs, and
// concurrent callers never share one.
std::mt19937_64& Rng();

// CPU backend, gRPC and /metrics on loopback ports the kernel picks.
server::ServerConfig LoopbackConfig();
// An in-process server (a gtest failure and null when it can't start).
std::unique_ptr<server::MatmulServer> StartServer(server::ServerConfig config = LoopbackConfig());
// A client of `server`, sending `token` when it is not empty.
std::unique_ptr<client::MatmulClient> Connect(const server::MatmulServer& server,
                                              const std::string& token = "");

// GET http://127.0.0.1:<port><path>; returns the body. Empty on failure.
std::string HttpGet(int port, const std::string& path);
// The status line and headers of GET `path` on 127.0.0.1:`port`.
std::string HttpResponseHead(int port, const std::string& path);

// Sum of the values of every sample in Prometheus text `metrics` whose line
// starts with `prefix` (e.g. "matmul_batch_size_count" or
// "matmul_requests_total{code=\"OK\"").
double MetricSum(const std::string& metrics, const std::string& prefix);

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_UTIL_TEST_UTIL_H_
