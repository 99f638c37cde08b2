// The server end to end, in process: real gRPC on a loopback port (port 0),
// the C++ client, the CPU engine or a controllable fake.
#include "server/server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kernels/reference_gemm.h"
#include "tests/util/test_util.h"

namespace matmul::server {
namespace {

using matmul::testing::Connect;
using matmul::testing::LoopbackConfig;
using matmul::testing::Rng;
using matmul::testing::StartServer;

using client::MatmulClient;
using client::ProblemSpec;
using ::testing::HasSubstr;
using matmul::testing::FakeEngine;
using matmul::testing::HttpGet;
using matmul::testing::MetricSum;

// A server whose only engine is a FakeEngine the test controls.
std::unique_ptr<MatmulServer> StartFakeServer(FakeEngine** engine, ServerConfig config) {
  EngineSet set;
  set.backend = "cpu";
  auto fake = std::make_unique<FakeEngine>("fake:0");
  *engine = fake.get();
  set.engines.push_back(std::move(fake));
  auto server = MatmulServer::Create(std::move(config), std::move(set));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Checks a good response against the float64 reference.
void ExpectCorrect(const v1::MultiplyRequest& request, const v1::MultiplyResponse& response) {
  absl::StatusOr<double> err = client::CheckResponse(request, response);
  ASSERT_TRUE(err.ok()) << err.status();
  absl::StatusOr<GemmProblem> p = client::ProblemOf(request);
  EXPECT_LE(*err, ErrorBound(p->input_type, p->output_type, p->precision))
      << request.a().rows() << "x" << request.a().cols() << " dtype " << request.a().dtype();
}

// Polls the server's /metrics until the samples starting with `prefix` sum
// to at least `at_least`; returns the sum.
double WaitForMetric(const MatmulServer& server, const std::string& prefix, double at_least) {
  while (true) {
    const double v = MetricSum(HttpGet(server.metrics_port(), "/metrics"), prefix);
    if (v >= at_least) return v;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// An asynchronous unary call and its outcome.
struct AsyncCall {
  grpc::ClientContext context;
  v1::MultiplyRequest request;
  v1::MultiplyResponse response;
  grpc::Status status;
  absl::Notification done;
  void Start(const MatmulClient& c) {
    c.MultiplyAsync(&context, &request, &response, [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
  }
};

TEST(ServerTest, EveryDTypeTransposeAndScalarIsCorrect) {
  auto server = StartServer();
  auto c = Connect(*server);
  const DType kAll[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1}, {1, 4097, 3}, {333, 1, 777}, {65, 33, 17}};
  int checked = 0;
  for (DType in : kAll) {
    for (DType out : kAll) {
      if (!IsSupportedOutput(in, out)) continue;
      for (const auto& s : shapes) {
        for (int variant = 0; variant < 4; ++variant) {
          ProblemSpec spec;
          spec.m = s[0];
          spec.n = s[1];
          spec.k = s[2];
          spec.dtype = in;
          spec.output_dtype = out;
          spec.transpose_a = variant & 1;
          spec.transpose_b = variant & 2;
          if (variant == 3) {
            spec.alpha = -1.5;
            spec.beta = 0.25;
          }
          spec.precision = variant == 2 ? Precision::kTF32 : Precision::kDefault;
          const v1::MultiplyRequest request = client::RandomRequest(spec, Rng());
          absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(request);
          ASSERT_TRUE(response.ok()) << response.status();
          ExpectCorrect(request, *response);
          EXPECT_EQ(response->timing().device(), "cpu:0");
          EXPECT_GE(response->timing().batch_size(), 1u);
          EXPECT_GE(response->timing().total_us(), response->timing().compute_us());
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 8 * 4 * 4);  // 8 input/output dtype pairs.
}

TEST(ServerTest, BadInputGetsInvalidArgumentAndTheServerKeepsServing) {
  auto server = StartServer();
  auto c = Connect(*server);
  const v1::MultiplyRequest good = client::RandomRequest({.m = 4, .n = 5, .k = 6}, Rng());
  std::vector<std::pair<v1::MultiplyRequest, std::string>> bad;
  v1::MultiplyRequest r = good;
  r.clear_a();
  bad.emplace_back(r, "a: required");
  r = good;
  r.mutable_a()->set_rows(0);
  bad.emplace_back(r, "a.rows");
  r = good;
  r.mutable_b()->mutable_data()->pop_back();
  bad.emplace_back(r, "b.data");
  r = good;
  r.set_transpose_b(true);
  bad.emplace_back(r, "inner dimensions");
  r = good;
  r.mutable_b()->set_dtype(v1::DTYPE_FLOAT64);
  bad.emplace_back(r, "b.");
  r = good;
  r.set_beta(1.0);
  bad.emplace_back(r, "c: required");
  r = good;
  r.set_output_dtype(v1::DTYPE_BFLOAT16);
  bad.emplace_back(r, "output_dtype");
  r = good;
  r.mutable_a()->set_rows(1'000'000);
  bad.emplace_back(r, "max_dim");
  for (const auto& [request, field] : bad) {
    absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(request);
    ASSERT_FALSE(response.ok()) << field;
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << response.status();
    EXPECT_THAT(response.status().message(), HasSubstr(field));
    // Still serving.
    absl::StatusOr<v1::MultiplyResponse> ok = c->Multiply(good);
    ASSERT_TRUE(ok.ok()) << ok.status();
    ExpectCorrect(good, *ok);
  }
  const std::string metrics = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_EQ(MetricSum(metrics, "matmul_rejected_total{reason=\"invalid\"}"), bad.size());
  EXPECT_EQ(MetricSum(metrics, "matmul_requests_total{code=\"INVALID_ARGUMENT\",method=\"Multiply\"}"),
            bad.size());
  EXPECT_EQ(MetricSum(metrics, "matmul_requests_total{code=\"OK\",method=\"Multiply\"}"),
            bad.size());
}

TEST(ServerTest, StreamAnswersEveryItemExactlyOnceIncludingBadOnes) {
  auto server = StartServer();
  auto c = Connect(*server);
  std::vector<v1::MultiplyRequest> requests;
  for (int i = 0; i < 300; ++i) {
    ProblemSpec spec{.m = 1 + i % 17, .n = 1 + i % 13, .k = 1 + i % 11};
    spec.dtype = static_cast<DType>(i % 4);
    spec.request_id = absl::StrCat("item-", i);
    v1::MultiplyRequest request = client::RandomRequest(spec, Rng());
    if (i % 7 == 3) request.mutable_a()->mutable_data()->append("x");  // Bad item.
    requests.push_back(std::move(request));
  }
  absl::StatusOr<std::vector<v1::MultiplyResponse>> responses = c->MultiplyStream(requests);
  ASSERT_TRUE(responses.ok()) << responses.status();
  ASSERT_EQ(responses->size(), requests.size());
  std::set<std::string> seen;
  for (const v1::MultiplyResponse& response : *responses) {
    ASSERT_TRUE(seen.insert(response.request_id()).second) << "answered twice";
    int index;
    ASSERT_TRUE(absl::SimpleAtoi(response.request_id().substr(5), &index));
    if (index % 7 == 3) {
      EXPECT_EQ(response.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_THAT(response.error().message(), HasSubstr("a.data"));
      EXPECT_EQ(response.c().data().size(), 0u);
    } else {
      EXPECT_EQ(response.error().code(), 0) << response.error().message();
      ExpectCorrect(requests[index], response);
    }
  }
}

TEST(ServerTest, SixtyFourConcurrentCallersLoseNothing) {
  ServerConfig config = LoopbackConfig();
  config.queue.max_queue_delay = absl::Microseconds(500);
  auto server = StartServer(config);
  auto c = Connect(*server);
  constexpr int kCallers = 64, kPerCaller = 12;
  std::atomic<int> ok{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937_64 rng(std::random_device{}() + t);
      std::uniform_int_distribution<int64_t> dim(1, 96);
      std::vector<v1::MultiplyRequest> stream_items;
      for (int i = 0; i < kPerCaller; ++i) {
        ProblemSpec spec{.m = dim(rng), .n = dim(rng), .k = dim(rng)};
        spec.dtype = static_cast<DType>(rng() % 4);
        spec.transpose_a = rng() % 2;
        spec.request_id = absl::StrCat(t, "/", i);
        v1::MultiplyRequest request = client::RandomRequest(spec, rng);
        if (t % 4 == 0) {  // A quarter of the callers use streams.
          stream_items.push_back(std::move(request));
          continue;
        }
        absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(request);
        ASSERT_TRUE(response.ok()) << response.status();
        ASSERT_EQ(response->request_id(), request.request_id());
        ExpectCorrect(request, *response);
        ok.fetch_add(1);
      }
      if (!stream_items.empty()) {
        auto responses = c->MultiplyStream(stream_items);
        ASSERT_TRUE(responses.ok()) << responses.status();
        ASSERT_EQ(responses->size(), stream_items.size());
        for (const auto& response : *responses) {
          int index;
          ASSERT_TRUE(absl::SimpleAtoi(response.request_id().substr(response.request_id().find('/') + 1), &index));
          ExpectCorrect(stream_items[index], response);
          ok.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(ok.load(), kCallers * kPerCaller);
  const std::string metrics = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_EQ(MetricSum(metrics, "matmul_requests_total{code=\"OK\""), kCallers * kPerCaller);
  EXPECT_EQ(MetricSum(metrics, "matmul_inflight_requests"), 0);
}

TEST(ServerTest, FullQueueAnswersResourceExhaustedAtOnce) {
  ServerConfig config = LoopbackConfig();
  config.queue.capacity = 2;
  config.queue.max_batch_size = 1;
  FakeEngine* engine;
  auto server = StartFakeServer(&engine, config);
  auto c = Connect(*server);
  engine->Block();
  std::vector<std::unique_ptr<AsyncCall>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::make_unique<AsyncCall>());
    calls.back()->request = client::RandomRequest({.m = 8, .n = 8, .k = 8}, Rng());
    calls.back()->Start(*c);
    if (i == 0) engine->WaitForBatches(1);
  }
  WaitForMetric(*server, "matmul_queue_depth", 2);  // Both followers are queued.
  absl::StatusOr<v1::MultiplyResponse> refused =
      c->Multiply(client::RandomRequest({.m = 8, .n = 8, .k = 8}, Rng()));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("queue is full"));
  engine->Unblock();
  for (auto& call : calls) {
    call->done.WaitForNotification();
    ASSERT_TRUE(call->status.ok()) << call->status.error_message();
    ExpectCorrect(call->request, call->response);
  }
  EXPECT_EQ(MetricSum(HttpGet(server->metrics_port(), "/metrics"),
                      "matmul_rejected_total{reason=\"queue_full\"}"),
            1);
}

TEST(ServerTest, DeadlinePassingInTheQueueAnswersDeadlineExceeded) {
  ServerConfig config = LoopbackConfig();
  config.queue.max_batch_size = 1;
  config.default_timeout = absl::Milliseconds(200);  // For calls without a deadline.
  FakeEngine* engine;
  auto server = StartFakeServer(&engine, config);
  auto c = Connect(*server);
  engine->Block();
  AsyncCall first;
  first.request = client::RandomRequest({.m = 4, .n = 4, .k = 4}, Rng());
  first.context.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(1));
  first.Start(*c);
  engine->WaitForBatches(1);
  // No client deadline: the server's default timeout ends it while queued.
  absl::StatusOr<v1::MultiplyResponse> timed_out =
      c->Multiply(client::RandomRequest({.m = 4, .n = 4, .k = 4}, Rng()));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed_out.status().message(), HasSubstr("queued"));
  // A client deadline does the same. It is long enough for the call to be
  // queued before it passes even on a loaded machine: with 100 ms, a CI run
  // on two busy cores saw the call expire before the server counted it as
  // queued, and the wait for the metric below never ended.
  AsyncCall second;
  second.request = client::RandomRequest({.m = 4, .n = 4, .k = 4}, Rng());
  second.context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  second.Start(*c);
  second.done.WaitForNotification();
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(first.done.HasBeenNotified(), false);  // The device is still busy.
  engine->Unblock();
  first.done.WaitForNotification();
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(engine->problems(), 1);  // Nothing that timed out was computed.
  // The server counts both.
  EXPECT_EQ(WaitForMetric(*server, "matmul_rejected_total{reason=\"deadline\"}", 2), 2);
}

TEST(ServerTest, CancelledCallIsDroppedFromTheQueue) {
  ServerConfig config = LoopbackConfig();
  config.queue.max_batch_size = 1;
  FakeEngine* engine;
  auto server = StartFakeServer(&engine, config);
  auto c = Connect(*server);
  engine->Block();
  AsyncCall first, second;
  first.request = client::RandomRequest({.m = 4, .n = 4, .k = 4}, Rng());
  first.Start(*c);
  engine->WaitForBatches(1);
  second.request = client::RandomRequest({.m = 4, .n = 4, .k = 4}, Rng());
  second.Start(*c);
  WaitForMetric(*server, "matmul_queue_depth", 1);
  second.context.TryCancel();
  second.done.WaitForNotification();
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::CANCELLED);
  WaitForMetric(*server, "matmul_rejected_total{reason=\"cancelled\"}", 1);
  EXPECT_EQ(MetricSum(HttpGet(server->metrics_port(), "/metrics"), "matmul_queue_depth"), 0);
  engine->Unblock();
  first.done.WaitForNotification();
  EXPECT_TRUE(first.status.ok());
  EXPECT_EQ(engine->problems(), 1);
}

TEST(ServerTest, OversizeMessageIsRefusedAndTheServerKeepsServing) {
  ServerConfig config = LoopbackConfig();
  config.max_request_bytes = 64 << 10;
  auto server = StartServer(config);
  auto c = Connect(*server);
  absl::StatusOr<v1::MultiplyResponse> refused =
      c->Multiply(client::RandomRequest({.m = 128, .n = 128, .k = 128}, Rng()));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  const auto good = client::RandomRequest({.m = 16, .n = 16, .k = 16}, Rng());
  absl::StatusOr<v1::MultiplyResponse> ok = c->Multiply(good);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ExpectCorrect(good, *ok);
}

TEST(ServerTest, HealthServesBothNames) {
  auto server = StartServer();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (const char* service : {"", "matmul.v1.MatmulService"}) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, request, &response).ok());
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
}

TEST(ServerTest, GetServerInfoDescribesTheServer) {
  ServerConfig config = LoopbackConfig();
  config.queue.max_batch_size = 17;
  config.queue.max_queue_delay = absl::Microseconds(1234);
  config.queue.capacity = 99;
  config.dispatch_when_idle = false;  // Not the default: the reply must follow the config.
  config.dispatch_below_running = 3;
  config.lanes_per_device = 5;
  config.lane_spin = absl::Microseconds(70);
  config.limits.max_dim = 5000;
  auto server = StartServer(config);
  auto c = Connect(*server);
  absl::StatusOr<v1::ServerInfo> info = c->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->version().empty());
  EXPECT_EQ(info->engine(), "cpu-openblas");
  ASSERT_EQ(info->devices_size(), 1);
  EXPECT_EQ(info->devices(0).id(), "cpu:0");
  EXPECT_EQ(info->devices(0).kind(), "cpu");
  EXPECT_GT(info->devices(0).memory_bytes(), 0u);
  EXPECT_GT(info->devices(0).compute_units(), 0u);
  EXPECT_TRUE(info->devices(0).healthy());
  EXPECT_EQ(info->supported_dtypes_size(), 4);
  EXPECT_EQ(info->limits().max_dim(), 5000u);
  EXPECT_EQ(info->limits().max_request_bytes(), 256u << 20);
  EXPECT_EQ(info->batching().max_batch_size(), 17u);
  EXPECT_EQ(info->batching().max_queue_delay_us(), 1234u);
  EXPECT_EQ(info->batching().queue_capacity(), 99u);
  EXPECT_GT(info->batching().max_batch_flops(), 0);
  EXPECT_FALSE(info->batching().dispatch_when_idle());
  EXPECT_EQ(info->batching().dispatch_below_running(), 3u);
  EXPECT_EQ(info->batching().lanes_per_device(), 5u);
  EXPECT_EQ(info->batching().lane_spin_us(), 70u);
}

// Left unset, the lane poll and the lanes follow the backend: the CPU
// engine's lanes sleep at once (a poll would take a core from OpenBLAS).
TEST(ServerTest, UnsetLaneSettingsPickTheCpuDefaults) {
  auto server = StartServer(LoopbackConfig());
  auto c = Connect(*server);
  absl::StatusOr<v1::ServerInfo> info = c->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->batching().lane_spin_us(), 0u);
  EXPECT_EQ(info->batching().lanes_per_device(), 1u);
}

TEST(ServerTest, MetricsEndpointExportsTheContractNames) {
  auto server = StartServer();
  auto c = Connect(*server);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c->Multiply(client::RandomRequest({.m = 32, .n = 32, .k = 32}, Rng())).ok());
  }
  const std::string metrics = HttpGet(server->metrics_port(), "/metrics");
  for (const char* name :
       {"matmul_requests_total{code=\"OK\",method=\"Multiply\"} 5",
        "matmul_request_duration_seconds_bucket{method=\"Multiply\",le=\"5e-05\"}",
        "matmul_request_duration_seconds_count{method=\"Multiply\"} 5",
        "matmul_queue_duration_seconds_count 5", "matmul_compute_duration_seconds_bucket{device=\"cpu:0\",le=\"30\"}",
        "matmul_batch_size_bucket", "matmul_batch_flops_bucket", "matmul_queue_depth 0",
        "matmul_inflight_requests 0", "matmul_rejected_total{reason=\"queue_full\"} 0",
        "matmul_bytes_received_total", "matmul_bytes_sent_total",
        "matmul_flops_total{device=\"cpu:0\",dtype=\"float32\"} 327680",
        "matmul_device_busy_seconds_total{device=\"cpu:0\"}", "matmul_build_info{"}) {
    EXPECT_THAT(metrics, HasSubstr(name));
  }
  EXPECT_GT(MetricSum(metrics, "matmul_bytes_received_total"), 5 * 2 * 32 * 32 * 4);
  EXPECT_GT(MetricSum(metrics, "matmul_bytes_sent_total"), 5 * 32 * 32 * 4);
}

TEST(ServerTest, ShutdownAnswersEveryAcceptedRequestThenRefuses) {
  ServerConfig config = LoopbackConfig();
  config.queue.max_queue_delay = absl::Hours(1);  // Jobs wait until the drain flushes them.
  config.dispatch_when_idle = false;
  config.queue.max_batch_size = 1000;
  auto server = StartServer(config);
  auto c = Connect(*server);
  std::vector<std::unique_ptr<AsyncCall>> calls;
  for (int i = 0; i < 20; ++i) {
    calls.push_back(std::make_unique<AsyncCall>());
    calls.back()->request = client::RandomRequest({.m = 20, .n = 20, .k = 20}, Rng());
    calls.back()->Start(*c);
  }
  WaitForMetric(*server, "matmul_queue_depth", 20);
  EXPECT_TRUE(server->Shutdown(absl::Seconds(60)));
  for (auto& call : calls) {
    call->done.WaitForNotification();
    ASSERT_TRUE(call->status.ok()) << call->status.error_message();
    ExpectCorrect(call->request, call->response);
    EXPECT_EQ(call->response.timing().batch_size(), 20u);
  }
  absl::StatusOr<v1::MultiplyResponse> after =
      c->Multiply(client::RandomRequest({.m = 2, .n = 2, .k = 2}, Rng()));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace matmul::server
