// matmul-server as a library: engines, scheduler, gRPC service, health,
// reflection and the Prometheus endpoint, wired together.
//
//   ServerConfig config;
//   config.listen = "127.0.0.1:0";           // port 0: pick a free one
//   auto server = MatmulServer::Create(config);
//   int port = (*server)->port();
//   ...
//   (*server)->Shutdown(absl::Seconds(30));  // graceful drain
#ifndef MATMUL_SERVER_SERVER_H_
#define MATMUL_SERVER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/engine_factory.h"
#include "server/auth.h"
#include "server/dynamic_batch_scheduler.h"
#include "server/matmul_service.h"
#include "server/matrix_store.h"
#include "server/shared_memory.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"

namespace matmul::server {

// How long an idle GPU lane polls for its next batch unless configured:
// on an H100 host it won a lone caller 4-36% more requests per second in
// each of 10 paired rounds against sleeping at once (docs/BENCHMARKS.md,
// twenty-first round), and a millisecond did worse under load.
inline constexpr absl::Duration kCudaLaneSpin = absl::Microseconds(200);

struct ServerConfig {
  // gRPC address; port 0 picks a free port (see MatmulServer::port()).
  std::string listen = "0.0.0.0:50051";
  // Prometheus /metrics address; empty turns the endpoint off.
  std::string metrics_listen = "0.0.0.0:9090";
  // Which engines to run (backend, devices, workers).
  EngineOptions engine;
  // Concurrent batches per device; 0 picks 1 for the CPU, 4 for CUDA.
  int lanes_per_device = 0;
  // A device with no batch running takes queued jobs at once instead of
  // waiting out queue.max_queue_delay (DynamicBatchScheduler::Options).
  bool dispatch_when_idle = true;
  // DynamicBatchScheduler::Options::dispatch_below_running.
  int dispatch_below_running = 0;
  // DynamicBatchScheduler::Options::lane_spin; negative picks one per
  // backend: kCudaLaneSpin on a GPU, none on the CPU (where the poll takes a
  // core from OpenBLAS).
  absl::Duration lane_spin = absl::Microseconds(-1);
  // Batching and queue policy. max_batch_flops <= 0 picks a default per
  // backend (CPU 2e10, CUDA 1e12).
  JobQueue::Options queue;
  // Largest request message gRPC accepts.
  uint64_t max_request_bytes = 256ull << 20;
  // Extra gRPC channel arguments for the server (name, value), e.g.
  // {"grpc.http2.max_frame_size", "1048576"}: a value that parses as an int
  // is passed as one, others as strings. gRPC ignores names it doesn't know.
  std::vector<std::pair<std::string, std::string>> grpc_args;
  // Request size limits (max_dim, max_response_bytes).
  RequestLimits limits;
  absl::Duration default_timeout = absl::ZeroDuration();
  int max_stream_inflight = 128;
  // On shutdown, time between health turning NOT_SERVING and the listener
  // closing, so that load balancers and clients' health watchers take the
  // server out of rotation first (new calls meanwhile get UNAVAILABLE,
  // which clients retry elsewhere).
  absl::Duration drain_delay = absl::Seconds(1);
  // TLS: PEM files of the server's certificate chain and key; with a client
  // CA, clients must present a certificate it signed (mutual TLS). Empty
  // means plain text. The metrics endpoint stays plain HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Bearer tokens (see auth.h); empty means no authentication.
  std::string auth_tokens_file;
  // Requests one client may have in flight; 0 means no limit.
  int max_inflight_per_client = 0;
  // Matrices kept between requests (see matrix_store.h). max_bytes 0 turns
  // PutMatrix, handles and store_result off. enforce_owner follows
  // auth_tokens_file.
  MatrixStore::Options resident;
  // Same-host clients may register POSIX shared memory for operands and
  // results (RegisterSharedMemory).
  bool shared_memory = false;
};

class MatmulServer {
 public:
  // Creates the engines named by config.engine and starts serving.
  static absl::StatusOr<std::unique_ptr<MatmulServer>> Create(ServerConfig config);
  // Same, with engines made by the caller (tests use fakes).
  static absl::StatusOr<std::unique_ptr<MatmulServer>> Create(ServerConfig config,
                                                              EngineSet engines);

  // Shutdown(0) when not done yet.
  ~MatmulServer();

  // The bound gRPC port.
  int port() const { return port_; }
  // The bound metrics port; 0 when the endpoint is off.
  int metrics_port() const { return metrics_port_; }
  const std::string& backend() const { return engines_.backend; }
  const ServerConfig& config() const { return config_; }
  v1::ServerInfo Info() const;

  // Graceful stop: health turns NOT_SERVING, new calls get UNAVAILABLE,
  // every accepted request is answered, and after config().drain_delay (at
  // most `grace`) the listener closes. Whatever is still queued after
  // `grace` ends UNAVAILABLE. Returns whether everything accepted was
  // answered in time. Idempotent.
  bool Shutdown(absl::Duration grace);

  // Re-reads the token file (SIGHUP); FAILED_PRECONDITION without one.
  absl::Status ReloadTokens();

 private:
  MatmulServer(ServerConfig config, EngineSet engines);
  absl::Status Start();
  // Sets gRPC health (the whole server and kServiceName) and /readyz.
  void SetServing(bool serving);
  // Server credentials from the TLS settings.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials() const;

  ServerConfig config_;
  EngineSet engines_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<TokenAuthenticator> auth_;
  // Whether the server takes work: what gRPC health says and /readyz
  // answers (SetServing). Declared before the endpoint that reads it.
  std::atomic<bool> serving_{false};
  // Set once no device is healthy: /healthz then fails, as only a restart
  // brings a device back from a sticky CUDA error.
  std::atomic<bool> devices_lost_{false};
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  // Declared before the scheduler: it outlives the jobs that use it.
  std::unique_ptr<MatrixStore> store_;
  // Registered shared-memory regions (when enabled); outlives the jobs.
  std::unique_ptr<SharedMemoryRegistry> shared_memory_;
  std::unique_ptr<DynamicBatchScheduler> scheduler_;
  std::unique_ptr<MatmulServiceImpl> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int port_ = 0;
  int metrics_port_ = 0;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  bool drained_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace matmul::server

#endif  // MATMUL_SERVER_SERVER_H_
