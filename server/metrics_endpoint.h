// A small HTTP/1.1 endpoint that serves a prometheus-cpp registry at
// /metrics in the Prometheus text format, and the server's health for
// load balancers and probes that speak HTTP but not gRPC health: /healthz
// (liveness: 503 only where restarting the process is the way back, as
// when no device is healthy) and /readyz (200 while the server takes work,
// 503 while it starts, drains or has no healthy device, as gRPC health).
//
//   MetricsEndpoint::Probes probes;
//   probes.ready = [&] { return serving.load(); };
//   auto endpoint = MetricsEndpoint::Create("0.0.0.0:9090", registry, probes);
//   int port = (*endpoint)->port();
//
// Why not prometheus::Exposer: its civetweb threads run on 100 KB stacks
// (a Debian build setting), and glibc carves the process's static TLS out
// of every thread stack; OpenBLAS (60 KB) plus glog (30 KB) leave too little
// and the first scrape overflows the stack. This endpoint's thread has a
// normal stack. It answers one connection at a time, with short socket
// timeouts, which is plenty for scrapers.
#ifndef MATMUL_SERVER_METRICS_ENDPOINT_H_
#define MATMUL_SERVER_METRICS_ENDPOINT_H_

#include <prometheus/registry.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace matmul::server {

class MetricsEndpoint {
 public:
  // What /healthz and /readyz answer: each called on the endpoint's thread
  // per request (null: always 200), and callable until the endpoint is
  // destroyed.
  struct Probes {
    std::function<bool()> live;
    std::function<bool()> ready;
  };

  // Binds `address` ("host:port"; port 0 picks one) and starts serving.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Create(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry,
      Probes probes = {});
  ~MetricsEndpoint();

  int port() const { return port_; }

 private:
  MetricsEndpoint(int listen_fd, int port, std::shared_ptr<prometheus::Registry> registry,
                  Probes probes);
  void Serve();
  void HandleConnection(int fd);

  const int listen_fd_;
  const int port_;
  const std::shared_ptr<prometheus::Registry> registry_;
  // /healthz and /readyz.
  const Probes probes_;
  // Wakes the serving thread up for shutdown.
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace matmul::server

#endif  // MATMUL_SERVER_METRICS_ENDPOINT_H_
