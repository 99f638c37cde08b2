#include "server/metrics_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace matmul::server {
namespace {

void SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void Respond(int fd, absl::string_view status, absl::string_view content_type,
             absl::string_view body, bool head_only) {
  SendAll(fd, absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                           "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n"));
  if (!head_only) SendAll(fd, body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Create(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry,
    Probes probes) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address \"", address,
                                                   "\" is not host:port"));
  }
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.empty() || host == "*" ? nullptr : host.c_str(),
                             port_text.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\": ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) break;
    error = strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int port = ntohs(bound.ss_family == AF_INET6
                             ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(fd, port, std::move(registry), std::move(probes)));
}

MetricsEndpoint::MetricsEndpoint(int listen_fd, int port,
                                 std::shared_ptr<prometheus::Registry> registry,
                                 Probes probes)
    : listen_fd_(listen_fd),
      port_(port),
      registry_(std::move(registry)),
      probes_(std::move(probes)) {
  if (pipe2(wake_pipe_, O_CLOEXEC) != 0) wake_pipe_[0] = wake_pipe_[1] = -1;
  thread_ = std::thread([this] { Serve(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  stopping_.store(true);
  if (wake_pipe_[1] >= 0) (void)!write(wake_pipe_[1], "x", 1);
  thread_.join();
  close(listen_fd_);
  if (wake_pipe_[0] >= 0) close(wake_pipe_[0]);
  if (wake_pipe_[1] >= 0) close(wake_pipe_[1]);
}

void MetricsEndpoint::Serve() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    const int n = poll(fds, wake_pipe_[0] >= 0 ? 2 : 1, 1000);
    if (n <= 0 || !(fds[0].revents & POLLIN)) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    timeval timeout{.tv_sec = 2, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    HandleConnection(fd);
    close(fd);
  }
}

void MetricsEndpoint::HandleConnection(int fd) {
  // Read the request head (up to 8 KiB).
  std::string head;
  char buffer[2048];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < 8192) {
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    head.append(buffer, static_cast<size_t>(n));
  }
  const size_t line_end = head.find("\r\n");
  const absl::string_view line = absl::string_view(head).substr(0, line_end);
  const bool get = absl::StartsWith(line, "GET ");
  const bool head_only = absl::StartsWith(line, "HEAD ");
  if (!get && !head_only) {
    Respond(fd, "405 Method Not Allowed", "text/plain", "only GET and HEAD\n", false);
    return;
  }
  absl::string_view path = line.substr(line.find(' ') + 1);
  path = path.substr(0, path.find(' '));
  path = path.substr(0, path.find('?'));
  if (path == "/metrics") {
    const std::string body = prometheus::TextSerializer().Serialize(registry_->Collect());
    Respond(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body, head_only);
  } else if (path == "/healthz") {
    if (probes_.live == nullptr || probes_.live()) {
      Respond(fd, "200 OK", "text/plain", "ok\n", head_only);
    } else {
      Respond(fd, "503 Service Unavailable", "text/plain", "unhealthy\n", head_only);
    }
  } else if (path == "/readyz") {
    if (probes_.ready == nullptr || probes_.ready()) {
      Respond(fd, "200 OK", "text/plain", "ready\n", head_only);
    } else {
      Respond(fd, "503 Service Unavailable", "text/plain", "not ready\n", head_only);
    }
  } else if (path == "/") {
    Respond(fd, "200 OK", "text/html",
            "<html><body>matmul-server: <a href=\"/metrics\">/metrics</a>, "
            "<a href=\"/healthz\">/healthz</a>, <a href=\"/readyz\">/readyz</a></body></html>\n",
            head_only);
  } else {
    Respond(fd, "404 Not Found", "text/plain", "not found; try /metrics, /healthz or /readyz\n",
            head_only);
  }
}

}  // namespace matmul::server
