#include "client/matmul_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "client/requests.h"
#include "server/server.h"
#include "tests/util/test_util.h"

namespace matmul::client {
namespace {

using ::testing::HasSubstr;
using testing::HttpGet;
using testing::MetricSum;

std::unique_ptr<server::MatmulServer> StartServer() {
  server::ServerConfig config;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "127.0.0.1:0";
  config.engine.backend = "cpu";
  auto s = server::MatmulServer::Create(config);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(MatmulClientTest, RejectsBadOptions) {
  EXPECT_EQ(MatmulClient::Create({.target = ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MatmulClient::Create({.target = "x:1", .load_balancing = "random"})
                  .status()
                  .message(),
              HasSubstr("pick_first or round_robin"));
  EXPECT_EQ(MatmulClient::Create({.target = "x:1", .max_attempts = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MatmulClientTest, ErrorsCarryTheGrpcCodeAndMessage) {
  auto s = StartServer();
  auto c = MatmulClient::Create({.target = absl::StrCat("127.0.0.1:", s->port())});
  ASSERT_TRUE(c.ok());
  v1::MultiplyRequest empty;
  absl::StatusOr<v1::MultiplyResponse> r = (*c)->Multiply(empty);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "a: required");
}

TEST(MatmulClientTest, RoundRobinSpreadsCallsOverEveryAddress) {
  auto s1 = StartServer();
  auto s2 = StartServer();
  auto c = MatmulClient::Create(
      {.target = absl::StrCat("ipv4:127.0.0.1:", s1->port(), ",127.0.0.1:", s2->port()),
       .load_balancing = "round_robin"});
  ASSERT_TRUE(c.ok());
  std::mt19937_64 rng(std::random_device{}());
  auto served = [&](const std::unique_ptr<server::MatmulServer>& s) {
    return MetricSum(HttpGet(s->metrics_port(), "/metrics"), "matmul_requests_total");
  };
  // round_robin sends only to connected addresses, so the first calls may
  // all reach whichever connected first: call until both have answered.
  int warmup = 0;
  for (; warmup < 1000 && (served(s1) == 0 || served(s2) == 0); ++warmup) {
    ASSERT_TRUE((*c)->Multiply(RandomRequest({.m = 4, .n = 4, .k = 4}, rng)).ok());
  }
  ASSERT_GT(served(s1), 0) << "no call reached the first address in " << warmup << " calls";
  ASSERT_GT(served(s2), 0) << "no call reached the second address in " << warmup << " calls";
  const double before1 = served(s1), before2 = served(s2);
  for (int i = 0; i < 40; ++i) {
    absl::StatusOr<v1::MultiplyResponse> r =
        (*c)->Multiply(RandomRequest({.m = 4, .n = 4, .k = 4}, rng));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const double n1 = served(s1) - before1;
  const double n2 = served(s2) - before2;
  EXPECT_EQ(n1 + n2, 40);
  EXPECT_GE(n1, 10);
  EXPECT_GE(n2, 10);
}

TEST(MatmulClientTest, SeveralChannelsAllWork) {
  auto s = StartServer();
  auto c = MatmulClient::Create({.target = absl::StrCat("127.0.0.1:", s->port()), .channels = 3});
  ASSERT_TRUE(c.ok());
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 9; ++i) {
    const auto request = RandomRequest({.m = 3, .n = 3, .k = 3}, rng);
    absl::StatusOr<v1::MultiplyResponse> r = (*c)->Multiply(request);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LE(*CheckResponse(request, *r), 1e-5);
  }
}

}  // namespace
}  // namespace matmul::client
