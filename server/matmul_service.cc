#include "server/matmul_service.h"

#include <deque>
#include <optional>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/wire_codec.h"

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
            const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : service_(service), wire_response_(response), arrival_(absl::Now()) {
    service_->CallStarted();
    service_->metrics_->BytesReceived(request->Length());
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
    if (absl::Status parsed = ParseMultiplyRequest(*request, service_->options_.host_buffers,
                                                   &request_, &operands_);
        !parsed.ok()) {
      service_->metrics_->Rejected(parsed.code() == absl::StatusCode::kCancelled
                                       ? RejectReason::kCancelled
                                       : ReasonFor(parsed));
      End(parsed);
      return;
    }
    if (absl::Status admitted = service_->Admit(*client); !admitted.ok()) {
      End(admitted);
      return;
    }
    client_ = *std::move(client);
    service_->metrics_->AddInflight(1);
    const absl::Status status = service_->Submit(
        client_, request_, operands_, &response_, &result_, arrival_,
        service_->DeadlineFor(*context, arrival_), &job_id_, [this](const JobOutcome& outcome) {
          if (outcome.status.ok()) FillTiming(outcome, arrival_, response_.mutable_timing());
          // The engine is done with them: back to the pool now, not when
          // gRPC is done with the call.
          operands_ = InlineOperands();
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

  // gRPC 1.51 runs a unary reactor's OnDone (and OnCancel) on its executor
  // unless the reactor says its reactions are inlineable: one more thread
  // woken per call (a profile on the GPU host put the executor thread at 40
  // of the server's ~169 us of CPU per small request, docs/BENCHMARKS.md).
  // Inline, OnDone runs on the completion thread that saw Finish complete,
  // and OnCancel where gRPC learns of the cancellation. Both reactions
  // here are short and never block (a delete and a counter; a queue removal
  // whose answer goes out through Finish), and neither is reached with a
  // lock held: the scheduler calls a job's callback outside its locks.
  // Measured on the development machine (docs/BENCHMARKS.md, "OnDone
  // inline"): 13% fewer context switches and 5% less CPU per tiny request.
  // gRPC's comment marks the hook "not API"; server_test's cancellation and
  // deadline cases and their ASan run cover the inline path.
  bool InternalInlineable() override { return true; }
  void OnCancel() override { service_->scheduler_->Cancel(job_id_); }
  void OnDone() override {
    MatmulServiceImpl* service = service_;
    delete this;
    service->CallEnded();
  }

 private:
  void End(const absl::Status& status) {
    if (status.ok()) {
      *wire_response_ = EncodeMultiplyResponse(std::move(response_), &result_);
      service_->metrics_->BytesSent(wire_response_->Length());
    }
    service_->Record(kMultiply, status, arrival_);
    Finish(ToGrpcStatus(status));
  }

  MatmulServiceImpl* const service_;
  // Owned by gRPC; valid until OnDone. Written once, when the call ends.
  grpc::ByteBuffer* const wire_response_;
  // The parsed request and the payloads moved out of it; the job points
  // into both.
  MultiplyRequest request_;
  InlineOperands operands_;
  // The response but for the result's bytes.
  MultiplyResponse response_;
  // The result's bytes, written by the engine.
  ResultBuffer result_;
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
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
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
    service_->metrics_->BytesReceived(item->wire_request.Length());
    absl::Status status = ParseMultiplyRequest(
        item->wire_request, service_->options_.host_buffers, &item->request, &item->operands);
    item->wire_request.Clear();
    if (!status.ok()) {
      service_->metrics_->Rejected(ReasonFor(status));
    } else {
      item->response.set_request_id(item->request.request_id());
      status = draining_ || finished_ ? ShuttingDown() : service_->Admit(client_);
    }
    if (status.ok()) {
      Item* raw = item.get();
      service_->metrics_->AddInflight(1);
      status = service_->Submit(
          client_, raw->request, raw->operands, &raw->response, &raw->result, raw->arrival,
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
    // As read; parsed into `request` and `operands`, then cleared.
    grpc::ByteBuffer wire_request;
    MultiplyRequest request;
    InlineOperands operands;
    // The answer but for the result's bytes, which the engine writes to
    // `result`; both become `wire_response` when the item ends.
    MultiplyResponse response;
    ResultBuffer result;
    grpc::ByteBuffer wire_response;
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
      item->operands = InlineOperands();  // The engine is done with them.
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
      item->result = ResultBuffer();
    }
    if (broken_ || finished_) return;
    item->wire_response = EncodeMultiplyResponse(std::move(item->response), &item->result);
    service_->metrics_->BytesSent(item->wire_response.Length());
    writes_.push_back(std::move(item));
    StartNextWriteLocked();
  }

  void StartNextReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || reads_done_ || finished_ || draining_ || cancelled_) return;
    if (static_cast<int>(running_.size()) >= service_->options_.max_stream_inflight) return;
    reading_item_ = std::make_unique<Item>();
    reading_ = true;
    StartRead(&reading_item_->wire_request);
  }

  void StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || writes_.empty() || broken_ || finished_) return;
    writing_ = true;
    StartWrite(&writes_.front()->wire_response);
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

// One UploadMatrix: the first chunk's shape reserves the bytes, the chunks
// are appended in order, and the half-close stores the matrix.
class MatmulServiceImpl::UploadCall final : public grpc::ServerReadReactor<v1::UploadMatrixChunk> {
 public:
  UploadCall(MatmulServiceImpl* service, grpc::CallbackServerContext* context,
             v1::MatrixHandle* response)
      : service_(service), response_(response), arrival_(absl::Now()) {
    service_->CallStarted();
    absl::StatusOr<std::string> client = service_->StoreCaller(*context);
    if (!client.ok()) {
      End(client.status());
      return;
    }
    client_ = *std::move(client);
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      End(Store());
      return;
    }
    service_->metrics_->BytesReceived(chunk_.ByteSizeLong());
    if (absl::Status s = Take(); !s.ok()) {
      End(s);
      return;
    }
    StartRead(&chunk_);
  }

  void OnDone() override {
    MatmulServiceImpl* service = service_;
    if (reserved_ > 0) service->options_.store->Release(client_, reserved_);
    delete this;
    service->CallEnded();
  }

 private:
  // Checks and appends one chunk.
  absl::Status Take() {
    if (!started_) {
      started_ = true;
      v1::Matrix shape;
      shape.set_rows(chunk_.rows());
      shape.set_cols(chunk_.cols());
      shape.set_dtype(chunk_.dtype());
      absl::StatusOr<uint64_t> bytes = CheckStoredShape(shape, service_->options_.limits);
      if (!bytes.ok()) return bytes.status();
      absl::StatusOr<absl::Duration> ttl =
          service_->options_.store->TtlFor(chunk_.ttl_seconds(), "ttl_seconds");
      if (!ttl.ok()) return ttl.status();
      ttl_ = *ttl;
      rows_ = static_cast<int64_t>(chunk_.rows());
      cols_ = static_cast<int64_t>(chunk_.cols());
      dtype_ = *FromProto(chunk_.dtype());
      // The budget counts what the engines would hold (rows padded), the
      // receive buffer the dense bytes.
      const uint64_t budget = service_->options_.store->BudgetBytes(rows_, cols_, dtype_);
      if (absl::Status s = service_->options_.store->Reserve(client_, budget); !s.ok()) return s;
      reserved_ = budget;
      expected_ = *bytes;
      try {
        data_.reserve(expected_);
      } catch (const std::bad_alloc&) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", expected_, " bytes to receive the matrix"));
      }
    } else if ((chunk_.rows() != 0 && chunk_.rows() != static_cast<uint64_t>(rows_)) ||
               (chunk_.cols() != 0 && chunk_.cols() != static_cast<uint64_t>(cols_))) {
      return absl::InvalidArgumentError(
          "rows, cols: a later chunk names another shape than the first");
    }
    if (data_.size() + chunk_.data().size() > expected_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data: more than the ", expected_, " bytes the shape declares (", data_.size(),
          " received, then a chunk of ", chunk_.data().size(), ")"));
    }
    data_.append(chunk_.data());
    return absl::OkStatus();
  }

  // The client half-closed: store what arrived.
  absl::Status Store() {
    if (!started_) return absl::InvalidArgumentError("rows: no chunk received; the first carries the shape");
    if (data_.size() != expected_) {
      return absl::InvalidArgumentError(absl::StrCat("data: expected ", expected_,
                                                     " bytes in all, received ", data_.size()));
    }
    absl::StatusOr<v1::MatrixHandle> handle =
        service_->options_.store->PutReserved(client_, rows_, cols_, dtype_, data_.data(), ttl_);
    reserved_ = 0;  // Now the matrix's, or released on failure.
    if (!handle.ok()) return handle.status();
    *response_ = *std::move(handle);
    return absl::OkStatus();
  }

  void End(const absl::Status& status) {
    data_.clear();
    data_.shrink_to_fit();
    service_->Record("UploadMatrix", status, arrival_);
    Finish(ToGrpcStatus(status));
  }

  MatmulServiceImpl* const service_;
  v1::MatrixHandle* const response_;
  const absl::Time arrival_;
  std::string client_;
  v1::UploadMatrixChunk chunk_;
  bool started_ = false;
  int64_t rows_ = 0, cols_ = 0;
  DType dtype_ = DType::kFloat32;
  absl::Duration ttl_;
  // Bytes held in the store's budget until the matrix is stored
  // (MatrixStore::BudgetBytes of the shape).
  uint64_t reserved_ = 0;
  // Dense bytes the shape declares: what the chunks must add up to.
  uint64_t expected_ = 0;
  std::string data_;
};

// One GetMatrix: the kept matrix is read into host memory once and written
// in chunks.
class MatmulServiceImpl::DownloadCall final : public grpc::ServerWriteReactor<v1::MatrixChunk> {
 public:
  DownloadCall(MatmulServiceImpl* service, grpc::CallbackServerContext* context,
               const v1::GetMatrixRequest* request)
      : service_(service), arrival_(absl::Now()) {
    service_->CallStarted();
    absl::Status status = Load(*context, *request);
    if (!status.ok()) {
      End(status);
      return;
    }
    NextWrite();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::CancelledError("the client stopped reading"));
      return;
    }
    if (offset_ >= data_.size()) {
      service_->metrics_->ResidentDownloaded(data_.size());
      End(absl::OkStatus());
      return;
    }
    NextWrite();
  }

  void OnDone() override {
    MatmulServiceImpl* service = service_;
    delete this;
    service->CallEnded();
  }

 private:
  absl::Status Load(const grpc::CallbackServerContext& context, const v1::GetMatrixRequest& request) {
    absl::StatusOr<std::string> client = service_->StoreCaller(context);
    if (!client.ok()) return client.status();
    absl::StatusOr<std::shared_ptr<StoredMatrix>> matrix =
        service_->options_.store->Find(*client, request.id());
    if (!matrix.ok()) return matrix.status();
    constexpr uint64_t kDefaultChunk = 1 << 20, kMaxChunk = 64 << 20;
    chunk_bytes_ = request.chunk_bytes() == 0 ? kDefaultChunk : std::min(request.chunk_bytes(), kMaxChunk);
    handle_ = (*matrix)->Handle();
    return service_->options_.store->Read(**matrix, &data_);
  }

  void NextWrite() {
    chunk_.Clear();
    if (offset_ == 0) *chunk_.mutable_handle() = handle_;
    const size_t n = std::min<size_t>(chunk_bytes_, data_.size() - offset_);
    chunk_.set_data(data_.substr(offset_, n));
    offset_ += n;
    service_->metrics_->BytesSent(chunk_.ByteSizeLong());
    StartWrite(&chunk_);
  }

  void End(const absl::Status& status) {
    service_->Record("GetMatrix", status, arrival_);
    Finish(ToGrpcStatus(status));
  }

  MatmulServiceImpl* const service_;
  const absl::Time arrival_;
  v1::MatrixHandle handle_;
  std::string data_;
  size_t offset_ = 0;
  uint64_t chunk_bytes_ = 0;
  v1::MatrixChunk chunk_;
};

MatmulServiceImpl::MatmulServiceImpl(const Options& options, DynamicBatchScheduler* scheduler,
                                     Metrics* metrics, std::function<v1::ServerInfo()> info)
    : options_(options), scheduler_(scheduler), metrics_(metrics), info_(std::move(info)) {}

grpc::ServerUnaryReactor* MatmulServiceImpl::Multiply(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return new UnaryCall(this, context, request, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MatmulServiceImpl::MultiplyStream(
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

absl::StatusOr<std::string> MatmulServiceImpl::FeatureCaller(
    const grpc::CallbackServerContext& context, bool enabled, absl::string_view off) {
  if (draining_.load()) return ShuttingDown();
  absl::StatusOr<std::string> client = Identify(context);
  if (!client.ok()) {
    metrics_->Rejected(RejectReason::kUnauthenticated);
    return client.status();
  }
  if (!enabled) return absl::FailedPreconditionError(off);
  return client;
}

absl::StatusOr<std::string> MatmulServiceImpl::StoreCaller(
    const grpc::CallbackServerContext& context) {
  return FeatureCaller(context, options_.store != nullptr,
                       "this server keeps no matrices (started with --resident_bytes=0)");
}

absl::StatusOr<std::string> MatmulServiceImpl::SharedMemoryCaller(
    const grpc::CallbackServerContext& context) {
  return FeatureCaller(context, options_.shared_memory != nullptr,
                       "shared memory is off on this server (start it with --shared_memory)");
}

grpc::ServerUnaryReactor* MatmulServiceImpl::FinishUnary(grpc::CallbackServerContext* context,
                                                         absl::string_view method,
                                                         const absl::Status& status,
                                                         absl::Time arrival) {
  Record(method, status, arrival);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* MatmulServiceImpl::PutMatrix(grpc::CallbackServerContext* context,
                                                       const v1::PutMatrixRequest* request,
                                                       v1::MatrixHandle* response) {
  const absl::Time arrival = absl::Now();
  metrics_->BytesReceived(request->ByteSizeLong());
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<std::string> client = StoreCaller(*context);
    if (!client.ok()) return client.status();
    if (!request->has_matrix()) return absl::InvalidArgumentError("matrix: required");
    const v1::Matrix& m = request->matrix();
    if (!m.handle().empty()) {
      return absl::InvalidArgumentError("matrix.handle: must be empty; PutMatrix takes data");
    }
    absl::StatusOr<uint64_t> bytes = CheckStoredShape(m, options_.limits);
    if (!bytes.ok()) return bytes.status();
    if (m.data().size() != *bytes) {
      return absl::InvalidArgumentError(absl::StrCat("matrix.data: expected ", *bytes,
                                                     " bytes, got ", m.data().size()));
    }
    absl::StatusOr<absl::Duration> ttl = options_.store->TtlFor(request->ttl_seconds(), "ttl_seconds");
    if (!ttl.ok()) return ttl.status();
    absl::StatusOr<v1::MatrixHandle> handle =
        options_.store->Put(*client, static_cast<int64_t>(m.rows()), static_cast<int64_t>(m.cols()),
                            *FromProto(m.dtype()), m.data().data(), *ttl);
    if (!handle.ok()) return handle.status();
    *response = *std::move(handle);
    return absl::OkStatus();
  }();
  return FinishUnary(context, "PutMatrix", status, arrival);
}

grpc::ServerReadReactor<v1::UploadMatrixChunk>* MatmulServiceImpl::UploadMatrix(
    grpc::CallbackServerContext* context, v1::MatrixHandle* response) {
  return new UploadCall(this, context, response);
}

grpc::ServerWriteReactor<v1::MatrixChunk>* MatmulServiceImpl::GetMatrix(
    grpc::CallbackServerContext* context, const v1::GetMatrixRequest* request) {
  return new DownloadCall(this, context, request);
}

grpc::ServerUnaryReactor* MatmulServiceImpl::DeleteMatrix(grpc::CallbackServerContext* context,
                                                          const v1::DeleteMatrixRequest* request,
                                                          v1::DeleteMatrixResponse*) {
  const absl::Time arrival = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<std::string> client = StoreCaller(*context);
    if (!client.ok()) return client.status();
    return options_.store->Delete(*client, request->id());
  }();
  return FinishUnary(context, "DeleteMatrix", status, arrival);
}

grpc::ServerUnaryReactor* MatmulServiceImpl::ListMatrices(grpc::CallbackServerContext* context,
                                                          const v1::ListMatricesRequest*,
                                                          v1::ListMatricesResponse* response) {
  const absl::Time arrival = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<std::string> client = StoreCaller(*context);
    if (!client.ok()) return client.status();
    for (v1::MatrixHandle& h : options_.store->List(*client)) *response->add_matrices() = std::move(h);
    return absl::OkStatus();
  }();
  return FinishUnary(context, "ListMatrices", status, arrival);
}

grpc::ServerUnaryReactor* MatmulServiceImpl::RegisterSharedMemory(
    grpc::CallbackServerContext* context, const v1::RegisterSharedMemoryRequest* request,
    v1::RegisterSharedMemoryResponse*) {
  const absl::Time arrival = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<std::string> client = SharedMemoryCaller(*context);
    if (!client.ok()) return client.status();
    return options_.shared_memory->Register(*client, request->name(), request->key(),
                                            request->offset(), request->byte_size());
  }();
  return FinishUnary(context, "RegisterSharedMemory", status, arrival);
}

grpc::ServerUnaryReactor* MatmulServiceImpl::UnregisterSharedMemory(
    grpc::CallbackServerContext* context, const v1::UnregisterSharedMemoryRequest* request,
    v1::UnregisterSharedMemoryResponse*) {
  const absl::Time arrival = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<std::string> client = SharedMemoryCaller(*context);
    if (!client.ok()) return client.status();
    return options_.shared_memory->Unregister(*client, request->name());
  }();
  return FinishUnary(context, "UnregisterSharedMemory", status, arrival);
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

absl::Status MatmulServiceImpl::Submit(const std::string& client, const MultiplyRequest& request,
                                       const InlineOperands& operands,
                                       MultiplyResponse* response, ResultBuffer* result,
                                       absl::Time arrival, absl::Time deadline, uint64_t* job_id,
                                       absl::AnyInvocable<void(const JobOutcome&)> done) {
  MatrixStore* store = options_.store;
  KeptMatrixLookup lookup;
  if (store != nullptr) {
    lookup = [store, &client](absl::string_view field,
                              absl::string_view id) -> absl::StatusOr<KeptMatrix> {
      absl::StatusOr<std::shared_ptr<StoredMatrix>> m = store->Find(client, id, field);
      if (!m.ok()) return m.status();
      KeptMatrix kept;
      kept.rows = static_cast<uint64_t>((*m)->rows());
      kept.cols = static_cast<uint64_t>((*m)->cols());
      kept.dtype = (*m)->dtype();
      kept.matrix = *std::move(m);
      return kept;
    };
  }
  SharedMemoryLookup shm;
  if (options_.shared_memory != nullptr) {
    const SharedMemoryRegistry* registry = options_.shared_memory;
    shm = [registry, &client](const v1::SharedMemoryRef& ref, const std::string& field) {
      return registry->Resolve(client, ref, field);
    };
  }
  absl::StatusOr<ValidatedRequest> validated =
      ValidateMultiplyRequest(request, options_.limits, lookup, shm, &operands);
  if (!validated.ok()) {
    metrics_->Rejected(ReasonFor(validated.status()));
    return validated.status();
  }
  std::unique_ptr<ResidentOperands> resident;
  if (validated->a_kept || validated->b_kept || validated->c_kept || validated->keep_result) {
    absl::Duration ttl;
    if (validated->keep_result) {
      absl::StatusOr<absl::Duration> t =
          store->TtlFor(request.result_ttl_seconds(), "result_ttl_seconds");
      if (!t.ok()) {
        metrics_->Rejected(RejectReason::kInvalid);
        return t.status();
      }
      ttl = *t;
    }
    absl::StatusOr<std::unique_ptr<ResidentOperands>> bound = store->Bind(
        client, validated->a_kept, validated->b_kept, validated->c_kept, validated->keep_result,
        validated->problem.m, validated->problem.n, validated->problem.output_type, ttl,
        response->mutable_result_handle());
    if (!bound.ok()) {
      metrics_->Rejected(ReasonFor(bound.status()));
      return bound.status();
    }
    resident = *std::move(bound);
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
  const bool output_elsewhere = validated->keep_result || validated->output_shm != nullptr;
  job->output = output_elsewhere ? nullptr : result;
  job->output_bytes = output_elsewhere ? 0 : validated->output_bytes;
  job->problem.d = validated->output_shm;
  job->resident = std::move(resident);
  job->holds = std::move(validated->holds);
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
