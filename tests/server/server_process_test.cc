// matmul-server as a process: flags, environment, SIGTERM drain.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <thread>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kernels/reference_gemm.h"
#include "tests/util/test_util.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;
using testing::HttpGet;
using testing::MetricSum;
using testing::ServerProcess;

// Runs a shell command; returns its exit code and fills `output`.
int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ServerProcessTest, HelpDocumentsEveryFlag) {
  std::string out;
  RunCommand(absl::StrCat(MATMUL_SERVER_BINARY, " --helpfull"), &out);
  for (const char* flag :
       {"--listen", "--metrics_listen", "--backend", "--devices", "--max_batch_size",
        "--max_queue_delay_us", "--max_batch_flops", "--queue_capacity", "--max_request_bytes",
        "--max_response_bytes", "--max_dim", "--default_timeout_ms", "--priority_aging_ms",
        "--shutdown_grace_s", "--lanes_per_device", "--dispatch_when_idle",
        "--dispatch_below_running", "--lane_spin_us", "--max_queue_gap_us", "--cpu_workers",
        "--gpu_memory_fraction"}) {
    EXPECT_THAT(out, HasSubstr(flag));
  }
  EXPECT_THAT(out, HasSubstr("MATMUL_"));
}

// --help (not only --helpfull) lists the server's own flags.
TEST(ServerProcessTest, HelpListsTheServersFlags) {
  std::string out;
  RunCommand(absl::StrCat(MATMUL_SERVER_BINARY, " --help"), &out);
  EXPECT_THAT(out, ::testing::Not(HasSubstr("No flags matched")));
  for (const char* flag : {"--backend", "--listen", "--max_batch_size", "--lane_spin_us"}) {
    EXPECT_THAT(out, HasSubstr(flag));
  }
}

TEST(ServerProcessTest, BadFlagValueExitsWithAMessage) {
  std::string out;
  EXPECT_EQ(RunCommand(absl::StrCat(MATMUL_SERVER_BINARY, " --listen=127.0.0.1:0 --metrics_listen= "
                                                   "--devices=zero"),
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("--devices"));
  out.clear();
  EXPECT_NE(RunCommand(absl::StrCat(MATMUL_SERVER_BINARY, " --backend=tpu --metrics_listen="), &out), 0);
  EXPECT_THAT(out, HasSubstr("backend must be auto, cpu or cuda"));
}

// Values out of range exit with status 2 and a message naming the flag,
// GPU flags included on the CPU backend, before anything is served.
TEST(ServerProcessTest, OutOfRangeFlagValuesAreRefusedOnEveryBackend) {
  for (const char* flag :
       {"--lane_spin_us=-2", "--lanes_per_device=-1", "--max_batch_flops=-1",
        "--max_inflight_per_client=-3", "--shutdown_grace_s=-1", "--drain_delay_s=-0.5",
        "--gpu_memory_fraction=0", "--gpu_memory_fraction=1.5", "--cuda_resident_row_align=48",
        "--cuda_kernels=fast", "--cuda_host_wait=sleep", "--pinned_host_bytes=-2",
        "--max_queue_delay_us=-1"}) {
    SCOPED_TRACE(flag);
    std::string out;
    // A server that took the value would serve until `timeout` stops it (124).
    EXPECT_EQ(RunCommand(absl::StrCat("timeout 30 ", MATMUL_SERVER_BINARY,
                                      " --backend=cpu --metrics_listen= --listen=127.0.0.1:0 ", flag),
                         &out),
              2);
    const std::string name(absl::string_view(flag).substr(0, absl::string_view(flag).find('=')));
    EXPECT_THAT(out, HasSubstr(name + " must be"));
  }
}

TEST(ServerProcessTest, BusyPortIsAnError) {
  auto first = ServerProcess::Start({"--backend=cpu"});
  ASSERT_TRUE(first.ok()) << first.status();
  std::string out;
  EXPECT_NE(RunCommand(absl::StrCat(MATMUL_SERVER_BINARY, " --backend=cpu --metrics_listen= --listen=",
                             (*first)->target()),
                &out),
            0);
  EXPECT_THAT(out, HasSubstr("cannot listen"));
}

TEST(ServerProcessTest, GrpcArgsPassThroughAndMalformedOnesAreRefused) {
  std::string out;
  EXPECT_NE(RunCommand(absl::StrCat(MATMUL_SERVER_BINARY,
                                    " --backend=cpu --metrics_listen= --listen=127.0.0.1:0"
                                    " --grpc_arg=grpc.http2.max_frame_size"),
                       &out),
            0);
  EXPECT_THAT(out, HasSubstr("--grpc_arg must be name=value"));
  // HTTP/2's smallest frames and a string-valued argument: a request and its
  // result span many frames and still arrive intact.
  auto server = ServerProcess::Start(
      {"--backend=cpu", "--grpc_arg=grpc.http2.max_frame_size=16384,grpc.primary_user_agent=t"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = client::MatmulClient::Create({.target = (*server)->target()});
  std::mt19937_64 rng(std::random_device{}());
  v1::MultiplyRequest request =
      client::RandomRequest({.m = 300, .n = 200, .k = 100, .dtype = DType::kFloat32}, rng);
  absl::StatusOr<v1::MultiplyResponse> response = (*c)->Multiply(request);
  ASSERT_TRUE(response.ok()) << response.status();
  absl::StatusOr<double> err = client::CheckResponse(request, *response);
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_LE(*err, 1e-5);
}

TEST(ServerProcessTest, EnvironmentSetsFlagsAndTheCommandLineWins) {
  setenv("MATMUL_MAX_DIM", "77", 1);
  setenv("MATMUL_MAX_BATCH_SIZE", "5", 1);
  auto server =
      ServerProcess::Start({"--backend=cpu", "--max_batch_size=9", "--max_queue_gap_us=30"});
  unsetenv("MATMUL_MAX_DIM");
  unsetenv("MATMUL_MAX_BATCH_SIZE");
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = client::MatmulClient::Create({.target = (*server)->target()});
  absl::StatusOr<v1::ServerInfo> info = (*c)->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->limits().max_dim(), 77u);
  EXPECT_EQ(info->batching().max_batch_size(), 9u);
  EXPECT_EQ(info->batching().max_queue_gap_us(), 30u);
  EXPECT_TRUE(info->batching().dispatch_when_idle()) << "on by default";
}

TEST(ServerProcessTest, SigtermAnswersEveryAcceptedRequestAndExitsZero) {
  // Jobs wait in the queue for an hour unless the drain flushes them.
  auto server = ServerProcess::Start(
      {"--backend=cpu", "--max_queue_delay_us=3600000000", "--dispatch_when_idle=false", "--max_batch_size=1000",
       "--shutdown_grace_s=120"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = client::MatmulClient::Create({.target = (*server)->target()});
  ASSERT_TRUE(c.ok());
  std::mt19937_64 rng(std::random_device{}());
  struct Call {
    grpc::ClientContext context;
    v1::MultiplyRequest request;
    v1::MultiplyResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  constexpr int kCalls = 32;
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kCalls; ++i) {
    auto call = std::make_unique<Call>();
    call->request = client::RandomRequest({.m = 8 + i, .n = 16, .k = 24}, rng);
    (*c)->MultiplyAsync(&call->context, &call->request, &call->response,
                        [raw = call.get()](grpc::Status s) {
                          raw->status = std::move(s);
                          raw->done.Notify();
                        });
    calls.push_back(std::move(call));
  }
  while (MetricSum(HttpGet((*server)->metrics_port(), "/metrics"), "matmul_queue_depth") < kCalls) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  (*server)->Signal(SIGTERM);
  for (auto& call : calls) {
    call->done.WaitForNotification();
    ASSERT_TRUE(call->status.ok()) << call->status.error_message();
    absl::StatusOr<double> err = client::CheckResponse(call->request, call->response);
    ASSERT_TRUE(err.ok()) << err.status();
    EXPECT_LE(*err, 1e-5);
  }
  // Draining (or gone already): never ready again.
  EXPECT_NE(HttpGet((*server)->metrics_port(), "/readyz"), "ready\n");
  EXPECT_EQ((*server)->Wait(), 0);
  // Gone: new calls fail UNAVAILABLE.
  absl::StatusOr<v1::MultiplyResponse> after =
      (*c)->Multiply(client::RandomRequest({.m = 2, .n = 2, .k = 2}, rng));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
}

// Sends `count` requests at once; returns their statuses.
std::vector<grpc::Status> Burst(const client::MatmulClient& c, int count, std::mt19937_64& rng) {
  struct Call {
    grpc::ClientContext context;
    v1::MultiplyRequest request;
    v1::MultiplyResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < count; ++i) {
    auto call = std::make_unique<Call>();
    call->request = client::RandomRequest({.m = 96, .n = 96, .k = 96}, rng);
    c.MultiplyAsync(&call->context, &call->request, &call->response,
                    [raw = call.get()](grpc::Status s) {
                      raw->status = std::move(s);
                      raw->done.Notify();
                    });
    calls.push_back(std::move(call));
  }
  std::vector<grpc::Status> statuses;
  for (auto& call : calls) {
    call->done.WaitForNotification();
    statuses.push_back(call->status);
  }
  return statuses;
}

TEST(ServerProcessTest, AFailedDeviceFailsOnlyItsBatchAndTheOthersKeepServing) {
  auto server = ServerProcess::Start({"--backend=cpu", "--cpu_workers=2", "--max_batch_size=1",
                                      "--inject_device_failure=cpu:1@0"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = client::MatmulClient::Create({.target = (*server)->target()});
  std::mt19937_64 rng(std::random_device{}());
  // Concurrent calls reach both workers; cpu:1's first batch fails.
  int internal = 0, ok = 0;
  for (int round = 0; round < 20 && internal == 0; ++round) {
    for (const grpc::Status& s : Burst(**c, 8, rng)) {
      if (s.ok()) ++ok;
      else if (s.error_code() == grpc::StatusCode::INTERNAL) {
        ++internal;
        EXPECT_THAT(s.error_message(), HasSubstr("cpu:1"));
      } else {
        ADD_FAILURE() << s.error_message();
      }
    }
  }
  EXPECT_EQ(internal, 1);
  // From now on everything runs on cpu:0.
  for (const grpc::Status& s : Burst(**c, 32, rng)) EXPECT_TRUE(s.ok()) << s.error_message();
  absl::StatusOr<v1::ServerInfo> info = (*c)->GetServerInfo();
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->devices_size(), 2);
  EXPECT_TRUE(info->devices(0).healthy());
  EXPECT_FALSE(info->devices(1).healthy());
  const std::string metrics = HttpGet((*server)->metrics_port(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("matmul_device_healthy{device=\"cpu:1\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("matmul_device_healthy{device=\"cpu:0\"} 1"));
  EXPECT_GT(MetricSum(metrics, "matmul_compute_duration_seconds_count{device=\"cpu:0\"}"), 0);
  EXPECT_GT(MetricSum(metrics, "matmul_compute_duration_seconds_count{device=\"cpu:1\"}"), 0);
}

TEST(ServerProcessTest, WithNoHealthyDeviceLeftHealthSaysNotServing) {
  auto server = ServerProcess::Start({"--backend=cpu", "--inject_device_failure=cpu:0@1"});
  ASSERT_TRUE(server.ok()) << server.status();
  // HTTP probes on the metrics port say the same as gRPC health.
  const int http = (*server)->metrics_port();
  EXPECT_EQ(HttpGet(http, "/readyz"), "ready\n");
  EXPECT_EQ(HttpGet(http, "/healthz"), "ok\n");
  auto c = client::MatmulClient::Create({.target = (*server)->target()});
  std::mt19937_64 rng(std::random_device{}());
  const auto request = client::RandomRequest({.m = 8, .n = 8, .k = 8}, rng);
  EXPECT_TRUE((*c)->Multiply(request).ok());  // The one batch that still works.
  EXPECT_EQ((*c)->Multiply(request).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ((*c)->Multiply(request).status().code(), absl::StatusCode::kUnavailable);
  auto channel = grpc::CreateChannel((*server)->target(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("matmul.v1.MatmulService");
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&context, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  // Not ready, and not live either: only a restart brings a device back
  // from a sticky CUDA error.
  EXPECT_EQ(HttpGet(http, "/readyz"), "not ready\n");
  EXPECT_EQ(HttpGet(http, "/healthz"), "unhealthy\n");
}

// Mean batch size the server reports after 64 callers each send 16 small
// requests one after another.
double MeanBatchUnderLoad(const std::vector<std::string>& flags, double* batches) {
  auto server = ServerProcess::Start(flags);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return 0;
  auto c = client::MatmulClient::Create({.target = (*server)->target()});
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int t = 0; t < 64; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 16; ++i) {
        if (!(*c)->Multiply(client::RandomRequest({.m = 16, .n = 16, .k = 16}, rng)).ok()) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
  const std::string metrics = HttpGet((*server)->metrics_port(), "/metrics");
  *batches = MetricSum(metrics, "matmul_batch_size_count");
  return MetricSum(metrics, "matmul_batch_size_sum") / *batches;
}

TEST(ServerProcessTest, ConcurrentSmallRequestsAreBatchedAndMaxBatchSizeOneIsHonoured) {
  double batches = 0;
  const double batched =
      MeanBatchUnderLoad({"--backend=cpu", "--max_queue_delay_us=2000", "--dispatch_when_idle=false"}, &batches);
  EXPECT_GT(batched, 4.0) << "over " << batches << " batches";
  const double single = MeanBatchUnderLoad(
      {"--backend=cpu", "--max_queue_delay_us=2000", "--dispatch_when_idle=false", "--max_batch_size=1"}, &batches);
  EXPECT_EQ(single, 1.0);
  EXPECT_EQ(batches, 64 * 16);
}

}  // namespace
}  // namespace matmul
