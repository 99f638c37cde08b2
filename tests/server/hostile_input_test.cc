// Hostile and edge-case input against a running server: NaN and infinity,
// messages exactly at and one byte over the size limit, and a flood of
// oversize requests (the server's memory must stay bounded).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "kernels/reference_gemm.h"
#include "server/server.h"
#include "tests/util/test_util.h"

namespace matmul {
namespace {

using testing::Rng;

using testing::ServerProcess;

// Resident set size of `pid` in bytes (from /proc).
int64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      int64_t kb = 0;
      absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(6, line.size() - 6 - 3)), &kb);
      return kb * 1024;
    }
  }
  return -1;
}

TEST(HostileInputTest, NaNAndInfinityPropagateAsIEEESays) {
  auto server = ServerProcess::Start({"--backend=cpu"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = *client::MatmulClient::Create({.target = (*server)->target()});
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
    v1::MultiplyRequest request = client::RandomRequest({.m = 4, .n = 3, .k = 5, .dtype = t}, Rng());
    std::vector<double> a = ToDouble(request.a().data().data(), t, 20);
    a[1 * 5 + 2] = std::numeric_limits<double>::quiet_NaN();  // Row 1 -> NaN.
    a[3 * 5 + 0] = std::numeric_limits<double>::infinity();   // Row 3 -> +-inf.
    FromDouble(a, t, request.mutable_a()->mutable_data()->data());
    absl::StatusOr<v1::MultiplyResponse> r = c->Multiply(request);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<double> d = ToDouble(r->c().data().data(), t, 12);
    for (int j = 0; j < 3; ++j) {
      EXPECT_TRUE(std::isnan(d[1 * 3 + j])) << DTypeName(t);
      EXPECT_TRUE(std::isinf(d[3 * 3 + j])) << DTypeName(t);
      EXPECT_TRUE(std::isfinite(d[0 * 3 + j]) && std::isfinite(d[2 * 3 + j])) << DTypeName(t);
    }
  }
}

TEST(HostileInputTest, MessagesAtTheLimitPassAndOneByteOverIsRefused) {
  const v1::MultiplyRequest request = client::RandomRequest({.m = 64, .n = 64, .k = 64}, Rng());
  const uint64_t size = request.ByteSizeLong();
  for (uint64_t limit : {size, size - 1}) {
    server::ServerConfig config;
    config.listen = "127.0.0.1:0";
    config.metrics_listen = "";
    config.engine.backend = "cpu";
    config.max_request_bytes = limit;
    auto server = server::MatmulServer::Create(config);
    ASSERT_TRUE(server.ok()) << server.status();
    auto c = *client::MatmulClient::Create({.target = absl::StrCat("127.0.0.1:", (*server)->port())});
    absl::StatusOr<v1::MultiplyResponse> r = c->Multiply(request);
    if (limit == size) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_LE(*client::CheckResponse(request, *r), 1e-5);
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    }
  }
}

TEST(HostileInputTest, AFloodOfOversizeRequestsKeepsMemoryBounded) {
  // Limit 1 MiB; each request declares and carries 4 MiB.
  auto server = ServerProcess::Start({"--backend=cpu", "--max_request_bytes=1048576"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = *client::MatmulClient::Create({.target = (*server)->target(), .channels = 4});
  const v1::MultiplyRequest big = client::RandomRequest({.m = 740, .n = 740, .k = 740}, Rng());
  ASSERT_GT(big.ByteSizeLong(), 4u << 20);
  auto flood = [&](int calls) {
    std::vector<std::thread> senders;
    for (int t = 0; t < 8; ++t) {
      senders.emplace_back([&] {
        for (int i = 0; i < calls / 8; ++i) {
          EXPECT_EQ(c->Multiply(big).status().code(), absl::StatusCode::kResourceExhausted);
        }
      });
    }
    for (auto& t : senders) t.join();
  };
  // Memory may move while gRPC's and the allocator's pools fill, but must
  // level off: later rounds of the flood add nothing like what they offer.
  std::vector<int64_t> rss;
  for (int round = 0; round < 10; ++round) {
    flood(256);  // 1 GiB offered per round.
    rss.push_back(RssBytes((*server)->pid()));
    std::printf("server RSS after round %d of 256 oversize requests (1 GiB offered): %.1f MiB\n",
                round + 1, rss.back() / 1048576.0);
  }
  // 10 GiB offered: the second half of the flood (5 GiB) must not raise the
  // peak of the first half by more than what the flood can hold in flight
  // at one sample: 8 senders with up to two 4 MiB messages each in gRPC's
  // buffers (64 MiB), as much again for the pools. How much is in flight
  // depends on how busy the host is: on an idle 2-core machine the samples
  // stay within 25 MiB of each other, but with the rest of the suite
  // running beside it they rose by 79 MiB (CI, 2026-12-03), against a
  // 64 MiB bound that this test used to have. A leak of even 3% of the
  // refused bytes would add 150 MiB.
  const int64_t first = *std::max_element(rss.begin(), rss.begin() + 5);
  const int64_t second = *std::max_element(rss.begin() + 5, rss.end());
  EXPECT_LT(second, first + (128 << 20)) << "memory keeps growing with the flood";
  // Still serving.
  const auto fine = client::RandomRequest({.m = 8, .n = 8, .k = 8}, Rng());
  auto r = c->Multiply(fine);
  ASSERT_TRUE(r.ok()) << r.status();
}

}  // namespace
}  // namespace matmul
