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
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kernels/engine.h"
#include "kernels/host_buffer.h"

namespace matmul::server {

// The bytes of one result. The worker allocates them just before the engine
// runs, without zeroing them (the engine writes every byte), from the
// engine's host buffer pool (pinned memory the device writes directly), and
// the service hands them to gRPC as they are: the result is not copied again
// on its way to the wire (see wire_codec.h).
class ResultBuffer {
 public:
  // Makes room for `bytes` from `pool` (null: the heap); RESOURCE_EXHAUSTED
  // when memory can't be had.
  absl::Status Allocate(size_t bytes, HostBufferPool* pool = nullptr) {
    buffer_ = HostBuffer::Allocate(pool, bytes);
    if (buffer_.data() == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes for the result"));
    }
    return absl::OkStatus();
  }
  char* data() const { return static_cast<char*>(buffer_.data()); }
  size_t size() const { return buffer_.size(); }
  // Page-locked (see GemmProblem::host_pinned).
  bool pinned() const { return buffer_.pinned(); }
  // Gives the bytes up; empty afterwards.
  HostBuffer Release() { return std::move(buffer_); }

 private:
  HostBuffer buffer_;
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
