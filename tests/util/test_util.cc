#include "tests/util/test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kernels/cpu/cpu_engine.h"
#include <gtest/gtest.h>

extern char** environ;

namespace matmul::testing {

FakeEngine::FakeEngine(std::string id) {
  device_.id = std::move(id);
  device_.name = "fake device";
  device_.kind = "fake";
  device_.memory_bytes = 1ull << 30;
  device_.compute_units = 1;
}

void FakeEngine::Run(absl::Span<const GemmProblem> problems, absl::Span<absl::Status> status) {
  bool fail;
  {
    absl::MutexLock lock(&mu_);
    ++batches_;
    problems_ += static_cast<int>(problems.size());
    sizes_.push_back(problems.size());
    for (const GemmProblem& p : problems) {
      for (int bit = 0; bit < 4; ++bit) pinned_counts_[bit] += (p.host_pinned >> bit) & 1;
    }
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !blocked_; };
    mu_.Await(absl::Condition(&released));
    fail = fail_after_ == 0;
    if (fail_after_ > 0) --fail_after_;
    if (fail) healthy_ = false;
  }
  for (size_t i = 0; i < problems.size(); ++i) {
    status[i] = fail ? absl::InternalError("injected device failure")
                     : CpuEngine::RunOne(problems[i]);
  }
}

std::vector<int> FakeEngine::pinned_counts() const {
  absl::MutexLock lock(&mu_);
  return pinned_counts_;
}

bool FakeEngine::Healthy() const {
  absl::MutexLock lock(&mu_);
  return healthy_;
}

void FakeEngine::Block() {
  absl::MutexLock lock(&mu_);
  blocked_ = true;
}

void FakeEngine::Unblock() {
  absl::MutexLock lock(&mu_);
  blocked_ = false;
}

void FakeEngine::WaitForBatches(int n) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return batches_ >= n; };
  mu_.Await(absl::Condition(&enough));
}

void FakeEngine::FailAfter(int n) {
  absl::MutexLock lock(&mu_);
  fail_after_ = n;
}

int FakeEngine::batches() const {
  absl::MutexLock lock(&mu_);
  return batches_;
}

int FakeEngine::problems() const {
  absl::MutexLock lock(&mu_);
  return problems_;
}

std::vector<size_t> FakeEngine::batch_sizes() const {
  absl::MutexLock lock(&mu_);
  return sizes_;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::vector<std::string>& flags, const std::string& log_file) {
  auto process = std::unique_ptr<ServerProcess>(new ServerProcess());
  char dir_template[] = "/tmp/matmul-test-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  process->dir_ = dir_template;
  const std::string port_file = process->dir_ + "/ports";
  // MATMUL_SERVER_BINARY in the environment overrides the build's path (for
  // running the built tests on another machine).
  const char* binary = std::getenv("MATMUL_SERVER_BINARY");
  std::vector<std::string> args = {binary != nullptr ? binary : MATMUL_SERVER_BINARY,
                                   "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0",
                                   "--port_file=" + port_file};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  const int spawned = posix_spawn(&process->pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return absl::InternalError(absl::StrCat("cannot start ", argv[0]));
  // Wait for the port file (the server writes it once serving).
  for (int i = 0; i < 6000; ++i) {
    std::ifstream in(port_file);
    if (in >> process->port_ >> process->metrics_port_) return process;
    int status;
    if (waitpid(process->pid_, &status, WNOHANG) == process->pid_) {
      process->exited_ = true;
      return absl::InternalError(absl::StrCat("matmul-server exited at start (status ", status, ")"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("matmul-server did not start within 60 s");
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    Wait();
  }
  if (!dir_.empty()) {
    unlink((dir_ + "/ports").c_str());
    rmdir(dir_.c_str());
  }
}

void ServerProcess::Signal(int signal) {
  if (!exited_) kill(pid_, signal);
}

int ServerProcess::Wait() {
  if (exited_) return exit_code_;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exited_ = true;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return exit_code_;
}

std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng;
}

server::ServerConfig LoopbackConfig() {
  server::ServerConfig config;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "127.0.0.1:0";
  config.engine.backend = "cpu";
  return config;
}

std::unique_ptr<server::MatmulServer> StartServer(server::ServerConfig config) {
  auto server = server::MatmulServer::Create(std::move(config));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<client::MatmulClient> Connect(const server::MatmulServer& server,
                                              const std::string& token) {
  auto c = client::MatmulClient::Create(
      {.target = absl::StrCat("127.0.0.1:", server.port()), .auth_token = token});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

namespace {
// The whole response to GET `path` on 127.0.0.1:`port`; empty on failure.
std::string HttpResponse(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = recv(fd, buffer, sizeof buffer, 0)) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  return response;
}
}  // namespace

std::string HttpGet(int port, const std::string& path) {
  const std::string response = HttpResponse(port, path);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

std::string HttpResponseHead(int port, const std::string& path) {
  const std::string response = HttpResponse(port, path);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(0, body);
}

double MetricSum(const std::string& metrics, const std::string& prefix) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, prefix)) continue;
    const size_t space = line.rfind(' ');
    double value;
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &value)) {
      sum += value;
    }
  }
  return sum;
}

}  // namespace matmul::testing
