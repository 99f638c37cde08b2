// matmul-server --backend=cuda as a process, called through the C++ client.
// Skips with the server's own reason when no usable GPU is present.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "kernels/reference_gemm.h"
#include "tests/util/test_util.h"

namespace matmul {
namespace {

using ::testing::HasSubstr;
using testing::HttpGet;
using testing::MetricSum;
using testing::ServerProcess;

// Whether this machine has an NVIDIA driver loaded: then a server that
// cannot start on the GPU is a failure, not a reason to skip.
bool NvidiaDriverPresent() {
  return access("/dev/nvidiactl", F_OK) == 0 || access("/proc/driver/nvidia/version", F_OK) == 0;
}

// Starts a CUDA server, or explains why not (then the test skips).
std::unique_ptr<ServerProcess> StartCudaServer(std::vector<std::string> flags, std::string* why) {
  flags.insert(flags.begin(), "--backend=cuda");
  auto server = ServerProcess::Start(flags);
  if (!server.ok()) {
    *why = std::string(server.status().message());
    return nullptr;
  }
  return *std::move(server);
}

#define START_OR_SKIP(server, ...)                                                      \
  std::string why;                                                                    \
  auto server = StartCudaServer(__VA_ARGS__, &why);                                   \
  if (server == nullptr) {                                                            \
    ASSERT_FALSE(NvidiaDriverPresent())                                               \
        << "an NVIDIA driver is present but the CUDA server did not start: " << why;  \
    GTEST_SKIP() << "GPU test skipped: no NVIDIA driver on this machine (" << why     \
                 << ")";                                                              \
  }

void ExpectCorrect(const v1::MultiplyRequest& request,
                   const absl::StatusOr<v1::MultiplyResponse>& response, const std::string& what) {
  ASSERT_TRUE(response.ok()) << what << ": " << response.status();
  absl::StatusOr<double> err = client::CheckResponse(request, *response);
  ASSERT_TRUE(err.ok()) << what << ": " << err.status();
  absl::StatusOr<GemmProblem> p = client::ProblemOf(request);
  EXPECT_LE(*err, ErrorBound(p->input_type, p->output_type, p->precision)) << what;
}

TEST(GpuServerTest, EveryDTypePrecisionShapeTransposeAndScalar) {
  START_OR_SKIP(server, {});
  auto c = *client::MatmulClient::Create({.target = server->target()});
  auto info = c->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->devices(0).kind(), "cuda");
  EXPECT_FALSE(info->devices(0).compute_capability().empty());
  EXPECT_GT(info->devices(0).compute_units(), 0u);
  // Unset lane settings pick the GPU defaults.
  EXPECT_EQ(info->batching().lanes_per_device(), 4u);
  EXPECT_EQ(info->batching().lane_spin_us(), 200u);
  std::mt19937_64 rng(std::random_device{}());
  struct Types {
    DType in, out;
    Precision precision;
  };
  const Types types[] = {{DType::kBFloat16, DType::kBFloat16, Precision::kDefault},
                         {DType::kBFloat16, DType::kFloat32, Precision::kDefault},
                         {DType::kFloat16, DType::kFloat16, Precision::kDefault},
                         {DType::kFloat16, DType::kBFloat16, Precision::kDefault},
                         {DType::kFloat32, DType::kFloat32, Precision::kDefault},
                         {DType::kFloat32, DType::kFloat32, Precision::kTF32},
                         {DType::kFloat64, DType::kFloat64, Precision::kDefault}};
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1}, {1, 4097, 3}, {333, 1, 777}, {1000, 1000, 1000}, {64, 4096, 128}};
  for (const Types& t : types) {
    for (const auto& s : shapes) {
      for (int v = 0; v < 4; ++v) {
        client::ProblemSpec spec{.m = s[0], .n = s[1], .k = s[2], .dtype = t.in};
        spec.output_dtype = t.out;
        spec.precision = t.precision;
        spec.transpose_a = v & 1;
        spec.transpose_b = v & 2;
        if (v == 3) {
          spec.alpha = -1.25;
          spec.beta = 0.5;
        }
        const auto request = client::RandomRequest(spec, rng);
        ExpectCorrect(request, c->Multiply(request),
                      absl::StrCat(DTypeName(t.in), "->", DTypeName(t.out), " ", s[0], "x", s[1],
                                   "x", s[2], " variant ", v));
      }
    }
  }
}

TEST(GpuServerTest, TwoHundredFiftySixCallersOfMixedShapesOnTwoWorkers) {
  START_OR_SKIP(server, {"--devices=0,0", "--max_queue_delay_us=500"});
  auto c = *client::MatmulClient::Create({.target = server->target(), .channels = 4});
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 256; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937_64 rng(std::random_device{}() + t);
      for (int i = 0; i < 4; ++i) {
        const int64_t big = (t + i) % 16 == 0 ? 512 : 256;
        std::uniform_int_distribution<int64_t> dim(1, big);
        client::ProblemSpec spec{.m = dim(rng), .n = dim(rng), .k = dim(rng)};
        spec.dtype = t % 3 == 0 ? DType::kFloat32 : DType::kBFloat16;
        spec.transpose_b = (t + i) % 2;
        const auto request = client::RandomRequest(spec, rng);
        auto response = c->Multiply(request);
        absl::StatusOr<double> err = response.ok() ? client::CheckResponse(request, *response)
                                                   : absl::StatusOr<double>(response.status());
        if (err.ok() && *err <= 1e-2) ok.fetch_add(1);
        else failed.fetch_add(1);
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(ok.load(), 256 * 4);
  EXPECT_EQ(failed.load(), 0);
  const std::string metrics = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_GT(MetricSum(metrics, "matmul_compute_duration_seconds_count{device=\"cuda:0\"}"), 0);
  EXPECT_GT(MetricSum(metrics, "matmul_compute_duration_seconds_count{device=\"cuda:0/1\"}"), 0);
  EXPECT_GT(MetricSum(metrics, "matmul_device_memory_capacity_bytes{device=\"cuda:0\"}"), 0);
  EXPECT_GT(MetricSum(metrics, "matmul_flops_total{device=\"cuda:0\",dtype=\"bfloat16\"}"), 0);
  EXPECT_GT(MetricSum(metrics, "matmul_batch_size_sum") / MetricSum(metrics, "matmul_batch_size_count"), 1.0);
}

TEST(GpuServerTest, RequestLargerThanTheDeviceBudgetIsRefusedAndServingGoesOn) {
  // A tiny pool: a few tens of MB.
  START_OR_SKIP(server, {"--gpu_memory_fraction=0.0005"});
  auto c = *client::MatmulClient::Create({.target = server->target()});
  std::mt19937_64 rng(std::random_device{}());
  // Small operands, a 8192 x 8192 float32 result (256 MiB): over the budget.
  const auto huge = client::RandomRequest({.m = 8192, .n = 8192, .k = 1}, rng);
  auto refused = c->Multiply(huge);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("bytes"));
  const auto fine = client::RandomRequest({.m = 512, .n = 512, .k = 512, .dtype = DType::kBFloat16}, rng);
  ExpectCorrect(fine, c->Multiply(fine), "after the refusal");
}

// The GPUs a default server (--devices unset: every visible GPU) lists, or
// 0 where no CUDA server starts here. Probed once, for every test that asks.
int VisibleGpus() {
  static const int gpus = [] {
    std::string why;
    auto probe = StartCudaServer({}, &why);
    if (probe == nullptr) return 0;
    auto c = client::MatmulClient::Create({.target = probe->target()});
    if (!c.ok()) return 0;
    auto info = (*c)->GetServerInfo();
    return info.ok() ? info->devices_size() : 0;
  }();
  return gpus;
}

// Sends `callers` x `each` random small products at once, each checked
// against the float64 reference; returns the status of every call (OK
// only where the result was also right).
std::vector<absl::Status> CallConcurrently(client::MatmulClient& c, int callers, int each) {
  std::vector<absl::Status> statuses(static_cast<size_t>(callers) * each);
  std::vector<std::thread> threads;
  for (int t = 0; t < callers; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(std::random_device{}() + t);
      std::uniform_int_distribution<int64_t> dim(1, 300);
      for (int i = 0; i < each; ++i) {
        client::ProblemSpec spec{.m = dim(rng), .n = dim(rng), .k = dim(rng)};
        spec.dtype = (t + i) % 2 ? DType::kBFloat16 : DType::kFloat32;
        const auto request = client::RandomRequest(spec, rng);
        auto response = c.Multiply(request);
        absl::Status& s = statuses[static_cast<size_t>(t) * each + i];
        if (!response.ok()) {
          s = response.status();
          continue;
        }
        absl::StatusOr<double> err = client::CheckResponse(request, *response);
        absl::StatusOr<GemmProblem> p = client::ProblemOf(request);
        if (!err.ok()) s = err.status();
        else if (*err > ErrorBound(p->input_type, p->output_type, p->precision)) {
          s = absl::DataLossError(absl::StrCat("relative error ", *err));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

// Multi-GPU hosts (issue: the multi-GPU run): a default server serves from
// every GPU, each GPU's worker takes batches under load, and every result
// is right. Skips, saying so, on a host of fewer than two GPUs.
TEST(GpuServerTest, EveryGpuOfTheHostServes) {
  const int gpus = VisibleGpus();
  if (gpus < 2) {
    GTEST_SKIP() << "needs two or more GPUs; this host's CUDA server lists " << gpus;
  }
  START_OR_SKIP(server, {"--max_queue_delay_us=500"});
  auto c = *client::MatmulClient::Create({.target = server->target(), .channels = 8});
  auto info = c->GetServerInfo();
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->devices_size(), gpus);
  for (const auto& d : info->devices()) {
    EXPECT_EQ(d.kind(), "cuda") << d.id();
    EXPECT_TRUE(d.healthy()) << d.id();
  }
  for (const absl::Status& s : CallConcurrently(*c, 64 * gpus, 8)) EXPECT_TRUE(s.ok()) << s;
  const std::string metrics = HttpGet(server->metrics_port(), "/metrics");
  for (const auto& d : info->devices()) {
    EXPECT_GT(MetricSum(metrics, absl::StrCat("matmul_compute_duration_seconds_count{device=\"",
                                              d.id(), "\"}")),
              0)
        << d.id() << " took no batch";
  }
}

// One worker made to fail (--inject_device_failure) fails only its own
// batch; it turns unhealthy in GetServerInfo and the metrics, and the
// others go on serving. On a host of several GPUs the last GPU fails; on
// one GPU, the second of two workers on it (--devices=0,0).
TEST(GpuServerTest, AFailedGpuWorkerFailsOnlyItsBatchAndTheOthersKeepServing) {
  const int gpus = VisibleGpus();
  // One batch at a time a worker, so that the failing worker has exactly
  // one batch in hand when it fails.
  std::vector<std::string> flags = {"--max_batch_size=1", "--lanes_per_device=1"};
  std::string failing;
  if (gpus >= 2) {
    failing = absl::StrCat("cuda:", gpus - 1);
  } else {
    flags.push_back("--devices=0,0");
    failing = "cuda:0/1";
  }
  flags.push_back(absl::StrCat("--inject_device_failure=", failing, "@0"));
  START_OR_SKIP(server, flags);
  auto c = *client::MatmulClient::Create({.target = server->target(), .channels = 4});
  int internal = 0;
  for (int round = 0; round < 20 && internal == 0; ++round) {
    for (const absl::Status& s : CallConcurrently(*c, 16, 2)) {
      if (s.code() == absl::StatusCode::kInternal) {
        ++internal;
        EXPECT_THAT(std::string(s.message()), HasSubstr(failing));
      } else {
        EXPECT_TRUE(s.ok()) << s;
      }
    }
  }
  EXPECT_EQ(internal, 1) << "the failing worker's one batch";
  for (const absl::Status& s : CallConcurrently(*c, 16, 4)) EXPECT_TRUE(s.ok()) << s;
  auto info = c->GetServerInfo();
  ASSERT_TRUE(info.ok());
  for (const auto& d : info->devices()) EXPECT_EQ(d.healthy(), d.id() != failing) << d.id();
  const std::string metrics = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr(absl::StrCat("matmul_device_healthy{device=\"", failing, "\"} 0")));
  EXPECT_THAT(metrics, HasSubstr("matmul_device_healthy{device=\"cuda:0\"} 1"));
}

}  // namespace
}  // namespace matmul
