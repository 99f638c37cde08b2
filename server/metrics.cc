#include "server/metrics.h"

#include <grpcpp/support/status_code_enum.h>

#include "absl/strings/str_cat.h"

namespace matmul::server {
namespace {

// gRPC status code names as grpc-go and the gRPC docs spell them.
constexpr absl::string_view kCodeNames[] = {
    "OK",           "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED", "NOT_FOUND",     "ALREADY_EXISTS",    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",    "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL",          "UNAVAILABLE",       "DATA_LOSS",
    "UNAUTHENTICATED"};
static_assert(std::size(kCodeNames) == Metrics::kGrpcCodes, "a name for every code counted");

// `code` as an index of kCodeNames: codes without a name of their own count
// as UNKNOWN.
int CodeIndex(int code) {
  return code >= 0 && code < Metrics::kGrpcCodes ? code : grpc::StatusCode::UNKNOWN;
}

absl::string_view ReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kQueueFull: return "queue_full";
    case RejectReason::kDeadline: return "deadline";
    case RejectReason::kCancelled: return "cancelled";
    case RejectReason::kInvalid: return "invalid";
    case RejectReason::kTooLarge: return "too_large";
    case RejectReason::kShutdown: return "shutdown";
    case RejectReason::kUnauthenticated: return "unauthenticated";
    case RejectReason::kClientLimit: return "client_limit";
  }
  return "unknown";
}

prometheus::Histogram::BucketBoundaries BatchSizeBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
}

prometheus::Histogram::BucketBoundaries FlopsBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e3; v <= 1e14; v *= 10) b.push_back(v);
  return b;
}

}  // namespace

const prometheus::Histogram::BucketBoundaries& Metrics::LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
      50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0,  30.0};
  return *buckets;
}

Metrics::Metrics(std::shared_ptr<prometheus::Registry> registry,
                 const std::vector<std::string>& device_ids,
                 const std::map<std::string, std::string>& build)
    : registry_(std::move(registry)),
      device_ids_(device_ids),
      requests_total_(prometheus::BuildCounter()
                          .Name("matmul_requests_total")
                          .Help("Finished requests (stream items count one each), by method "
                                "and gRPC status code.")
                          .Register(*registry_)),
      request_duration_(prometheus::BuildHistogram()
                            .Name("matmul_request_duration_seconds")
                            .Help("Time from a request's arrival to its response, by method.")
                            .Register(*registry_)) {
  queue_duration_ = &prometheus::BuildHistogram()
                         .Name("matmul_queue_duration_seconds")
                         .Help("Time a job waited in the queue before its batch started.")
                         .Register(*registry_)
                         .Add({}, LatencyBuckets());
  auto& compute = prometheus::BuildHistogram()
                      .Name("matmul_compute_duration_seconds")
                      .Help("Engine time of one batch, by device.")
                      .Register(*registry_);
  auto& busy = prometheus::BuildCounter()
                   .Name("matmul_device_busy_seconds_total")
                   .Help("Wall time the device spent running at least one batch; its rate is "
                         "the device's utilisation (0..1).")
                   .Register(*registry_);
  auto& healthy = prometheus::BuildGauge()
                      .Name("matmul_device_healthy")
                      .Help("1 while the device takes work, 0 once it failed.")
                      .Register(*registry_);
  auto& memory_used = prometheus::BuildGauge()
                          .Name("matmul_device_memory_used_bytes")
                          .Help("Device memory held by running batches (0 for the CPU engine).")
                          .Register(*registry_);
  auto& memory_capacity = prometheus::BuildGauge()
                              .Name("matmul_device_memory_capacity_bytes")
                              .Help("Device memory reserved for the engine's pool (0 for the CPU "
                                    "engine).")
                              .Register(*registry_);
  auto& flops = prometheus::BuildCounter()
                    .Name("matmul_flops_total")
                    .Help("Floating-point operations done (2*M*N*K per product), by device "
                          "and input dtype.")
                    .Register(*registry_);
  auto& batches = prometheus::BuildCounter()
                      .Name("matmul_batches_total")
                      .Help("Batches run, by device.")
                      .Register(*registry_);
  auto& resident_bytes = prometheus::BuildGauge()
                             .Name("matmul_resident_bytes")
                             .Help("Bytes of matrices kept on the server (PutMatrix, UploadMatrix, "
                                   "store_result), by device holding them.")
                             .Register(*registry_);
  for (const std::string& id : device_ids_) {
    resident_bytes_.push_back(&resident_bytes.Add({{"device", id}}));
    compute_duration_.push_back(&compute.Add({{"device", id}}, LatencyBuckets()));
    device_busy_.push_back(&busy.Add({{"device", id}}));
    device_healthy_.push_back(&healthy.Add({{"device", id}}));
    device_healthy_.back()->Set(1);
    device_memory_used_.push_back(&memory_used.Add({{"device", id}}));
    device_memory_capacity_.push_back(&memory_capacity.Add({{"device", id}}));
    batches_total_.push_back(&batches.Add({{"device", id}}));
    std::vector<prometheus::Counter*> per_dtype;
    for (int t = 0; t < kNumDTypes; ++t) {
      per_dtype.push_back(
          &flops.Add({{"device", id}, {"dtype", std::string(DTypeName(static_cast<DType>(t)))}}));
    }
    flops_total_.push_back(std::move(per_dtype));
  }
  batch_size_ = &prometheus::BuildHistogram()
                     .Name("matmul_batch_size")
                     .Help("Problems per batch.")
                     .Register(*registry_)
                     .Add({}, BatchSizeBuckets());
  batch_flops_ = &prometheus::BuildHistogram()
                      .Name("matmul_batch_flops")
                      .Help("Floating-point operations per batch.")
                      .Register(*registry_)
                      .Add({}, FlopsBuckets());
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("matmul_queue_depth")
                      .Help("Jobs waiting in the queue.")
                      .Register(*registry_)
                      .Add({});
  resident_matrices_ = &prometheus::BuildGauge()
                            .Name("matmul_resident_matrices")
                            .Help("Matrices kept on the server.")
                            .Register(*registry_)
                            .Add({});
  resident_stored_ = &prometheus::BuildCounter()
                          .Name("matmul_resident_stored_bytes_total")
                          .Help("Bytes of matrices stored (uploads and kept results).")
                          .Register(*registry_)
                          .Add({});
  resident_downloaded_ = &prometheus::BuildCounter()
                              .Name("matmul_resident_downloaded_bytes_total")
                              .Help("Bytes of kept matrices downloaded with GetMatrix.")
                              .Register(*registry_)
                              .Add({});
  queue_capacity_ = &prometheus::BuildGauge()
                         .Name("matmul_queue_capacity")
                         .Help("Most jobs the queue holds (--queue_capacity).")
                         .Register(*registry_)
                         .Add({});
  inflight_ = &prometheus::BuildGauge()
                   .Name("matmul_inflight_requests")
                   .Help("Requests accepted and not yet answered.")
                   .Register(*registry_)
                   .Add({});
  auto& rejected = prometheus::BuildCounter()
                       .Name("matmul_rejected_total")
                       .Help("Requests refused or ended without a result, by reason.")
                       .Register(*registry_);
  for (RejectReason r : {RejectReason::kQueueFull, RejectReason::kDeadline,
                         RejectReason::kCancelled, RejectReason::kInvalid,
                         RejectReason::kTooLarge, RejectReason::kShutdown,
                         RejectReason::kUnauthenticated, RejectReason::kClientLimit}) {
    rejected_.push_back(&rejected.Add({{"reason", std::string(ReasonName(r))}}));
  }
  bytes_received_ = &prometheus::BuildCounter()
                         .Name("matmul_bytes_received_total")
                         .Help("Bytes of Multiply request messages received.")
                         .Register(*registry_)
                         .Add({});
  bytes_sent_ = &prometheus::BuildCounter()
                     .Name("matmul_bytes_sent_total")
                     .Help("Bytes of Multiply response messages sent.")
                     .Register(*registry_)
                     .Add({});
  prometheus::BuildGauge()
      .Name("matmul_build_info")
      .Help("Always 1; labels say what is running.")
      .Register(*registry_)
      .Add(build)
      .Set(1);
}

void Metrics::RequestFinished(absl::string_view method, int grpc_code, double seconds) {
  const int code = CodeIndex(grpc_code);
  prometheus::Histogram* histogram;
  prometheus::Counter* counter;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_method_.find(method);
    if (it == by_method_.end()) {
      MethodMetrics made;
      made.duration = &request_duration_.Add({{"method", std::string(method)}}, LatencyBuckets());
      it = by_method_.emplace(std::string(method), made).first;
    }
    prometheus::Counter*& requests = it->second.requests[code];
    if (requests == nullptr) {
      requests = &requests_total_.Add(
          {{"method", std::string(method)}, {"code", std::string(kCodeNames[code])}});
    }
    histogram = it->second.duration;
    counter = requests;
  }
  counter->Increment();
  histogram->Observe(seconds);
}

void Metrics::QueueTime(double seconds) { queue_duration_->Observe(seconds); }

void Metrics::BatchFinished(int device, size_t size, double flops, double compute_seconds,
                            DType dtype) {
  compute_duration_[device]->Observe(compute_seconds);
  flops_total_[device][static_cast<int>(dtype)]->Increment(flops);
  batches_total_[device]->Increment();
  batch_size_->Observe(static_cast<double>(size));
  batch_flops_->Observe(flops);
}

void Metrics::Rejected(RejectReason reason) { rejected_[static_cast<int>(reason)]->Increment(); }

void Metrics::SetDeviceMemory(int device, uint64_t in_use, uint64_t capacity) {
  device_memory_used_[device]->Set(static_cast<double>(in_use));
  device_memory_capacity_[device]->Set(static_cast<double>(capacity));
}

void Metrics::SetDeviceHealthy(int device, bool healthy) {
  device_healthy_[device]->Set(healthy ? 1 : 0);
}

}  // namespace matmul::server
