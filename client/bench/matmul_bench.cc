// matmul-bench: load generator and service benchmark for matmul-server, with
// a plain gRPC echo as the transport baseline.
//
//   matmul-bench serve-echo --listen=0.0.0.0:50052
//   matmul-bench run --target=HOST:50051 --echo_target=HOST:50052 \
//       --shapes=small,medium --dtypes=bf16,f32 --concurrency=1,16,64 \
//       --modes=unary,stream --duration_s=3 --json=bench.json --label=batching-on
//   matmul-bench open --target=HOST:50051 --rates=500,1000,2000 --shapes=small
//
// "run" is closed-loop: each caller sends its next request when the last
// answer arrives (unary calls, or one bidi stream per caller). "open" sends
// at Poisson arrival times at each rate. Each row reports requests/s, payload
// GB/s (request plus response matrix bytes), effective TFLOP/s, and latency
// percentiles; rows go to a table and to JSON (client/bench/plot_bench.py
// draws latency against throughput from it).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "matmul/bench/echo.grpc.pb.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50052", "serve-echo: address to serve on.");
ABSL_FLAG(std::string, target, "localhost:50051", "matmul-server address.");
ABSL_FLAG(std::string, echo_target, "", "Echo server address; when set, every matmul row gets an "
                                        "echo row with the same bytes and callers.");
ABSL_FLAG(std::string, shapes, "small", "Comma list: small (64..256 random), medium (1024^3), "
                                        "large (4096^3), or MxNxK.");
ABSL_FLAG(std::string, dtypes, "bf16", "Comma list of input dtypes.");
ABSL_FLAG(std::string, concurrency, "1,16,64", "run: comma list of concurrent callers.");
ABSL_FLAG(std::string, rates, "100,1000", "open: comma list of request rates (per second).");
ABSL_FLAG(std::string, modes, "unary", "Comma list: unary, stream.");
ABSL_FLAG(double, duration_s, 3.0, "Measured seconds per row.");
ABSL_FLAG(double, warmup_s, 0.5, "Unmeasured seconds before each row.");
ABSL_FLAG(int, channels, 1, "TCP connections the callers are spread over.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle to verify the server with; turns TLS on.");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "", "Name expected in the server's certificate, if not the target's host.");
ABSL_FLAG(std::string, token_file, "", "File holding a bearer token to send with every call.");
ABSL_FLAG(std::string, label, "", "Label for the rows (e.g. batching-on).");
ABSL_FLAG(std::string, json, "", "Append rows to this JSON-lines file.");
ABSL_FLAG(bool, verify, true, "Check one response per shape against a float64 reference first.");

namespace matmul::bench {
namespace {

using client::ProblemSpec;

// ---- Echo server -------------------------------------------------------------

class EchoService final : public Echo::CallbackService {
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context, const EchoMessage* request,
                                 EchoMessage* response) override {
    Answer(*request, response);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerBidiReactor<EchoMessage, EchoMessage>* EchoStream(
      grpc::CallbackServerContext*) override {
    class Reactor : public grpc::ServerBidiReactor<EchoMessage, EchoMessage> {
     public:
      Reactor() { StartRead(&request_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        Answer(request_, &response_);
        StartWrite(&response_);
      }
      void OnWriteDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::CANCELLED);
          return;
        }
        StartRead(&request_);
      }
      void OnDone() override { delete this; }

     private:
      EchoMessage request_, response_;
    };
    return new Reactor();
  }

  static void Answer(const EchoMessage& request, EchoMessage* response) {
    const uint64_t bytes = request.response_bytes() == 0 ? request.payload().size()
                                                         : request.response_bytes();
    std::string* out = response->mutable_payload();
    out->assign(request.payload(), 0, std::min<uint64_t>(bytes, request.payload().size()));
    out->resize(bytes);
  }
};

int ServeEcho() {
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(INT32_MAX);
  builder.SetMaxSendMessageSize(INT32_MAX);
  auto server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "matmul-bench: cannot listen on %s\n", absl::GetFlag(FLAGS_listen).c_str());
    return 1;
  }
  std::printf("echo server on port %d\n", port);
  std::fflush(stdout);
  server->Wait();
  return 0;
}

// ---- Workloads -----------------------------------------------------------------

struct Workload {
  std::string shape;
  DType dtype;
  // A pool of requests, used round-robin.
  std::vector<v1::MultiplyRequest> requests;
  std::vector<bench::EchoMessage> echoes;  // Same request and response sizes.
  std::vector<double> flops;
  std::vector<uint64_t> bytes;  // Request + response matrix bytes.
};

Workload MakeWorkload(const std::string& shape, DType dtype, std::mt19937_64& rng) {
  Workload w;
  w.shape = shape;
  w.dtype = dtype;
  std::vector<std::array<int64_t, 3>> dims;
  if (shape == "small") {
    std::uniform_int_distribution<int64_t> d(64, 256);
    for (int i = 0; i < 64; ++i) dims.push_back({d(rng), d(rng), d(rng)});
  } else if (shape == "medium") {
    dims.push_back({1024, 1024, 1024});
  } else if (shape == "large") {
    dims.push_back({4096, 4096, 4096});
  } else {
    std::vector<std::string> parts = absl::StrSplit(shape, 'x');
    std::array<int64_t, 3> v{};
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &v[0]) ||
        !absl::SimpleAtoi(parts[1], &v[1]) || !absl::SimpleAtoi(parts[2], &v[2])) {
      std::fprintf(stderr, "matmul-bench: bad shape %s\n", shape.c_str());
      std::exit(2);
    }
    dims.push_back(v);
  }
  for (const auto& d : dims) {
    ProblemSpec spec{.m = d[0], .n = d[1], .k = d[2], .dtype = dtype};
    w.requests.push_back(client::RandomRequest(spec, rng));
    const uint64_t in = w.requests.back().a().data().size() + w.requests.back().b().data().size();
    const uint64_t out = static_cast<uint64_t>(d[0]) * d[1] * ElementSize(dtype);
    bench::EchoMessage echo;
    // The echo carries the same bytes: the operands out, a result-sized answer back.
    echo.mutable_payload()->assign(w.requests.back().a().data());
    echo.mutable_payload()->append(w.requests.back().b().data());
    echo.set_response_bytes(out);
    w.echoes.push_back(std::move(echo));
    w.flops.push_back(2.0 * d[0] * d[1] * d[2]);
    w.bytes.push_back(in + out);
  }
  return w;
}

// ---- Measurement -----------------------------------------------------------------

struct Result {
  std::string label, target, mode, shape, dtype;
  int concurrency = 0;
  double rate = 0;  // Open loop only.
  uint64_t requests = 0, errors = 0;
  double seconds = 0, rps = 0, gbps = 0, tflops = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0;  // ms
  std::string first_error;
};

// Shared by the callers of one row.
class Recorder {
 public:
  Recorder(absl::Time start, absl::Time end) : start_(start), end_(end) {}
  bool Running() const { return absl::Now() < end_; }
  void Record(absl::Time sent, absl::Time done, double flops, uint64_t bytes, const grpc::Status& s) {
    if (sent < start_ || done > end_) return;  // Warm-up or cool-down.
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      ++errors_;
      if (first_error_.empty()) first_error_ = absl::StrCat(s.error_code(), ": ", s.error_message());
      return;
    }
    latencies_.push_back(absl::ToDoubleMilliseconds(done - sent));
    flops_ += flops;
    bytes_ += bytes;
  }
  void Fill(Result* r) {
    absl::MutexLock lock(&mu_);
    std::sort(latencies_.begin(), latencies_.end());
    auto pct = [&](double q) {
      if (latencies_.empty()) return 0.0;
      return latencies_[std::min(latencies_.size() - 1, static_cast<size_t>(q * latencies_.size()))];
    };
    r->seconds = absl::ToDoubleSeconds(end_ - start_);
    r->requests = latencies_.size();
    r->errors = errors_;
    r->first_error = first_error_;
    r->rps = r->requests / r->seconds;
    r->gbps = bytes_ / r->seconds / 1e9;
    r->tflops = flops_ / r->seconds / 1e12;
    r->p50 = pct(0.5);
    r->p90 = pct(0.9);
    r->p99 = pct(0.99);
    r->p999 = pct(0.999);
  }

 private:
  const absl::Time start_, end_;
  absl::Mutex mu_;
  std::vector<double> latencies_ ABSL_GUARDED_BY(mu_);
  double flops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_error_ ABSL_GUARDED_BY(mu_);
};

// A request/response pair of either service.
template <typename Req, typename Resp>
struct Calls {
  // Unary call on `stub` for `request`; `done` runs with the status.
  std::function<void(grpc::ClientContext*, const Req*, Resp*, std::function<void(grpc::Status)>)> unary;
  // Opens a bidi stream.
  std::function<void(grpc::ClientContext*, grpc::ClientBidiReactor<Req, Resp>*)> stream;
};

// Closed-loop unary caller: next request when the last answer arrives.
template <typename Req, typename Resp>
class UnaryCaller {
 public:
  UnaryCaller(Calls<Req, Resp> calls, const std::vector<Req>* pool, const Workload* w, int offset,
              Recorder* recorder, absl::Notification* done, std::atomic<int>* live)
      : calls_(std::move(calls)), pool_(pool), w_(w), index_(offset), recorder_(recorder),
        done_(done), live_(live) {}
  void Start() {
    if (!recorder_->Running()) {
      if (live_->fetch_sub(1) == 1) done_->Notify();
      return;
    }
    // Contexts alternate: this runs inside the previous call's callback, so
    // that call's context must outlive it.
    auto& context = contexts_[++calls_made_ % 2];
    context = std::make_unique<grpc::ClientContext>();
    index_ = (index_ + 1) % pool_->size();
    sent_ = absl::Now();
    calls_.unary(context.get(), &(*pool_)[index_], &response_, [this](grpc::Status s) {
      recorder_->Record(sent_, absl::Now(), w_->flops[index_], w_->bytes[index_], s);
      Start();
    });
  }

 private:
  Calls<Req, Resp> calls_;
  const std::vector<Req>* pool_;
  const Workload* w_;
  size_t index_;
  Recorder* recorder_;
  absl::Notification* done_;
  std::atomic<int>* live_;
  std::unique_ptr<grpc::ClientContext> contexts_[2];
  uint64_t calls_made_ = 0;
  Resp response_;
  absl::Time sent_;
};

// Closed-loop streaming caller: one request in flight on its own stream.
template <typename Req, typename Resp>
class StreamCaller : public grpc::ClientBidiReactor<Req, Resp> {
 public:
  StreamCaller(Calls<Req, Resp> calls, const std::vector<Req>* pool, const Workload* w, int offset,
               Recorder* recorder, absl::Notification* done, std::atomic<int>* live)
      : pool_(pool), w_(w), index_(offset), recorder_(recorder), done_(done), live_(live) {
    calls.stream(&context_, this);
  }
  void Start() {
    this->StartCall();
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (ok) this->StartRead(&response_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    grpc::Status s = grpc::Status::OK;
    if constexpr (std::is_same_v<Resp, v1::MultiplyResponse>) {
      if (response_.has_error()) {
        s = grpc::Status(static_cast<grpc::StatusCode>(response_.error().code()),
                         response_.error().message());
      }
    }
    recorder_->Record(sent_, absl::Now(), w_->flops[index_], w_->bytes[index_], s);
    Next();
  }
  void OnDone(const grpc::Status&) override {
    if (live_->fetch_sub(1) == 1) done_->Notify();
    delete this;
  }

 private:
  void Next() {
    if (!recorder_->Running()) {
      this->StartWritesDone();
      return;
    }
    index_ = (index_ + 1) % pool_->size();
    sent_ = absl::Now();
    this->StartWrite(&(*pool_)[index_]);
  }
  grpc::ClientContext context_;
  const std::vector<Req>* pool_;
  const Workload* w_;
  size_t index_;
  Recorder* recorder_;
  absl::Notification* done_;
  std::atomic<int>* live_;
  Resp response_;
  absl::Time sent_;
};

// Security settings from the flags (the echo server is always plain text).
client::ClientOptions g_security;

// Adds the bearer token to a call to matmul-server.
void Authorize(grpc::ClientContext* context) {
  if (!g_security.auth_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + g_security.auth_token);
  }
}

std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& target, int count,
                                                     bool secure) {
  client::ClientOptions options = secure ? g_security : client::ClientOptions();
  options.max_message_bytes = INT32_MAX;
  auto credentials = client::MakeChannelCredentials(options);
  if (!credentials.ok()) {
    std::fprintf(stderr, "matmul-bench: %s\n", std::string(credentials.status().message()).c_str());
    std::exit(2);
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments args = client::MakeChannelArguments(options);
    args.SetInt("matmul.bench.channel", i);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels.push_back(grpc::CreateCustomChannel(target, *credentials, args));
  }
  return channels;
}

template <typename Req, typename Resp>
Result RunClosed(const std::vector<Calls<Req, Resp>>& per_channel, const std::vector<Req>& pool,
                 const Workload& w, bool stream, int concurrency) {
  const absl::Time start = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_warmup_s));
  Recorder recorder(start, start + absl::Seconds(absl::GetFlag(FLAGS_duration_s)));
  absl::Notification done;
  std::atomic<int> live{concurrency};
  std::vector<std::unique_ptr<UnaryCaller<Req, Resp>>> unary;
  for (int i = 0; i < concurrency; ++i) {
    const auto& calls = per_channel[i % per_channel.size()];
    if (stream) {
      (new StreamCaller<Req, Resp>(calls, &pool, &w, i, &recorder, &done, &live))->Start();
    } else {
      unary.push_back(std::make_unique<UnaryCaller<Req, Resp>>(calls, &pool, &w, i, &recorder,
                                                               &done, &live));
      unary.back()->Start();
    }
  }
  done.WaitForNotification();
  Result r;
  recorder.Fill(&r);
  r.concurrency = concurrency;
  return r;
}

// Open loop: Poisson arrivals at `rate` per second, any number in flight.
Result RunOpen(client::MatmulClient& c, const Workload& w, double rate) {
  const absl::Time start = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_warmup_s));
  const absl::Time end = start + absl::Seconds(absl::GetFlag(FLAGS_duration_s));
  Recorder recorder(start, end);
  struct Call {
    grpc::ClientContext context;
    v1::MultiplyResponse response;
    absl::Time sent;
    size_t index;
  };
  std::atomic<int> in_flight{0};
  std::mt19937_64 rng(7);
  std::exponential_distribution<double> gap(rate);
  absl::Time next = absl::Now();
  size_t i = 0;
  while (next < end) {
    absl::SleepFor(next - absl::Now());
    auto* call = new Call();
    call->index = i++ % w.requests.size();
    call->sent = absl::Now();
    in_flight.fetch_add(1);
    c.MultiplyAsync(&call->context, &w.requests[call->index], &call->response,
                    [call, &recorder, &w, &in_flight](grpc::Status s) {
                      recorder.Record(call->sent, absl::Now(), w.flops[call->index],
                                      w.bytes[call->index], s);
                      delete call;
                      in_flight.fetch_sub(1);
                    });
    next += absl::Seconds(gap(rng));
  }
  while (in_flight.load() > 0) absl::SleepFor(absl::Milliseconds(1));
  Result r;
  recorder.Fill(&r);
  r.rate = rate;
  return r;
}

void Print(const Result& r) {
  std::printf("%-13s %-6s %-6s %-8s %-8s %6d %7.0f %9.1f %8.3f %9.3f %8.3f %8.3f %8.3f %8.3f %s\n",
              r.label.c_str(), r.target.c_str(), r.mode.c_str(), r.shape.c_str(), r.dtype.c_str(),
              r.concurrency, r.rate, r.rps, r.gbps, r.tflops, r.p50, r.p90, r.p99, r.p999,
              r.errors ? absl::StrCat(r.errors, " errors: ", r.first_error).c_str() : "");
  std::fflush(stdout);
  const std::string path = absl::GetFlag(FLAGS_json);
  if (path.empty()) return;
  std::ofstream(path, std::ios::app) << absl::StrFormat(
      "{\"label\": \"%s\", \"target\": \"%s\", \"mode\": \"%s\", \"shape\": \"%s\", \"dtype\": "
      "\"%s\", \"concurrency\": %d, \"rate\": %.1f, \"requests\": %d, \"errors\": %d, \"rps\": "
      "%.2f, \"gbps\": %.4f, \"tflops\": %.4f, \"p50_ms\": %.4f, \"p90_ms\": %.4f, \"p99_ms\": "
      "%.4f, \"p999_ms\": %.4f}\n",
      r.label, r.target, r.mode, r.shape, r.dtype, r.concurrency, r.rate, r.requests, r.errors,
      r.rps, r.gbps, r.tflops, r.p50, r.p90, r.p99, r.p999);
}

std::vector<std::string> List(const std::string& flag) {
  return absl::StrSplit(flag, ',', absl::SkipWhitespace());
}

int Run(bool open) {
  std::mt19937_64 rng(std::random_device{}());
  const int channels = absl::GetFlag(FLAGS_channels);
  absl::Status security = client::ApplySecurityFlags(
      absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
      absl::GetFlag(FLAGS_tls_server_name), absl::GetFlag(FLAGS_token_file), &g_security);
  if (!security.ok()) {
    std::fprintf(stderr, "matmul-bench: %s\n", std::string(security.message()).c_str());
    return 2;
  }
  client::ClientOptions options = g_security;
  options.target = absl::GetFlag(FLAGS_target);
  options.channels = channels;
  options.max_message_bytes = INT32_MAX;
  auto c = client::MatmulClient::Create(options);
  if (!c.ok()) {
    std::fprintf(stderr, "matmul-bench: %s\n", std::string(c.status().message()).c_str());
    return 2;
  }
  auto info = (*c)->GetServerInfo();
  if (!info.ok()) {
    std::fprintf(stderr, "matmul-bench: %s\n", info.status().ToString().c_str());
    return 1;
  }
  std::printf("# %s %s engine=%s devices=%d max_batch_size=%u max_queue_delay_us=%llu\n",
              options.target.c_str(), info->version().c_str(), info->engine().c_str(),
              info->devices_size(), info->batching().max_batch_size(),
              static_cast<unsigned long long>(info->batching().max_queue_delay_us()));
  std::printf("%-13s %-6s %-6s %-8s %-8s %6s %7s %9s %8s %9s %8s %8s %8s %8s\n", "label", "target",
              "mode", "shape", "dtype", "conc", "rate", "req/s", "GB/s", "TFLOP/s", "p50 ms",
              "p90 ms", "p99 ms", "p99.9 ms");
  // Stubs per channel for matmul and echo.
  auto mm_channels = Channels(options.target, channels, /*secure=*/true);
  std::vector<Calls<v1::MultiplyRequest, v1::MultiplyResponse>> mm_calls;
  std::vector<std::unique_ptr<v1::MatmulService::Stub>> mm_stubs;
  for (auto& ch : mm_channels) {
    mm_stubs.push_back(v1::MatmulService::NewStub(ch));
    auto* stub = mm_stubs.back().get();
    mm_calls.push_back({[stub](auto* ctx, auto* req, auto* resp, auto done) {
                          Authorize(ctx);
                          stub->async()->Multiply(ctx, req, resp, std::move(done));
                        },
                        [stub](auto* ctx, auto* reactor) {
                          Authorize(ctx);
                          stub->async()->MultiplyStream(ctx, reactor);
                        }});
  }
  std::vector<Calls<EchoMessage, EchoMessage>> echo_calls;
  std::vector<std::unique_ptr<Echo::Stub>> echo_stubs;
  const std::string echo_target = absl::GetFlag(FLAGS_echo_target);
  if (!echo_target.empty()) {
    for (auto& ch : Channels(echo_target, channels, /*secure=*/false)) {
      echo_stubs.push_back(Echo::NewStub(ch));
      auto* stub = echo_stubs.back().get();
      echo_calls.push_back({[stub](auto* ctx, auto* req, auto* resp, auto done) {
                              stub->async()->Echo(ctx, req, resp, std::move(done));
                            },
                            [stub](auto* ctx, auto* reactor) {
                              stub->async()->EchoStream(ctx, reactor);
                            }});
    }
  }
  for (const std::string& shape : List(absl::GetFlag(FLAGS_shapes))) {
    for (const std::string& dtype_name : List(absl::GetFlag(FLAGS_dtypes))) {
      const std::optional<DType> dtype = client::ParseDType(dtype_name);
      if (!dtype.has_value()) {
        std::fprintf(stderr, "matmul-bench: bad dtype %s\n", dtype_name.c_str());
        return 2;
      }
      const Workload w = MakeWorkload(shape, *dtype, rng);
      if (absl::GetFlag(FLAGS_verify)) {
        auto response = (*c)->Multiply(w.requests.front());
        absl::StatusOr<double> err =
            response.ok() ? client::CheckResponse(w.requests.front(), *response)
                          : absl::StatusOr<double>(response.status());
        if (!err.ok() || !(*err <= 1e-2)) {
          std::fprintf(stderr, "matmul-bench: %s %s result check failed: %s\n", shape.c_str(),
                       dtype_name.c_str(),
                       err.ok() ? absl::StrCat("relative error ", *err).c_str()
                                : std::string(err.status().message()).c_str());
          return 1;
        }
      }
      auto finish = [&](Result r, const std::string& target, const std::string& mode) {
        r.label = absl::GetFlag(FLAGS_label);
        r.target = target;
        r.mode = mode;
        r.shape = shape;
        r.dtype = std::string(DTypeName(*dtype));
        Print(r);
      };
      if (open) {
        for (const std::string& rate_text : List(absl::GetFlag(FLAGS_rates))) {
          double rate;
          if (!absl::SimpleAtod(rate_text, &rate) || rate <= 0) return 2;
          finish(RunOpen(**c, w, rate), "matmul", "open");
        }
        continue;
      }
      for (const std::string& mode : List(absl::GetFlag(FLAGS_modes))) {
        const bool stream = mode == "stream";
        for (const std::string& conc_text : List(absl::GetFlag(FLAGS_concurrency))) {
          int conc;
          if (!absl::SimpleAtoi(conc_text, &conc) || conc < 1) return 2;
          finish(RunClosed(mm_calls, w.requests, w, stream, conc), "matmul", mode);
          if (!echo_calls.empty()) {
            finish(RunClosed(echo_calls, w.echoes, w, stream, conc), "echo", mode);
          }
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace matmul::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "matmul-bench <serve-echo|run|open> [flags]: load generator for matmul-server "
      "(closed-loop sweep, open-loop Poisson) with a gRPC echo baseline.");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "matmul-bench: expected one command: serve-echo, run or open\n");
    return 2;
  }
  const std::string command = args[1];
  if (command == "serve-echo") return matmul::bench::ServeEcho();
  if (command == "run") return matmul::bench::Run(false);
  if (command == "open") return matmul::bench::Run(true);
  std::fprintf(stderr, "matmul-bench: unknown command %s\n", command.c_str());
  return 2;
}
