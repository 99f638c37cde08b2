#include "server/matmul_service.h"

#include <deque>
#include <optional>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace matmul::server {
namespace {

using v1::MultiplyRequest;
using v1::MultiplyResponse;

constexpr absl::string_view kMultiply = "Multiply";
constexpr absl::string_view kMultiplyStream = "MultiplyStream";

absl::Status ShuttingDown() {
  return absl::UnavailableError("server is shutting down; retry on another replica");
}

void FillTiming(const JobOutcome& outcome, absl::Time arrival, v1::Timing* timing) {
  timing->set_queue_us(absl::ToInt64Microseconds(outcome.queue_time));
  timing->set_compute_us(absl::ToInt64Microseconds(outcome.compute_time));
  timing->set_total_us(absl::ToInt64Microseconds(absl::Now() - arrival));
  timing->set_batch_size(outcome.batch_size);
  timing->set_device(outcome.device);
}

RejectReason ReasonFor(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted ? RejectReason::kTooLarge
                                                               : RejectReason::kInvalid;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

// One unary Multiply. Lives from the handler until OnDone.
class MatmulServiceImpl::UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(MatmulServiceImpl* service, grpc::CallbackServerContext* context,
            const MultiplyRequest* request, MultiplyResponse* response)
      : service_(service), response_(response), arrival_(absl::Now()) {
    service_->CallStarted();
    service_->metrics_->BytesReceived(request->ByteSizeLong());
    if (service_->draining_.load()) {
      End(ShuttingDown());
      return;
    }
    absl::StatusOr<std::string> client = service_->Identify(*context);
    if (!client.ok()) {
      service_->metrics_->Rejected(RejectReason::kUnauthenticated);
      End(client.status());
      return;
    }
    if (absl::Status admitted = service_->Admit(*client); !admitted.ok()) {
      End(admitted);
      return;
    }
    client_ = *std::move(client);
    service_->metrics_->AddInflight(1);
    const absl::Status status = service_->Submit(
        *request, response, arrival_, service_->DeadlineFor(*context, arrival_), &job_id_,
        [this](const JobOutcome& outcome) {
          if (outcome.status.ok()) FillTiming(outcome, arrival_, response_->mutable_timing());
          service_->metrics_->AddInflight(-1);
          service_->Release(client_);
          End(outcome.status);
        });
    if (!status.ok()) {
      service_->metrics_->AddInflight(-1);
      service_->Release(client_);
      End(status);
    }
  }

  void OnCancel() override { service_->scheduler_->Cancel(job_id_); }
  void OnDone() override {
    MatmulServiceImpl* service = service_;
    delete this;
    service->CallEnded();
  }

 private:
  void End(const absl::Status& status) {
    if (status.ok()) {
      service_->metrics_->BytesSent(response_->ByteSizeLong());
    } else {
      response_->Clear();
    }
    service_->Record(kMultiply, status, arrival_);
    Finish(ToGrpcStatus(status));
  }

  MatmulServiceImpl* const service_;
  // Owned by gRPC; valid until OnDone.
  MultiplyResponse* const response_;
  const absl::Time arrival_;
  // Set before the job is submitted; 0 when none was.
  uint64_t job_id_ = 0;
  // Who sent it (for per-client limits).
  std::string client_;
};

// One MultiplyStream. Reads items one at a time (at most
// max_stream_inflight outstanding), answers each exactly once in completion
// order, and finishes once the client has half-closed (or the server
// drains) and every answer is written.
class MatmulServiceImpl::StreamCall final
    : public grpc::ServerBidiReactor<MultiplyRequest, MultiplyResponse> {
 public:
  StreamCall(MatmulServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    service_->CallStarted();
    // Finish is never called with mu_ held: once it is called, OnDone may
    // run on another thread and delete this reactor, mutex and all.
    if (service_->draining_.load()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      service_->Record(kMultiplyStream, ShuttingDown(), absl::Now());
      Finish(ToGrpcStatus(ShuttingDown()));
      return;
    }
    absl::StatusOr<std::string> client = service_->Identify(*context);
    if (!client.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      service_->metrics_->Rejected(RejectReason::kUnauthenticated);
      service_->Record(kMultiplyStream, client.status(), absl::Now());
      Finish(ToGrpcStatus(client.status()));
      return;
    }
    client_ = *std::move(client);
    {
      absl::MutexLock lock(&service_->streams_mu_);
      service_->streams_.insert(this);
      registered_ = true;
    }
    absl::MutexLock lock(&mu_);
    StartNextReadLocked();
  }

  void OnReadDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      finish = ReadDoneLocked(ok);
    }
    if (finish.has_value()) Finish(*finish);
  }

  // OnReadDone's work; returns the status to finish with, if it is time.
  std::optional<grpc::Status> ReadDoneLocked(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    reading_ = false;
    if (!ok) {
      reads_done_ = true;
      reading_item_.reset();
      return MaybeFinishLocked();
    }
    std::unique_ptr<Item> item = std::move(reading_item_);
    item->arrival = absl::Now();
    service_->metrics_->BytesReceived(item->request.ByteSizeLong());
    item->response.set_request_id(item->request.request_id());
    absl::Status status =
        draining_ || finished_ ? ShuttingDown() : service_->Admit(client_);
    if (status.ok()) {
      Item* raw = item.get();
      service_->metrics_->AddInflight(1);
      status = service_->Submit(
          raw->request, &raw->response, raw->arrival,
          service_->DeadlineFor(*context_, raw->arrival), &raw->job_id,
          [this, raw](const JobOutcome& outcome) { OnJobDone(raw, outcome); });
      if (status.ok()) {
        running_.emplace(raw->job_id, std::move(item));
      } else {
        service_->metrics_->AddInflight(-1);
        service_->Release(client_);
      }
    }
    if (!status.ok()) QueueAnswerLocked(std::move(item), status);
    StartNextReadLocked();
    return std::nullopt;
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        // The client is gone: nothing more can be delivered.
        broken_ = true;
        writes_.clear();
      } else {
        writes_.pop_front();
      }
      StartNextWriteLocked();
      finish = MaybeFinishLocked();
    }
    if (finish.has_value()) Finish(*finish);
  }

  void OnCancel() override {
    std::vector<uint64_t> ids;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      for (const auto& [id, item] : running_) ids.push_back(id);
    }
    // Outside the lock: a cancelled queued job ends in this call, and may
    // finish the stream, so only locals are used from here on.
    DynamicBatchScheduler* scheduler = service_->scheduler_;
    for (uint64_t id : ids) scheduler->Cancel(id);
  }

  void OnDone() override {
    MatmulServiceImpl* service = service_;
    if (registered_) {
      absl::MutexLock lock(&service->streams_mu_);
      service->streams_.erase(this);
    }
    delete this;
    service->CallEnded();
  }

  // The server drains: stop taking items; finish once the accepted ones are
  // answered.
  void Drain() {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      draining_ = true;
      finish = MaybeFinishLocked();
    }
    if (finish.has_value()) Finish(*finish);
  }

 private:
  struct Item {
    MultiplyRequest request;
    MultiplyResponse response;
    absl::Time arrival;
    uint64_t job_id = 0;
  };

  void OnJobDone(Item* raw, const JobOutcome& outcome) {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      service_->metrics_->AddInflight(-1);
      service_->Release(client_);
      auto it = running_.find(raw->job_id);
      std::unique_ptr<Item> item = std::move(it->second);
      running_.erase(it);
      if (outcome.status.ok()) FillTiming(outcome, item->arrival, item->response.mutable_timing());
      QueueAnswerLocked(std::move(item), outcome.status);
      StartNextReadLocked();
      finish = MaybeFinishLocked();
    }
    if (finish.has_value()) Finish(*finish);
  }

  // Records the item's end and queues its response (with `error` set when
  // `status` is not OK).
  void QueueAnswerLocked(std::unique_ptr<Item> item, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    service_->Record(kMultiplyStream, status, item->arrival);
    if (!status.ok()) {
      std::string id = std::move(*item->response.mutable_request_id());
      item->response.Clear();
      item->response.set_request_id(std::move(id));
      item->response.mutable_error()->set_code(static_cast<int>(status.code()));
      item->response.mutable_error()->set_message(std::string(status.message()));
    }
    if (broken_ || finished_) return;
    service_->metrics_->BytesSent(item->response.ByteSizeLong());
    writes_.push_back(std::move(item));
    StartNextWriteLocked();
  }

  void StartNextReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || reads_done_ || finished_ || draining_ || cancelled_) return;
    if (static_cast<int>(running_.size()) >= service_->options_.max_stream_inflight) return;
    reading_item_ = std::make_unique<Item>();
    reading_ = true;
    StartRead(&reading_item_->request);
  }

  void StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || writes_.empty() || broken_ || finished_) return;
    writing_ = true;
    StartWrite(&writes_.front()->response);
  }

  // When everything accepted is answered and written and no more items
  // will come, marks the stream finished and returns the status to call
  // Finish with (after releasing mu_).
  std::optional<grpc::Status> MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !running_.empty() || writing_ || (!writes_.empty() && !broken_)) {
      return std::nullopt;
    }
    if (!reads_done_ && !draining_ && !cancelled_) return std::nullopt;
    finished_ = true;
    if (cancelled_) return grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled");
    if (reads_done_) return grpc::Status::OK;
    return ToGrpcStatus(absl::UnavailableError(
        "server is shutting down; items sent after this point were not received"));
  }

  MatmulServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  // Whether this stream is in service_->streams_.
  bool registered_ = false;
  // Who opened it (for per-client limits).
  std::string client_;

  absl::Mutex mu_;
  // The item being read into, while reading_.
  std::unique_ptr<Item> reading_item_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  // The client half-closed (or the stream broke).
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  // Items submitted and not yet ended, by job id.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Item>> running_ ABSL_GUARDED_BY(mu_);
  // Answers waiting to be written; the front one is being written when
  // writing_.
  std::deque<std::unique_ptr<Item>> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // A write failed: the client can't be reached any more.
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

MatmulServiceImpl::MatmulServiceImpl(const Options& options, DynamicBatchScheduler* scheduler,
                                     Metrics* metrics, std::function<v1::ServerInfo()> info)
    : options_(options), scheduler_(scheduler), metrics_(metrics), info_(std::move(info)) {}

grpc::ServerUnaryReactor* MatmulServiceImpl::Multiply(grpc::CallbackServerContext* context,
                                                      const MultiplyRequest* request,
                                                      MultiplyResponse* response) {
  return new UnaryCall(this, context, request, response);
}

grpc::ServerBidiReactor<MultiplyRequest, MultiplyResponse>* MatmulServiceImpl::MultiplyStream(
    grpc::CallbackServerContext* context) {
  return new StreamCall(this, context);
}

grpc::ServerUnaryReactor* MatmulServiceImpl::GetServerInfo(grpc::CallbackServerContext* context,
                                                           const v1::GetServerInfoRequest*,
                                                           v1::ServerInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> client = Identify(*context);
  if (!client.ok()) {
    metrics_->Rejected(RejectReason::kUnauthenticated);
    reactor->Finish(ToGrpcStatus(client.status()));
    return reactor;
  }
  *response = info_();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::StatusOr<std::string> MatmulServiceImpl::Identify(
    const grpc::CallbackServerContext& context) const {
  if (options_.auth != nullptr) return options_.auth->Authenticate(context.client_metadata());
  // Without authentication a client is its peer address, less the port.
  std::string peer = context.peer();
  const size_t colon = peer.rfind(':');
  if (colon != std::string::npos && colon > 0) peer.resize(colon);
  return peer;
}

absl::Status MatmulServiceImpl::Admit(const std::string& client) {
  if (options_.max_inflight_per_client <= 0) return absl::OkStatus();
  absl::MutexLock lock(&clients_mu_);
  int& count = inflight_by_client_[client];
  if (count >= options_.max_inflight_per_client) {
    metrics_->Rejected(RejectReason::kClientLimit);
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client already has ", count, " requests in flight (max_inflight_per_client ",
        options_.max_inflight_per_client, "); wait for answers before sending more"));
  }
  ++count;
  return absl::OkStatus();
}

void MatmulServiceImpl::Release(const std::string& client) {
  if (options_.max_inflight_per_client <= 0) return;
  absl::MutexLock lock(&clients_mu_);
  auto it = inflight_by_client_.find(client);
  if (it == inflight_by_client_.end()) return;
  if (--it->second <= 0) inflight_by_client_.erase(it);
}

void MatmulServiceImpl::StartDraining() {
  draining_.store(true);
  absl::MutexLock lock(&streams_mu_);
  for (StreamCall* stream : streams_) stream->Drain();
}

void MatmulServiceImpl::CallStarted() {
  absl::MutexLock lock(&calls_mu_);
  ++live_calls_;
}

void MatmulServiceImpl::CallEnded() {
  absl::MutexLock lock(&calls_mu_);
  --live_calls_;
}

bool MatmulServiceImpl::WaitForCalls(absl::Time deadline) {
  absl::MutexLock lock(&calls_mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) { return live_calls_ == 0; };
  return calls_mu_.AwaitWithDeadline(absl::Condition(&none), deadline);
}

absl::Time MatmulServiceImpl::DeadlineFor(const grpc::CallbackServerContext& context,
                                          absl::Time arrival) const {
  absl::Time deadline = absl::InfiniteFuture();
  const auto client = context.deadline();
  if (client != std::chrono::system_clock::time_point::max()) {
    deadline = absl::FromChrono(client);
  }
  if (options_.default_timeout > absl::ZeroDuration()) {
    deadline = std::min(deadline, arrival + options_.default_timeout);
  }
  return deadline;
}

absl::Status MatmulServiceImpl::Submit(const MultiplyRequest& request, MultiplyResponse* response,
                                       absl::Time arrival, absl::Time deadline, uint64_t* job_id,
                                       absl::AnyInvocable<void(const JobOutcome&)> done) {
  absl::StatusOr<ValidatedRequest> validated = ValidateMultiplyRequest(request, options_.limits);
  if (!validated.ok()) {
    metrics_->Rejected(ReasonFor(validated.status()));
    return validated.status();
  }
  response->set_request_id(request.request_id());
  v1::Matrix* c = response->mutable_c();
  c->set_rows(static_cast<uint64_t>(validated->problem.m));
  c->set_cols(static_cast<uint64_t>(validated->problem.n));
  c->set_dtype(ToProto(validated->problem.output_type));

  auto job = std::make_unique<Job>();
  job->id = scheduler_->NewJobId();
  *job_id = job->id;
  job->problem = validated->problem;
  job->output = c->mutable_data();
  job->output_bytes = validated->output_bytes;
  job->priority = request.priority();
  job->arrival = arrival;
  job->deadline = deadline;
  job->on_done = std::move(done);
  return scheduler_->Submit(std::move(job));
}

void MatmulServiceImpl::Record(absl::string_view method, const absl::Status& status,
                               absl::Time arrival) {
  metrics_->RequestFinished(method, static_cast<int>(status.code()),
                            absl::ToDoubleSeconds(absl::Now() - arrival));
}

}  // namespace matmul::server
