// A small HTTP/1.1 endpoint that serves a prometheus-cpp registry at
// /metrics in the Prometheus text format.
//
//   auto endpoint = MetricsEndpoint::Create("0.0.0.0:9090", registry);
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
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace matmul::server {

class MetricsEndpoint {
 public:
  // Binds `address` ("host:port"; port 0 picks one) and starts serving.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Create(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsEndpoint();

  int port() const { return port_; }

 private:
  MetricsEndpoint(int listen_fd, int port, std::shared_ptr<prometheus::Registry> registry);
  void Serve();
  void HandleConnection(int fd);

  const int listen_fd_;
  const int port_;
  const std::shared_ptr<prometheus::Registry> registry_;
  // Wakes the serving thread up for shutdown.
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace matmul::server

#endif  // MATMUL_SERVER_METRICS_ENDPOINT_H_
