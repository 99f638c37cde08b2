// A job: one validated multiply waiting for, or running on, an engine.
//
// The caller (a gRPC reactor) keeps the request and the result buffer alive
// until `on_done` runs; the job only points into them. `on_done` runs exactly once,
// from whichever component ends the job: the scheduler (queue full,
// deadline, cancellation, shutdown) or a worker (result ready).
//
//   auto job = std::make_unique<Job>();
//   job->problem = validated.problem;
//   job->output = &result;   // a ResultBuffer the reactor owns
//   job->output_bytes = validated.output_bytes;
//   job->on_done = [](const JobOutcome& outcome) { ... Finish(...) ... };
//   scheduler->Submit(std::move(job));
#ifndef MATMUL_SERVER_JOB_H_
#define MATMUL_SERVER_JOB_H_

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kernels/engine.h"

namespace matmul::server {

// The bytes of one result. The worker allocates them just before the engine
// runs, without zeroing them (the engine writes every byte), and the service
// hands them to gRPC as they are: the result is not copied again on its way
// to the wire (see wire_codec.h).
class ResultBuffer {
 public:
  // Makes room for `bytes`; RESOURCE_EXHAUSTED when memory can't be had.
  absl::Status Allocate(size_t bytes) {
    data_.reset(new (std::nothrow) char[bytes == 0 ? 1 : bytes]);
    if (data_ == nullptr) {
      size_ = 0;
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes for the result"));
    }
    size_ = bytes;
    return absl::OkStatus();
  }
  char* data() const { return data_.get(); }
  size_t size() const { return size_; }
  // Gives the bytes up (they are freed with delete[]); empty afterwards.
  std::unique_ptr<char[]> Release() {
    size_ = 0;
    return std::move(data_);
  }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
};

// How a job ended.
struct JobOutcome {
  // OK, or why there is no result.
  absl::Status status;
  // Arrival to start of its batch (0 when it never ran).
  absl::Duration queue_time;
  // Engine time of its batch.
  absl::Duration compute_time;
  // Problems in its batch (0 when it never ran).
  uint32_t batch_size = 0;
  // Device that ran it, e.g. "cuda:0"; empty when it never ran.
  std::string device;
};

// Jobs with equal keys may share a batch (one engine launch): same input
// and output dtype and precision.
struct BatchKey {
  DType input = DType::kFloat32;
  DType output = DType::kFloat32;
  Precision precision = Precision::kDefault;
  bool operator==(const BatchKey&) const = default;
};

inline BatchKey KeyOf(const GemmProblem& p) {
  // Precision only changes float32 arithmetic; elsewhere it is ignored so
  // that it does not split batches.
  return {p.input_type, p.output_type,
          p.input_type == DType::kFloat32 ? p.precision : Precision::kDefault};
}

// Matrices kept on the server that a job reads or writes (made by
// MatrixStore). The scheduler places the job's batch near them and the
// worker binds them to the device that runs it.
class ResidentOperands {
 public:
  virtual ~ResidentOperands() = default;
  // Bytes of the job's kept operands already on device `device`.
  virtual uint64_t BytesOn(int device) const = 0;
  // On the worker, just before `engine` (device `device`) runs the job:
  // points `problem`'s resident operands at their copies on that device
  // (copying them there first when needed) and makes room there for a
  // kept result. An error fails the job.
  virtual absl::Status Bind(int device, Engine& engine, GemmProblem& problem) = 0;
  // After the engine ran with `status`: keeps the result when it is OK.
  // Returns the job's final status.
  virtual absl::Status Complete(const absl::Status& status) = 0;
};

struct Job {
  // Unique per scheduler; used to cancel. Set by the submitter from
  // DynamicBatchScheduler::NewJobId().
  uint64_t id = 0;
  // The product; `problem.d` is set by the worker once `output` is sized.
  GemmProblem problem;
  // Where the result goes; allocated with `output_bytes` by the worker (off
  // the gRPC threads) just before the engine runs.
  ResultBuffer* output = nullptr;
  uint64_t output_bytes = 0;
  // Higher runs first.
  int32_t priority = 0;
  // When the request reached the server.
  absl::Time arrival = absl::InfinitePast();
  // Answer DEADLINE_EXCEEDED if still queued at this time.
  absl::Time deadline = absl::InfiniteFuture();
  // Called exactly once when the job ends.
  absl::AnyInvocable<void(const JobOutcome&)> on_done;
  // Kept operands or result, when the request uses any; `output` is null
  // when the result is kept.
  std::unique_ptr<ResidentOperands> resident;
  // Shared-memory regions the operands or result live in, kept mapped
  // until the job ends. `output` is null when the result goes there.
  std::vector<std::shared_ptr<const void>> holds;

  // Set by the queue when the job enters it.
  absl::Time enqueued = absl::InfinitePast();
};

}  // namespace matmul::server

#endif  // MATMUL_SERVER_JOB_H_
