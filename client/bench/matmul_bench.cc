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
// percentiles, with the medians of the server's own Timing (queue, engine,
// arrival to answer), the mean batch size, and each call's latency outside
// the server's Timing ("wire p50", the echo's whole latency); rows go to a table and to
// JSON (client/bench/plot_bench.py draws latency against throughput).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
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
#include "kernels/reference_gemm.h"
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
ABSL_FLAG(std::string, operands, "inline",
          "Comma list: inline (every request carries A and B), resident (B is stored on the "
          "server once with PutMatrix and named by handle; only A and the result travel), shm "
          "(operands and results in POSIX shared memory; same host, server with --shared_memory).");
ABSL_FLAG(int, chain_length, 10, "chain: products in the chain.");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "Check every absl::Mutex acquisition (gRPC's included) for lock-order cycles; off by "
          "default, as in matmul-server, so that the echo baseline and the client pay what the "
          "server pays.");
ABSL_FLAG(std::vector<std::string>, grpc_arg, {},
          "Extra gRPC channel arguments, name=value, comma separated, for every channel this "
          "tool opens and for serve-echo (e.g. grpc.http2.max_frame_size=1048576).");

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

// --grpc_arg as (name, value) pairs; exits on a malformed one.
std::vector<std::pair<std::string, std::string>> ExtraGrpcArgs() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& arg : absl::GetFlag(FLAGS_grpc_arg)) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "matmul-bench: --grpc_arg must be name=value, got \"%s\"\n",
                   arg.c_str());
      std::exit(2);
    }
    out.emplace_back(arg.substr(0, eq), arg.substr(eq + 1));
  }
  return out;
}

int ServeEcho() {
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(INT32_MAX);
  builder.SetMaxSendMessageSize(INT32_MAX);
  // The same frames as matmul-server allows, so the echo stays a fair ceiling.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, client::kHttp2FrameBytes);
  for (const auto& [name, value] : ExtraGrpcArgs()) {
    int number;
    if (absl::SimpleAtoi(value, &number)) {
      builder.AddChannelArgument(name, number);
    } else {
      builder.AddChannelArgument(name, value);
    }
  }
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
  // "inline" or "resident".
  std::string operands = "inline";
  // A pool of requests, used round-robin.
  std::vector<v1::MultiplyRequest> requests;
  // The same requests with every operand inline (for checking results).
  std::vector<v1::MultiplyRequest> inline_requests;
  std::vector<bench::EchoMessage> echoes;  // Same request and response sizes.
  std::vector<double> flops;
  std::vector<uint64_t> bytes;  // Request + response matrix bytes.
};

Workload MakeWorkload(const std::string& shape, DType dtype, std::mt19937_64& rng) {
  Workload w;
  w.shape = shape;
  w.dtype = dtype;
  std::vector<std::array<int64_t, 3>> dims;
  // weightsN: one N x N B shared by every request, A of 1..256 rows (a
  // weight matrix times a stream of inputs).
  int64_t weights = 0;
  if (absl::StartsWith(shape, "weights") && absl::SimpleAtoi(shape.substr(7), &weights) &&
      weights > 0) {
    std::uniform_int_distribution<int64_t> rows(1, 256);
    for (int i = 0; i < 64; ++i) dims.push_back({rows(rng), weights, weights});
  } else if (shape == "small") {
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
        !absl::SimpleAtoi(parts[1], &v[1]) || !absl::SimpleAtoi(parts[2], &v[2]) || v[0] < 1 ||
        v[1] < 1 || v[2] < 1) {
      std::fprintf(stderr,
                   "matmul-bench: bad shape %s (small, medium, large, weightsN or MxNxK, each "
                   "at least 1)\n",
                   shape.c_str());
      std::exit(2);
    }
    dims.push_back(v);
  }
  v1::Matrix shared_b;
  for (const auto& d : dims) {
    ProblemSpec spec{.m = d[0], .n = d[1], .k = d[2], .dtype = dtype};
    w.requests.push_back(client::RandomRequest(spec, rng));
    if (weights > 0) {
      if (shared_b.data().empty()) shared_b = w.requests.back().b();
      *w.requests.back().mutable_b() = shared_b;
    }
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
  w.inline_requests = w.requests;
  return w;
}

// Puts every operand and result of `w` in one POSIX shared-memory object
// registered with the server (same host only): nothing but the request's
// description travels. Results of concurrent calls for the same pool entry
// land in the same bytes (a benchmark does not read them).
absl::Status MakeShared(client::MatmulClient& c, Workload& w) {
  uint64_t total = 0;
  auto aligned = [](uint64_t v) { return (v + 4095) / 4096 * 4096; };
  for (const v1::MultiplyRequest& r : w.requests) {
    total += aligned(r.a().data().size()) + aligned(r.b().data().size());
    total += aligned(w.bytes[&r - w.requests.data()] - r.a().data().size() - r.b().data().size());
  }
  const std::string key = absl::StrCat("/matmul-bench-", getpid(), "-", w.shape);
  shm_unlink(key.c_str());
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(total)) != 0) {
    return absl::InternalError(absl::StrCat("shm_open ", key, ": ", std::strerror(errno)));
  }
  auto* base = static_cast<uint8_t*>(mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  if (base == MAP_FAILED) return absl::InternalError("mmap of the benchmark's shared memory");
  grpc::ClientContext context;
  c.PrepareContext(&context);
  v1::RegisterSharedMemoryRequest reg;
  reg.set_name(key);
  reg.set_key(key);
  reg.set_byte_size(total);
  v1::RegisterSharedMemoryResponse unused;
  if (absl::Status st = client::FromGrpc(c.stub()->RegisterSharedMemory(&context, reg, &unused));
      !st.ok()) {
    return st;
  }
  shm_unlink(key.c_str());  // The server has it mapped; the name is no longer needed.
  uint64_t offset = 0;
  auto place = [&](v1::Matrix* m) {
    std::memcpy(base + offset, m->data().data(), m->data().size());
    v1::SharedMemoryRef* ref = m->mutable_shm();
    ref->set_region(key);
    ref->set_offset(offset);
    ref->set_bytes(m->data().size());
    offset += aligned(m->data().size());
    m->clear_data();
  };
  for (size_t i = 0; i < w.requests.size(); ++i) {
    v1::MultiplyRequest& r = w.requests[i];
    const uint64_t out = w.bytes[i] - r.a().data().size() - r.b().data().size();
    place(r.mutable_a());
    place(r.mutable_b());
    v1::SharedMemoryRef* ref = r.mutable_output_shm();
    ref->set_region(key);
    ref->set_offset(offset);
    ref->set_bytes(out);
    offset += aligned(out);
    w.echoes[i].clear_payload();
    w.echoes[i].set_response_bytes(0);
  }
  w.operands = "shm";
  return absl::OkStatus();
}

// Stores every distinct B of `w` on the server and names it by handle in
// the requests; bytes and echoes then count what still travels (A and the
// result).
absl::Status MakeResident(client::MatmulClient& c, Workload& w) {
  std::map<std::string, std::string> ids;  // B bytes -> handle id.
  for (size_t i = 0; i < w.requests.size(); ++i) {
    v1::MultiplyRequest& r = w.requests[i];
    auto found = ids.find(r.b().data());
    if (found == ids.end()) {
      absl::StatusOr<v1::MatrixHandle> h = c.PutMatrix(r.b());
      if (!h.ok()) return h.status();
      found = ids.emplace(r.b().data(), h->id()).first;
    }
    const uint64_t b_bytes = r.b().data().size();
    r.mutable_b()->Clear();
    r.mutable_b()->set_handle(found->second);
    w.bytes[i] -= b_bytes;
    w.echoes[i].mutable_payload()->assign(r.a().data());
  }
  w.operands = "resident";
  return absl::OkStatus();
}

// ---- Measurement -----------------------------------------------------------------

struct Result {
  std::string label, target, mode, shape, dtype;
  int concurrency = 0;
  double rate = 0;  // Open loop only.
  uint64_t requests = 0, errors = 0;
  double seconds = 0, rps = 0, gbps = 0, tflops = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0;  // ms
  // Medians of the server's own Timing (matmul target only; 0 for the
  // echo): arrival to batch start, the batch's engine time, arrival to
  // response ready; and the mean batch size.
  double queue_p50_us = 0, compute_p50_us = 0, server_p50_us = 0, mean_batch = 0;
  // Percentiles of each call's time outside the server's Timing (its
  // latency less Timing.total_us; the whole latency for the echo, whose
  // handler is a copy): the client, both gRPC stacks and the connection.
  // Set beside the echo's p50, it tells the transport's overhead apart from
  // the server's queue and engine time, which the echo does not have.
  double transport_p50 = 0, transport_p99 = 0;  // ms
  std::string first_error;
};

// The server's Timing of a response, or null (echo responses carry none).
template <typename Resp>
const v1::Timing* TimingOf(const Resp& response) {
  if constexpr (std::is_same_v<Resp, v1::MultiplyResponse>) {
    return response.has_timing() ? &response.timing() : nullptr;
  } else {
    return nullptr;
  }
}

// Shared by the callers of one row.
class Recorder {
 public:
  Recorder(absl::Time start, absl::Time end) : start_(start), end_(end) {}
  bool Running() const { return absl::Now() < end_; }
  // `timing` (the server's, or null) is read only where `s` is OK.
  void Record(absl::Time sent, absl::Time done, double flops, uint64_t bytes, const grpc::Status& s,
              const v1::Timing* timing = nullptr) {
    if (sent < start_ || done > end_) return;  // Warm-up or cool-down.
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      ++errors_;
      if (first_error_.empty()) first_error_ = absl::StrCat(s.error_code(), ": ", s.error_message());
      return;
    }
    const double latency_ms = absl::ToDoubleMilliseconds(done - sent);
    latencies_.push_back(latency_ms);
    transport_ms_.push_back(timing == nullptr ? latency_ms : latency_ms - timing->total_us() / 1e3);
    flops_ += flops;
    bytes_ += bytes;
    if (timing != nullptr) {
      queue_us_.push_back(static_cast<double>(timing->queue_us()));
      compute_us_.push_back(static_cast<double>(timing->compute_us()));
      server_us_.push_back(static_cast<double>(timing->total_us()));
      batch_sum_ += timing->batch_size();
    }
  }
  void Fill(Result* r) {
    absl::MutexLock lock(&mu_);
    std::sort(latencies_.begin(), latencies_.end());
    auto pct = [&](double q) { return Percentile(latencies_, q); };
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
    r->queue_p50_us = Median(queue_us_);
    r->compute_p50_us = Median(compute_us_);
    r->server_p50_us = Median(server_us_);
    r->mean_batch = server_us_.empty() ? 0 : batch_sum_ / server_us_.size();
    std::sort(transport_ms_.begin(), transport_ms_.end());
    r->transport_p50 = Percentile(transport_ms_, 0.5);
    r->transport_p99 = Percentile(transport_ms_, 0.99);
  }

 private:
  // The q-quantile of sorted `v`, as the latency percentiles take it.
  static double Percentile(const std::vector<double>& v, double q) {
    if (v.empty()) return 0.0;
    return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
  }
  static double Median(std::vector<double>& v) {
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }

  const absl::Time start_, end_;
  absl::Mutex mu_;
  std::vector<double> latencies_ ABSL_GUARDED_BY(mu_);
  // The server's Timing fields of each answer, and the sum of batch sizes.
  std::vector<double> queue_us_ ABSL_GUARDED_BY(mu_);
  std::vector<double> compute_us_ ABSL_GUARDED_BY(mu_);
  std::vector<double> server_us_ ABSL_GUARDED_BY(mu_);
  // Each call's latency less the server's Timing.total_us, ms.
  std::vector<double> transport_ms_ ABSL_GUARDED_BY(mu_);
  double batch_sum_ ABSL_GUARDED_BY(mu_) = 0;
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
      recorder_->Record(sent_, absl::Now(), w_->flops[index_], w_->bytes[index_], s,
                        TimingOf(response_));
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
    recorder_->Record(sent_, absl::Now(), w_->flops[index_], w_->bytes[index_], s,
                      TimingOf(response_));
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
    for (const auto& [name, value] : ExtraGrpcArgs()) {
      int number;
      if (absl::SimpleAtoi(value, &number)) {
        args.SetInt(name, number);
      } else {
        args.SetString(name, value);
      }
    }
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
                                      w.bytes[call->index], s, TimingOf(call->response));
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
  std::printf(
      "%-13s %-6s %-6s %-8s %-8s %6d %7.0f %9.1f %8.3f %9.3f %8.3f %8.3f %8.3f %8.3f %7.0f %7.0f "
      "%7.0f %6.1f %8.3f %s\n",
      r.label.c_str(), r.target.c_str(), r.mode.c_str(), r.shape.c_str(), r.dtype.c_str(),
      r.concurrency, r.rate, r.rps, r.gbps, r.tflops, r.p50, r.p90, r.p99, r.p999, r.queue_p50_us,
      r.compute_p50_us, r.server_p50_us, r.mean_batch, r.transport_p50,
      r.errors ? absl::StrCat(r.errors, " errors: ", r.first_error).c_str() : "");
  std::fflush(stdout);
  const std::string path = absl::GetFlag(FLAGS_json);
  if (path.empty()) return;
  std::ofstream(path, std::ios::app) << absl::StrFormat(
      "{\"label\": \"%s\", \"target\": \"%s\", \"mode\": \"%s\", \"shape\": \"%s\", \"dtype\": "
      "\"%s\", \"concurrency\": %d, \"rate\": %.1f, \"requests\": %d, \"errors\": %d, \"rps\": "
      "%.2f, \"gbps\": %.4f, \"tflops\": %.4f, \"p50_ms\": %.4f, \"p90_ms\": %.4f, \"p99_ms\": "
      "%.4f, \"p999_ms\": %.4f, \"server_queue_p50_us\": %.0f, \"server_compute_p50_us\": %.0f, "
      "\"server_total_p50_us\": %.0f, \"mean_batch\": %.2f, \"transport_p50_ms\": %.4f, "
      "\"transport_p99_ms\": %.4f}\n",
      r.label, r.target, r.mode, r.shape, r.dtype, r.concurrency, r.rate, r.requests, r.errors,
      r.rps, r.gbps, r.tflops, r.p50, r.p90, r.p99, r.p999, r.queue_p50_us, r.compute_p50_us,
      r.server_p50_us, r.mean_batch, r.transport_p50, r.transport_p99);
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
  std::printf(
      "# %s %s engine=%s devices=%d max_batch_size=%u max_queue_delay_us=%llu "
      "max_queue_gap_us=%llu dispatch_when_idle=%s dispatch_below_running=%u "
      "lanes_per_device=%u lane_spin_us=%llu\n",
      options.target.c_str(), info->version().c_str(), info->engine().c_str(),
      info->devices_size(), info->batching().max_batch_size(),
      static_cast<unsigned long long>(info->batching().max_queue_delay_us()),
      static_cast<unsigned long long>(info->batching().max_queue_gap_us()),
      info->batching().dispatch_when_idle() ? "true" : "false",
      info->batching().dispatch_below_running(), info->batching().lanes_per_device(),
      static_cast<unsigned long long>(info->batching().lane_spin_us()));
  std::printf("%-13s %-6s %-6s %-8s %-8s %6s %7s %9s %8s %9s %8s %8s %8s %8s %7s %7s %7s %6s %8s\n",
              "label", "target", "mode", "shape", "dtype", "conc", "rate", "req/s", "GB/s",
              "TFLOP/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "srv q", "srv c", "srv us",
              "batch", "wire p50");
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
      for (const std::string& operands : List(absl::GetFlag(FLAGS_operands))) {
      Workload w = MakeWorkload(shape, *dtype, rng);
      if (operands == "resident") {
        if (absl::Status s = MakeResident(**c, w); !s.ok()) {
          std::fprintf(stderr, "matmul-bench: storing B: %s\n", s.ToString().c_str());
          return 1;
        }
      } else if (operands == "shm") {
        if (absl::Status s = MakeShared(**c, w); !s.ok()) {
          std::fprintf(stderr, "matmul-bench: shared memory: %s\n", s.ToString().c_str());
          return 1;
        }
      } else if (operands != "inline") {
        std::fprintf(stderr, "matmul-bench: --operands takes inline, resident or shm\n");
        return 2;
      }
      if (absl::GetFlag(FLAGS_verify) && w.operands != "shm") {
        auto response = (*c)->Multiply(w.requests.front());
        absl::StatusOr<double> err =
            response.ok() ? client::CheckResponse(w.inline_requests.front(), *response)
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
        r.shape = w.operands == "resident" ? absl::StrCat(shape, "/res")
                  : w.operands == "shm"      ? absl::StrCat(shape, "/shm")
                                             : shape;
        r.dtype = std::string(DTypeName(*dtype));
        Print(r);
      };
      if (open) {
        for (const std::string& rate_text : List(absl::GetFlag(FLAGS_rates))) {
          double rate;
          if (!absl::SimpleAtod(rate_text, &rate) || !(rate > 0)) {
            std::fprintf(stderr, "matmul-bench: --rates takes rates above 0, got %s\n",
                         rate_text.c_str());
            return 2;
          }
          finish(RunOpen(**c, w, rate), "matmul", "open");
        }
        continue;
      }
      for (const std::string& mode : List(absl::GetFlag(FLAGS_modes))) {
        if (mode != "unary" && mode != "stream") {
          std::fprintf(stderr, "matmul-bench: --modes takes unary and stream, got %s\n",
                       mode.c_str());
          return 2;
        }
        const bool stream = mode == "stream";
        for (const std::string& conc_text : List(absl::GetFlag(FLAGS_concurrency))) {
          int conc;
          if (!absl::SimpleAtoi(conc_text, &conc) || conc < 1) {
            std::fprintf(stderr, "matmul-bench: --concurrency takes counts of at least 1, got %s\n",
                         conc_text.c_str());
            return 2;
          }
          finish(RunClosed(mm_calls, w.requests, w, stream, conc), "matmul", mode);
          if (!echo_calls.empty()) {
            finish(RunClosed(echo_calls, w.echoes, w, stream, conc), "echo", mode);
          }
        }
      }
      }
    }
  }
  return 0;
}

// A chain of products D_{i+1} = D_i * B_i (N x N), twice: every operand and
// result over the wire, then with every matrix kept on the server
// (store_result) and only the final result downloaded.
int Chain() {
  std::mt19937_64 rng(std::random_device{}());
  absl::Status security = client::ApplySecurityFlags(
      absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
      absl::GetFlag(FLAGS_tls_server_name), absl::GetFlag(FLAGS_token_file), &g_security);
  if (!security.ok()) {
    std::fprintf(stderr, "matmul-bench: %s\n", std::string(security.message()).c_str());
    return 2;
  }
  client::ClientOptions options = g_security;
  options.target = absl::GetFlag(FLAGS_target);
  options.max_message_bytes = INT32_MAX;
  auto c = client::MatmulClient::Create(options);
  if (!c.ok()) {
    std::fprintf(stderr, "matmul-bench: %s\n", std::string(c.status().message()).c_str());
    return 2;
  }
  const int length = absl::GetFlag(FLAGS_chain_length);
  if (length < 1) {
    std::fprintf(stderr, "matmul-bench chain: --chain_length must be at least 1, got %d\n", length);
    return 2;
  }
  std::printf("%-8s %-8s %6s %-9s %9s %9s %9s %10s\n", "shape", "dtype", "length", "operands",
              "seconds", "TFLOP/s", "GB wire", "rel.err");
  for (const std::string& shape : List(absl::GetFlag(FLAGS_shapes))) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(shape, &n) || n <= 0) {
      std::fprintf(stderr, "matmul-bench chain: --shapes takes sizes N, got %s\n", shape.c_str());
      return 2;
    }
    for (const std::string& dtype_name : List(absl::GetFlag(FLAGS_dtypes))) {
      const std::optional<DType> dtype = client::ParseDType(dtype_name);
      if (!dtype.has_value()) {
        std::fprintf(stderr, "matmul-bench: bad dtype %s\n", dtype_name.c_str());
        return 2;
      }
      // Entries ~ U(-1,1)/sqrt(n) keep the chain's values of order one.
      std::vector<v1::Matrix> b;
      v1::Matrix a;
      for (int i = 0; i <= length; ++i) {
        ProblemSpec spec{.m = n, .n = n, .k = n, .dtype = *dtype, .alpha = 1.0};
        v1::MultiplyRequest r = client::RandomRequest(spec, rng);
        if (i == 0) a = r.a();
        if (i < length) b.push_back(r.b());
      }
      const double scale = 1.0 / std::sqrt(static_cast<double>(n));
      const double flops = 2.0 * n * n * n * length;
      // Inline: each step ships D_i and B_i and gets D_{i+1} back.
      v1::Matrix d = a;
      double wire = 0;
      absl::Time start = absl::Now();
      for (int i = 0; i < length; ++i) {
        v1::MultiplyRequest r;
        *r.mutable_a() = d;
        *r.mutable_b() = b[i];
        r.set_alpha(scale);
        absl::StatusOr<v1::MultiplyResponse> resp = (*c)->Multiply(r);
        if (!resp.ok()) {
          std::fprintf(stderr, "matmul-bench chain: %s\n", resp.status().ToString().c_str());
          return 1;
        }
        wire += r.a().data().size() + r.b().data().size() + resp->c().data().size();
        d = resp->c();
      }
      const double inline_s = absl::ToDoubleSeconds(absl::Now() - start);
      const v1::Matrix inline_result = d;
      std::printf("%-8s %-8s %6d %-9s %9.3f %9.3f %9.3f %10s\n", shape.c_str(), dtype_name.c_str(),
                  length, "inline", inline_s, flops / inline_s / 1e12, wire / 1e9, "-");
      // Resident: upload once (timed), chain by handle, download the end.
      start = absl::Now();
      wire = a.data().size();
      absl::StatusOr<v1::MatrixHandle> current = (*c)->PutMatrix(a);
      std::vector<std::string> b_ids;
      if (current.ok()) b_ids.push_back(current->id());  // Deleted with the B's.
      for (const v1::Matrix& m : b) {
        absl::StatusOr<v1::MatrixHandle> h = (*c)->PutMatrix(m);
        if (!h.ok() || !current.ok()) {
          std::fprintf(stderr, "matmul-bench chain: PutMatrix failed\n");
          return 1;
        }
        b_ids.push_back(h->id());
        wire += m.data().size();
      }
      const absl::Time uploaded = absl::Now();
      std::vector<std::string> temporaries;
      for (int i = 0; i < length; ++i) {
        v1::MultiplyRequest r;
        r.mutable_a()->set_handle(current->id());
        r.mutable_b()->set_handle(b_ids[i + 1]);
        r.set_alpha(scale);
        r.set_store_result(true);
        absl::StatusOr<v1::MultiplyResponse> resp = (*c)->Multiply(r);
        if (!resp.ok()) {
          std::fprintf(stderr, "matmul-bench chain: %s\n", resp.status().ToString().c_str());
          return 1;
        }
        temporaries.push_back(resp->result_handle().id());
        *current = resp->result_handle();
      }
      absl::StatusOr<v1::Matrix> result = (*c)->GetMatrix(current->id());
      const double resident_s = absl::ToDoubleSeconds(absl::Now() - start);
      const double chain_s = absl::ToDoubleSeconds(absl::Now() - uploaded);
      if (!result.ok()) return 1;
      wire += result->data().size();
      // The two chains ran the same products on the same engine.
      const std::vector<double> x = ToDouble(inline_result.data().data(), *dtype, n * n);
      const std::vector<double> y = ToDouble(result->data().data(), *dtype, n * n);
      double num = 0, den = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        num += (x[i] - y[i]) * (x[i] - y[i]);
        den += x[i] * x[i];
      }
      std::printf("%-8s %-8s %6d %-9s %9.3f %9.3f %9.3f %10.2e\n", shape.c_str(), dtype_name.c_str(),
                  length, "resident", resident_s, flops / resident_s / 1e12, wire / 1e9,
                  std::sqrt(num / std::max(den, 1e-300)));
      std::printf("%-8s %-8s %6d %-9s %9.3f %9.3f %9s %10s\n", shape.c_str(), dtype_name.c_str(),
                  length, "(chain)", chain_s, flops / chain_s / 1e12, "-", "-");
      const std::string path = absl::GetFlag(FLAGS_json);
      if (!path.empty()) {
        std::ofstream(path, std::ios::app) << absl::StrFormat(
            "{\"bench\": \"chain\", \"n\": %d, \"dtype\": \"%s\", \"length\": %d, "
            "\"inline_s\": %.4f, \"resident_s\": %.4f, \"resident_chain_s\": %.4f}\n",
            n, dtype_name, length, inline_s, resident_s, chain_s);
      }
      for (const std::string& id : temporaries) (void)(*c)->DeleteMatrix(id);
      for (const std::string& id : b_ids) (void)(*c)->DeleteMatrix(id);
    }
  }
  return 0;
}

}  // namespace
}  // namespace matmul::bench

int main(int argc, char** argv) {
  // --help lists the flags of this file (absl's default looks for a file
  // named after the program, and none is). absl hands the filter each
  // flag's file without its leading slashes.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    absl::string_view self = __FILE__;
    self.remove_prefix(std::min(self.find_first_not_of('/'), self.size()));
    return file == self;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "matmul-bench <serve-echo|run|open|chain> [flags]: load generator for matmul-server "
      "(closed-loop sweep, open-loop Poisson) with a gRPC echo baseline.");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::GetFlag(FLAGS_mutex_deadlock_detection)
                                          ? absl::OnDeadlockCycle::kAbort
                                          : absl::OnDeadlockCycle::kIgnore);
  if (args.size() != 2) {
    std::fprintf(stderr, "matmul-bench: expected one command: serve-echo, run, open or chain\n");
    return 2;
  }
  const std::string command = args[1];
  if (command == "serve-echo") return matmul::bench::ServeEcho();
  if (command == "run") return matmul::bench::Run(false);
  if (command == "open") return matmul::bench::Run(true);
  if (command == "chain") return matmul::bench::Chain();
  std::fprintf(stderr, "matmul-bench: unknown command %s\n", command.c_str());
  return 2;
}
