// Fault soak: steady load from many callers mixing valid, invalid,
// short-deadline and cancelled calls, streams whose clients walk away
// mid-stream, then a SIGTERM drain. Every call must end exactly once with a
// clear status, the server's counters must agree with what the clients saw,
// memory must stay flat, and the drain must finish in its grace period.
// Bounded by request count, not time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "tests/util/test_util.h"

namespace matmul {
namespace {

using testing::HttpGet;
using testing::MetricSum;
using testing::ServerProcess;

int64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      int64_t kb = 0;
      absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(6, line.size() - 9)), &kb);
      return kb * 1024;
    }
  }
  return -1;
}

// What the clients saw, by kind of call and final status code.
class Tally {
 public:
  void Add(const std::string& kind, grpc::StatusCode code) {
    absl::MutexLock lock(&mu_);
    ++counts_[{kind, code}];
  }
  int Get(const std::string& kind, grpc::StatusCode code) const {
    absl::MutexLock lock(&mu_);
    auto it = counts_.find({kind, code});
    return it == counts_.end() ? 0 : it->second;
  }
  int Total(const std::string& kind) const {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& [key, count] : counts_) {
      if (key.first == kind) n += count;
    }
    return n;
  }
  std::string Describe() const {
    absl::MutexLock lock(&mu_);
    std::string s;
    for (const auto& [key, count] : counts_) {
      absl::StrAppend(&s, key.first, "/", key.second, "=", count, " ");
    }
    return s;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, grpc::StatusCode>, int> counts_ ABSL_GUARDED_BY(mu_);
};

TEST(SoakTest, MixedFaultyLoadLosesNothingAndTheCountersAgree) {
  constexpr int kCallers = 24, kRounds = 200;
  const std::string log = absl::StrCat("/tmp/matmul-soak-", getpid(), ".log");
  auto server = ServerProcess::Start({"--backend=cpu", "--max_queue_delay_us=2000",
                                      "--queue_capacity=100000", "--shutdown_grace_s=60",
                                      "--max_stream_inflight=8"},
                                     log);
  ASSERT_TRUE(server.ok()) << server.status();
  auto c = *client::MatmulClient::Create({.target = (*server)->target(), .channels = 4});
  Tally tally;
  std::atomic<int> wrong{0}, unclear{0};
  std::atomic<int> stream_items_sent{0}, stream_items_answered{0};
  const absl::Time start = absl::Now();
  int64_t rss_mid = 0;

  auto caller = [&](int t) {
    std::mt19937_64 rng(1000 + t);
    for (int round = 0; round < kRounds; ++round) {
      const int kind = static_cast<int>(rng() % 10);
      const auto request = client::RandomRequest(
          {.m = 1 + static_cast<int64_t>(rng() % 48), .n = 1 + static_cast<int64_t>(rng() % 48),
           .k = 1 + static_cast<int64_t>(rng() % 48),
           .dtype = static_cast<DType>(rng() % 4)},
          rng);
      if (kind <= 3) {  // Valid unary.
        grpc::ClientContext context;
        v1::MultiplyResponse response;
        const grpc::Status s = c->stub()->Multiply(&context, request, &response);
        tally.Add("unary", s.error_code());
        if (!s.ok() || !(*client::CheckResponse(request, response) <= 1e-2)) wrong.fetch_add(1);
      } else if (kind == 4) {  // Invalid unary.
        v1::MultiplyRequest bad = request;
        bad.mutable_b()->set_rows(bad.b().rows() + 1);
        grpc::ClientContext context;
        v1::MultiplyResponse response;
        const grpc::Status s = c->stub()->Multiply(&context, bad, &response);
        tally.Add("unary", s.error_code());
        if (s.error_code() != grpc::StatusCode::INVALID_ARGUMENT) wrong.fetch_add(1);
      } else if (kind == 5) {  // Short deadline: OK or DEADLINE_EXCEEDED.
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(500));
        v1::MultiplyResponse response;
        const grpc::Status s = c->stub()->Multiply(&context, request, &response);
        tally.Add("deadline", s.error_code());
        if (s.error_code() != grpc::StatusCode::OK &&
            s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
          unclear.fetch_add(1);
        }
      } else if (kind == 6) {  // Cancelled by the client: OK or CANCELLED.
        grpc::ClientContext context;
        v1::MultiplyResponse response;
        std::thread canceller([&context] {
          absl::SleepFor(absl::Microseconds(300));
          context.TryCancel();
        });
        const grpc::Status s = c->stub()->Multiply(&context, request, &response);
        canceller.join();
        tally.Add("cancelled", s.error_code());
        if (s.error_code() != grpc::StatusCode::OK && s.error_code() != grpc::StatusCode::CANCELLED) {
          unclear.fetch_add(1);
        }
      } else {  // A stream of 12 items (some bad); kind 9 walks away midway.
        const bool abandon = kind == 9;
        grpc::ClientContext context;
        auto stream = c->stub()->MultiplyStream(&context);
        std::vector<v1::MultiplyRequest> items;
        for (int i = 0; i < 12; ++i) {
          v1::MultiplyRequest item = client::RandomRequest({.m = 8, .n = 8, .k = 8}, rng);
          item.set_request_id(absl::StrCat(i));
          if (i % 5 == 4) item.mutable_a()->mutable_data()->pop_back();
          items.push_back(std::move(item));
        }
        std::thread writer([&] {
          for (const auto& item : items) {
            if (!stream->Write(item)) break;
            stream_items_sent.fetch_add(1);
          }
          stream->WritesDone();
        });
        v1::MultiplyResponse response;
        std::set<std::string> seen;
        while (stream->Read(&response)) {
          stream_items_answered.fetch_add(1);
          if (!seen.insert(response.request_id()).second) wrong.fetch_add(1);  // Twice.
          if (abandon && seen.size() == 6) context.TryCancel();
        }
        writer.join();
        const grpc::Status s = stream->Finish();
        tally.Add(abandon ? "stream-abandoned" : "stream", s.error_code());
        if (!abandon && (!s.ok() || seen.size() != items.size())) wrong.fetch_add(1);
      }
      if (t == 0 && round == kRounds / 2) rss_mid = RssBytes((*server)->pid());
    }
  };
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) callers.emplace_back(caller, t);
  for (auto& t : callers) t.join();
  const int64_t rss_end = RssBytes((*server)->pid());
  const std::string metrics = HttpGet((*server)->metrics_port(), "/metrics");

  // The drain: a last burst in flight, then SIGTERM.
  std::vector<std::thread> last;
  std::atomic<int> last_ok{0}, last_refused{0};
  for (int t = 0; t < 8; ++t) {
    last.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      auto r = c->Multiply(client::RandomRequest({.m = 64, .n = 64, .k = 64}, rng));
      if (r.ok()) last_ok.fetch_add(1);
      else if (r.status().code() == absl::StatusCode::kUnavailable) last_refused.fetch_add(1);
    });
  }
  absl::SleepFor(absl::Milliseconds(1));
  const absl::Time drain_start = absl::Now();
  (*server)->Signal(SIGTERM);
  const int exit_code = (*server)->Wait();
  const absl::Duration drain = absl::Now() - drain_start;
  for (auto& t : last) t.join();

  std::printf(
      "soak: %d callers x %d rounds in %.1f s; client tally: %s\n"
      "      stream items sent %d answered %d; drain %.2f s (exit %d), last burst %d OK + %d "
      "UNAVAILABLE; server RSS %.1f MiB at mid-run, %.1f MiB at end\n",
      kCallers, kRounds, absl::ToDoubleSeconds(absl::Now() - start), tally.Describe().c_str(),
      stream_items_sent.load(), stream_items_answered.load(), absl::ToDoubleSeconds(drain),
      exit_code, last_ok.load(), last_refused.load(), rss_mid / 1048576.0, rss_end / 1048576.0);

  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(unclear.load(), 0);
  EXPECT_EQ(exit_code, 0);
  // The server says whether the drain finished inside its grace period.
  std::ifstream in(log);
  const std::string server_log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(server_log, ::testing::HasSubstr("every accepted request answered; exiting"));
  if (!::testing::Test::HasFailure()) std::remove(log.c_str());
  EXPECT_EQ(last_ok.load() + last_refused.load(), 8);
  // Counters agree with the clients. Plain unary calls: exactly.
  auto server_count = [&](const std::string& method, const std::string& code) {
    return MetricSum(metrics, absl::StrCat("matmul_requests_total{code=\"", code, "\",method=\"",
                                           method, "\"}"));
  };
  const int deadline_ok = tally.Get("deadline", grpc::StatusCode::OK);
  const int cancelled_ok = tally.Get("cancelled", grpc::StatusCode::OK);
  const int deadline_missed = tally.Get("deadline", grpc::StatusCode::DEADLINE_EXCEEDED);
  const int cancelled = tally.Get("cancelled", grpc::StatusCode::CANCELLED);
  EXPECT_EQ(server_count("Multiply", "INVALID_ARGUMENT"),
            tally.Get("unary", grpc::StatusCode::INVALID_ARGUMENT));
  // A call the client gave up on may still have been answered OK by the
  // server (it finished just after), or never have reached it.
  const double server_ok = server_count("Multiply", "OK");
  const int client_ok = tally.Get("unary", grpc::StatusCode::OK) + deadline_ok + cancelled_ok;
  EXPECT_GE(server_ok, client_ok);
  EXPECT_LE(server_ok, client_ok + deadline_missed + cancelled);
  EXPECT_LE(server_count("Multiply", "DEADLINE_EXCEEDED") + server_count("Multiply", "CANCELLED"),
            deadline_missed + cancelled);
  // Stream items: every answered item was counted, none beyond those sent.
  double server_items = 0;
  for (const char* code : {"OK", "INVALID_ARGUMENT", "CANCELLED", "UNAVAILABLE"}) {
    server_items += server_count("MultiplyStream", code);
  }
  EXPECT_GE(server_items, stream_items_answered.load());
  EXPECT_LE(server_items, stream_items_sent.load());
  EXPECT_EQ(MetricSum(metrics, "matmul_inflight_requests"), 0);
  EXPECT_EQ(MetricSum(metrics, "matmul_queue_depth"), 0);
  // Memory flat: the second half of the run did not grow it materially.
  // Under AddressSanitizer freed memory sits in its quarantine (256 MiB), so
  // RSS says nothing there; its leak checker covers that build instead.
#if defined(__SANITIZE_ADDRESS__)
  std::cout << "soak_test: RSS check not made under AddressSanitizer (quarantine); "
            << "rss_mid=" << rss_mid << " rss_end=" << rss_end << "\n";
#else
  EXPECT_LT(rss_end, rss_mid + (64 << 20));
#endif
}

}  // namespace
}  // namespace matmul
