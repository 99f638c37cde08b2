// Scale-out on loopback: three replicas behind one client channel using
// gRPC's round_robin policy with retries; every replica serves a share, and
// one replica drained with SIGTERM mid-load loses no request.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "tests/util/test_util.h"

namespace matmul {
namespace {

using testing::HttpGet;
using testing::MetricSum;
using testing::ServerProcess;

double Served(const ServerProcess& s) {
  return MetricSum(HttpGet(s.metrics_port(), "/metrics"), "matmul_requests_total{code=\"OK\"");
}

TEST(ScaleOutTest, RoundRobinSpreadsLoadAndADrainedReplicaLosesNothing) {
  std::vector<std::unique_ptr<ServerProcess>> replicas;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    auto s = ServerProcess::Start({"--backend=cpu", "--shutdown_grace_s=30"});
    ASSERT_TRUE(s.ok()) << s.status();
    addresses.push_back(absl::StrCat("127.0.0.1:", (*s)->port()));
    replicas.push_back(*std::move(s));
  }
  auto c = client::MatmulClient::Create({.target = "ipv4:" + absl::StrJoin(addresses, ","),
                                         .load_balancing = "round_robin",
                                         .max_attempts = 5,
                                         .timeout = absl::Seconds(60)});
  ASSERT_TRUE(c.ok()) << c.status();

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::string> failures;
  absl::Mutex mu;
  std::vector<std::thread> callers;
  for (int t = 0; t < 12; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      while (!stop.load()) {
        const auto request = client::RandomRequest({.m = 32, .n = 32, .k = 32}, rng);
        absl::StatusOr<v1::MultiplyResponse> r = (*c)->Multiply(request);
        absl::StatusOr<double> err = r.ok() ? client::CheckResponse(request, *r)
                                            : absl::StatusOr<double>(r.status());
        if (err.ok() && *err <= 1e-5) {
          ok.fetch_add(1);
        } else {
          failed.fetch_add(1);
          absl::MutexLock lock(&mu);
          failures.push_back(err.ok() ? "wrong result" : err.status().ToString());
        }
      }
    });
  }
  // Let every replica take a share, then drain one while the load goes on.
  while (ok.load() < 300) absl::SleepFor(absl::Milliseconds(5));
  const double drained_served = Served(*replicas[2]);
  replicas[2]->Signal(SIGTERM);
  EXPECT_EQ(replicas[2]->Wait(), 0);
  const int at_drain = ok.load();
  while (ok.load() < at_drain + 300) absl::SleepFor(absl::Milliseconds(5));
  stop.store(true);
  for (auto& t : callers) t.join();

  EXPECT_EQ(failed.load(), 0) << absl::StrJoin(failures, "; ");
  EXPECT_GT(drained_served, 20) << "replica 2 got no share before its drain";
  EXPECT_GT(Served(*replicas[0]), 20);
  EXPECT_GT(Served(*replicas[1]), 20);
}

}  // namespace
}  // namespace matmul
