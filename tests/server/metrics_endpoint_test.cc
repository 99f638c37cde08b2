#include "server/metrics_endpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/counter.h>

#include <atomic>

#include "tests/util/test_util.h"

namespace matmul::server {
namespace {

using ::testing::HasSubstr;
using testing::HttpGet;
using testing::HttpResponseHead;

TEST(MetricsEndpointTest, ServesTheRegistryOnPortZero) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& counter = prometheus::BuildCounter().Name("test_things_total").Help("Things.").Register(*registry).Add({});
  counter.Increment(3);
  auto endpoint = MetricsEndpoint::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);
  EXPECT_THAT(HttpGet((*endpoint)->port(), "/metrics"), HasSubstr("test_things_total 3"));
  counter.Increment();
  EXPECT_THAT(HttpGet((*endpoint)->port(), "/metrics?x=1"), HasSubstr("test_things_total 4"));
  EXPECT_THAT(HttpGet((*endpoint)->port(), "/nope"), HasSubstr("not found"));
}

TEST(MetricsEndpointTest, HealthzAndReadyzFollowTheirProbes) {
  auto registry = std::make_shared<prometheus::Registry>();
  std::atomic<bool> live{true}, ready{false};
  auto endpoint = MetricsEndpoint::Create(
      "127.0.0.1:0", registry,
      {.live = [&] { return live.load(); }, .ready = [&] { return ready.load(); }});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  EXPECT_EQ(HttpGet(port, "/healthz"), "ok\n");
  EXPECT_THAT(HttpResponseHead(port, "/healthz"), HasSubstr("HTTP/1.1 200"));
  EXPECT_EQ(HttpGet(port, "/readyz"), "not ready\n");
  EXPECT_THAT(HttpResponseHead(port, "/readyz"), HasSubstr("HTTP/1.1 503"));
  ready.store(true);
  EXPECT_EQ(HttpGet(port, "/readyz"), "ready\n");
  EXPECT_THAT(HttpResponseHead(port, "/readyz?verbose"), HasSubstr("HTTP/1.1 200"));
  live.store(false);
  ready.store(false);
  EXPECT_EQ(HttpGet(port, "/healthz"), "unhealthy\n");
  EXPECT_THAT(HttpResponseHead(port, "/healthz"), HasSubstr("HTTP/1.1 503"));
  EXPECT_EQ(HttpGet(port, "/readyz"), "not ready\n");
  // Without probes both answer 200.
  auto plain = MetricsEndpoint::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(HttpGet((*plain)->port(), "/healthz"), "ok\n");
  EXPECT_EQ(HttpGet((*plain)->port(), "/readyz"), "ready\n");
}

TEST(MetricsEndpointTest, BadOrBusyAddressesAreErrors) {
  auto registry = std::make_shared<prometheus::Registry>();
  EXPECT_FALSE(MetricsEndpoint::Create("no-port", registry).ok());
  auto first = MetricsEndpoint::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok());
  auto second = MetricsEndpoint::Create("127.0.0.1:" + std::to_string((*first)->port()), registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace matmul::server
