// Prometheus metrics of the server, in base units, histograms (not
// summaries) so that fleets can aggregate them.
//
//   auto registry = std::make_shared<prometheus::Registry>();
//   matmul::server::Metrics metrics(registry, {"cpu:0"}, build_labels);
//   metrics.RequestFinished("Multiply", grpc::StatusCode::OK, 0.003);
//
// The names and labels are a contract with dashboards and alerts
// (deploy/grafana, deploy/prometheus): change them only with those.
#ifndef MATMUL_SERVER_METRICS_H_
#define MATMUL_SERVER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/dtype.h"

namespace matmul::server {

// Why a request was refused or ended without a result; the `reason` label.
enum class RejectReason {
  kQueueFull,
  kDeadline,
  kCancelled,
  kInvalid,
  kTooLarge,
  kShutdown,
  kUnauthenticated,
  kClientLimit,
};

class Metrics {
 public:
  // gRPC status codes with a label of their own (0-16); requests_total
  // counts any other code as UNKNOWN.
  static constexpr int kGrpcCodes = 17;

  // `device_ids` label the per-device series ("cpu:0", "cuda:0", ...).
  // `build` labels the build-info gauge (version, commit, backend, ...).
  Metrics(std::shared_ptr<prometheus::Registry> registry, const std::vector<std::string>& device_ids,
          const std::map<std::string, std::string>& build);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // One finished call (or one stream item): its gRPC status code name and
  // time from arrival to response.
  void RequestFinished(absl::string_view method, int grpc_code, double seconds);
  // Time a job spent queued before its batch started.
  void QueueTime(double seconds);
  // One batch finished on device `device` (index into device_ids).
  void BatchFinished(int device, size_t size, double flops, double compute_seconds, DType dtype);
  void Rejected(RejectReason reason);
  void BytesReceived(uint64_t bytes) { bytes_received_->Increment(static_cast<double>(bytes)); }
  void BytesSent(uint64_t bytes) { bytes_sent_->Increment(static_cast<double>(bytes)); }
  void SetQueueDepth(size_t jobs) { queue_depth_->Set(static_cast<double>(jobs)); }
  void SetQueueCapacity(size_t jobs) { queue_capacity_->Set(static_cast<double>(jobs)); }
  void AddInflight(int delta) { inflight_->Increment(delta); }
  // Wall time device `device` spent running at least one batch; the rate of
  // matmul_device_busy_seconds_total is its utilisation (0..1).
  void AddDeviceBusy(int device, double seconds) { device_busy_[device]->Increment(seconds); }
  // 1 for a healthy device, 0 once it failed.
  void SetDeviceHealthy(int device, bool healthy);
  // Device memory held by running batches, and the engine's pool size.
  void SetDeviceMemory(int device, uint64_t in_use, uint64_t capacity);

  // Matrices kept on the server: bytes held on device `device` (copies
  // included, padding included), matrices kept, bytes stored (PutMatrix,
  // UploadMatrix, store_result) and downloaded (GetMatrix).
  void AddResidentBytes(int device, int64_t delta) {
    resident_bytes_[device]->Increment(static_cast<double>(delta));
  }
  void AddResidentMatrices(int delta) { resident_matrices_->Increment(delta); }
  void ResidentStored(uint64_t bytes) { resident_stored_->Increment(static_cast<double>(bytes)); }
  void ResidentDownloaded(uint64_t bytes) {
    resident_downloaded_->Increment(static_cast<double>(bytes));
  }

  // Bucket boundaries of the latency histograms: 50 us to 30 s.
  static const prometheus::Histogram::BucketBoundaries& LatencyBuckets();

 private:
  // Owner of every family below; exposed at /metrics.
  std::shared_ptr<prometheus::Registry> registry_;
  // Device ids in worker order, for label lookups.
  std::vector<std::string> device_ids_;

  prometheus::Family<prometheus::Counter>& requests_total_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  // One method's request metrics, each made on first use: its latency
  // histogram and its request counter per status code. Finding them here
  // costs a request one lookup under mu_, not prometheus-cpp's Family::Add
  // (a label map built, hashed and looked up under the family's lock),
  // which the development machine's instruction profile put at half of the
  // metrics' cost per request.
  struct MethodMetrics {
    prometheus::Histogram* duration = nullptr;
    std::array<prometheus::Counter*, kGrpcCodes> requests{};
  };
  absl::Mutex mu_;
  std::map<std::string, MethodMetrics, std::less<>> by_method_ ABSL_GUARDED_BY(mu_);
  prometheus::Histogram* queue_duration_;
  // Per device, in device order.
  std::vector<prometheus::Histogram*> compute_duration_;
  std::vector<prometheus::Counter*> device_busy_;
  std::vector<prometheus::Gauge*> device_healthy_;
  std::vector<prometheus::Gauge*> device_memory_used_;
  std::vector<prometheus::Gauge*> device_memory_capacity_;
  // Per device x dtype.
  std::vector<std::vector<prometheus::Counter*>> flops_total_;
  std::vector<prometheus::Counter*> batches_total_;
  prometheus::Histogram* batch_size_;
  prometheus::Histogram* batch_flops_;
  prometheus::Gauge* queue_depth_;
  prometheus::Gauge* queue_capacity_;
  prometheus::Gauge* inflight_;
  std::vector<prometheus::Counter*> rejected_;  // Indexed by RejectReason.
  prometheus::Counter* bytes_received_;
  prometheus::Counter* bytes_sent_;
  // Resident matrices.
  std::vector<prometheus::Gauge*> resident_bytes_;
  prometheus::Gauge* resident_matrices_;
  prometheus::Counter* resident_stored_;
  prometheus::Counter* resident_downloaded_;
};

}  // namespace matmul::server

#endif  // MATMUL_SERVER_METRICS_H_
