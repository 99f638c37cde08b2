// The matmul.v1.MatmulService implementation on gRPC's callback API.
//
// A call is validated on the gRPC thread (sizes only), becomes a Job and is
// submitted to the scheduler; the worker that finishes the job finishes the
// call. No gRPC thread ever waits for compute. Multiply and MultiplyStream
// take gRPC's raw byte buffers so that results reach the wire without being
// copied (wire_codec.h); the other methods use the generated messages.
//
//   MatmulServiceImpl service(options, scheduler, metrics, info_fn);
//   builder.RegisterService(&service);
//   ...
//   service.StartDraining();   // new calls: UNAVAILABLE; accepted ones finish
#ifndef MATMUL_SERVER_MATMUL_SERVICE_H_
#define MATMUL_SERVER_MATMUL_SERVICE_H_

#include <atomic>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "matmul/v1/matmul.grpc.pb.h"
#include "server/auth.h"
#include "server/dynamic_batch_scheduler.h"
#include "server/matrix_store.h"
#include "server/metrics.h"
#include "server/request_validation.h"
#include "server/shared_memory.h"

namespace matmul::server {

// The generated callback service with Multiply and MultiplyStream on raw
// byte buffers (a raw bidi method can't be stacked on its typed callback
// form, so every method is named).
using MatmulServiceBase = v1::MatmulService::WithRawCallbackMethod_Multiply<
    v1::MatmulService::WithRawCallbackMethod_MultiplyStream<
        v1::MatmulService::WithCallbackMethod_GetServerInfo<
            v1::MatmulService::WithCallbackMethod_PutMatrix<
                v1::MatmulService::WithCallbackMethod_UploadMatrix<
                    v1::MatmulService::WithCallbackMethod_GetMatrix<
                        v1::MatmulService::WithCallbackMethod_DeleteMatrix<
                            v1::MatmulService::WithCallbackMethod_ListMatrices<
                                v1::MatmulService::WithCallbackMethod_RegisterSharedMemory<
                                    v1::MatmulService::WithCallbackMethod_UnregisterSharedMemory<
                                        v1::MatmulService::Service>>>>>>>>>>;

class MatmulServiceImpl final : public MatmulServiceBase {
 public:
  struct Options {
    RequestLimits limits;
    // Deadline for calls that carry none; zero means none.
    absl::Duration default_timeout = absl::ZeroDuration();
    // Most items of one stream queued or running at once; the stream stops
    // reading (flow control pushes back on the client) beyond it.
    int max_stream_inflight = 128;
    // When set, every MatmulService call needs a valid bearer token (health
    // and reflection stay open). Must outlive the service.
    const TokenAuthenticator* auth = nullptr;
    // Most requests one client (token name, or peer address without
    // authentication) may have queued or running; 0 means no limit.
    int max_inflight_per_client = 0;
    // Matrices kept between requests (PutMatrix, handles, store_result);
    // null: those calls are refused. Must outlive the service.
    MatrixStore* store = nullptr;
    // Same-host shared memory; null: off. Must outlive the service.
    SharedMemoryRegistry* shared_memory = nullptr;
    // Where large operand payloads are parsed to (the engines' pinned host
    // memory); null: they stay in the parsed message.
    HostBufferPool* host_buffers = nullptr;
  };

  // `scheduler` and `metrics` must outlive the service; `info` builds the
  // GetServerInfo answer.
  MatmulServiceImpl(const Options& options, DynamicBatchScheduler* scheduler, Metrics* metrics,
                    std::function<v1::ServerInfo()> info);

  grpc::ServerUnaryReactor* Multiply(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MultiplyStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* PutMatrix(grpc::CallbackServerContext* context,
                                      const v1::PutMatrixRequest* request,
                                      v1::MatrixHandle* response) override;
  grpc::ServerReadReactor<v1::UploadMatrixChunk>* UploadMatrix(
      grpc::CallbackServerContext* context, v1::MatrixHandle* response) override;
  grpc::ServerWriteReactor<v1::MatrixChunk>* GetMatrix(grpc::CallbackServerContext* context,
                                                       const v1::GetMatrixRequest* request) override;
  grpc::ServerUnaryReactor* DeleteMatrix(grpc::CallbackServerContext* context,
                                         const v1::DeleteMatrixRequest* request,
                                         v1::DeleteMatrixResponse* response) override;
  grpc::ServerUnaryReactor* ListMatrices(grpc::CallbackServerContext* context,
                                         const v1::ListMatricesRequest* request,
                                         v1::ListMatricesResponse* response) override;
  grpc::ServerUnaryReactor* RegisterSharedMemory(
      grpc::CallbackServerContext* context, const v1::RegisterSharedMemoryRequest* request,
      v1::RegisterSharedMemoryResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterSharedMemory(
      grpc::CallbackServerContext* context, const v1::UnregisterSharedMemoryRequest* request,
      v1::UnregisterSharedMemoryResponse* response) override;

  // New calls and new stream items get UNAVAILABLE; open streams end once
  // their accepted items are answered.
  void StartDraining();

  // Waits until every Multiply and MultiplyStream call has finished (its
  // status sent) or `deadline` passes; returns whether all finished.
  bool WaitForCalls(absl::Time deadline);

 private:
  class UnaryCall;
  class StreamCall;
  class UploadCall;
  class DownloadCall;

  // Who the call is from, or why it may not use the store now (draining,
  // unauthenticated, no store).
  absl::StatusOr<std::string> StoreCaller(const grpc::CallbackServerContext& context);
  // Likewise for the shared-memory calls.
  absl::StatusOr<std::string> SharedMemoryCaller(const grpc::CallbackServerContext& context);
  // Who the call is from; UNAVAILABLE when draining, UNAUTHENTICATED, or
  // FAILED_PRECONDITION with `off` when the feature is not `enabled`.
  absl::StatusOr<std::string> FeatureCaller(const grpc::CallbackServerContext& context,
                                            bool enabled, absl::string_view off);
  // Records a unary store or shared-memory call and finishes it.
  grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                        absl::string_view method, const absl::Status& status,
                                        absl::Time arrival);

  // Validates `request`, prepares `response` (all but the result's bytes,
  // which go to `result`) and submits a job that calls `done` when it ends.
  // On error nothing was submitted and `done` will not run. `*job_id` is set
  // before submission.
  // `operands` holds the payloads the parser moved out of `request`; both
  // must outlive the job.
  absl::Status Submit(const std::string& client, const v1::MultiplyRequest& request,
                      const InlineOperands& operands, v1::MultiplyResponse* response,
                      ResultBuffer* result, absl::Time arrival, absl::Time deadline,
                      uint64_t* job_id, absl::AnyInvocable<void(const JobOutcome&)> done);
  // The earlier of the call's own deadline and arrival + default timeout.
  absl::Time DeadlineFor(const grpc::CallbackServerContext& context, absl::Time arrival) const;
  // Counts a call or item that ended with `status` after arriving at `arrival`.
  void Record(absl::string_view method, const absl::Status& status, absl::Time arrival);
  // Who the call is from: its token's name, or its peer address when there
  // is no authentication. UNAUTHENTICATED when the token is missing or bad.
  absl::StatusOr<std::string> Identify(const grpc::CallbackServerContext& context) const;
  // Takes one of `client`'s in-flight slots; RESOURCE_EXHAUSTED when it has
  // max_inflight_per_client already. Release gives it back.
  absl::Status Admit(const std::string& client);
  void Release(const std::string& client);

  const Options options_;
  DynamicBatchScheduler* const scheduler_;
  Metrics* const metrics_;
  const std::function<v1::ServerInfo()> info_;
  std::atomic<bool> draining_{false};

  // Called by the reactors as they start and end.
  void CallStarted();
  void CallEnded();

  absl::Mutex calls_mu_;
  // Multiply and MultiplyStream reactors alive.
  int live_calls_ ABSL_GUARDED_BY(calls_mu_) = 0;

  absl::Mutex clients_mu_;
  // Requests in flight per client, when limited.
  absl::flat_hash_map<std::string, int> inflight_by_client_ ABSL_GUARDED_BY(clients_mu_);

  absl::Mutex streams_mu_;
  // Open streams, told when draining starts.
  absl::flat_hash_set<StreamCall*> streams_ ABSL_GUARDED_BY(streams_mu_);
};

// absl::Status and grpc::Status share their codes.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace matmul::server

#endif  // MATMUL_SERVER_MATMUL_SERVICE_H_
