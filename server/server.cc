#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <glog/logging.h>

#include <climits>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "matmul/build_info.h"

namespace matmul::server {
namespace {

constexpr char kServiceName[] = "matmul.v1.MatmulService";

}  // namespace

absl::StatusOr<std::unique_ptr<MatmulServer>> MatmulServer::Create(ServerConfig config) {
  absl::StatusOr<EngineSet> engines = CreateEngines(config.engine);
  if (!engines.ok()) return engines.status();
  return Create(std::move(config), *std::move(engines));
}

absl::StatusOr<std::unique_ptr<MatmulServer>> MatmulServer::Create(ServerConfig config,
                                                                   EngineSet engines) {
  if (engines.engines.empty()) return absl::InvalidArgumentError("no engine to serve with");
  if (config.max_request_bytes == 0 || config.max_request_bytes > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_request_bytes must be in [1, ", INT_MAX, "], got ", config.max_request_bytes));
  }
  if (config.limits.max_dim == 0 || config.limits.max_dim > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_dim must be in [1, ", INT_MAX, "], got ", config.limits.max_dim));
  }
  if (config.max_stream_inflight < 1) {
    return absl::InvalidArgumentError("max_stream_inflight must be >= 1");
  }
  std::unique_ptr<MatmulServer> server(new MatmulServer(std::move(config), std::move(engines)));
  if (absl::Status status = server->Start(); !status.ok()) return status;
  return server;
}

MatmulServer::MatmulServer(ServerConfig config, EngineSet engines)
    : config_(std::move(config)), engines_(std::move(engines)) {}

MatmulServer::~MatmulServer() { Shutdown(absl::ZeroDuration()); }

absl::Status MatmulServer::Start() {
  const bool cuda = engines_.backend == "cuda";
  if (config_.lanes_per_device <= 0) config_.lanes_per_device = cuda ? 4 : 1;
  if (config_.lane_spin < absl::ZeroDuration()) {
    config_.lane_spin = cuda ? kCudaLaneSpin : absl::ZeroDuration();
  }
  if (config_.queue.max_batch_flops <= 0) config_.queue.max_batch_flops = cuda ? 1e12 : 2e10;
  uint64_t max_problem_bytes = 0;
  for (const auto& engine : engines_.engines) {
    const uint64_t limit = engine->MaxProblemBytes();
    if (limit > 0 && (max_problem_bytes == 0 || limit > max_problem_bytes)) {
      max_problem_bytes = limit;
    }
  }
  config_.limits.max_problem_bytes = max_problem_bytes;

  std::vector<std::string> device_ids;
  std::vector<Engine*> engines;
  for (const auto& engine : engines_.engines) {
    device_ids.push_back(engine->Device().id);
    engines.push_back(engine.get());
  }
  registry_ = std::make_shared<prometheus::Registry>();
  metrics_ = std::make_unique<Metrics>(
      registry_, device_ids,
      std::map<std::string, std::string>{{"version", MATMUL_VERSION},
                                         {"commit", MATMUL_BUILD_COMMIT},
                                         {"backend", engines_.backend},
                                         {"engine", std::string(engines.front()->Name())}});
  if (!config_.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
        MetricsEndpoint::Create(config_.metrics_listen, registry_,
                                {.live = [this] { return !devices_lost_.load(); },
                                 .ready = [this] { return serving_.load(); }});
    if (!endpoint.ok()) return endpoint.status();
    metrics_endpoint_ = *std::move(endpoint);
    metrics_port_ = metrics_endpoint_->port();
  }

  metrics_->SetQueueCapacity(config_.queue.capacity);
  for (size_t d = 0; d < engines_.engines.size(); ++d) {
    const EngineStats stats = engines_.engines[d]->Stats();
    metrics_->SetDeviceMemory(static_cast<int>(d), stats.memory_in_use_bytes,
                              stats.memory_capacity_bytes);
  }

  if (config_.resident.max_bytes > 0) {
    MatrixStore::Options store_options = config_.resident;
    store_options.enforce_owner = !config_.auth_tokens_file.empty();
    absl::StatusOr<std::unique_ptr<MatrixStore>> store =
        MatrixStore::Create(store_options, engines, metrics_.get());
    if (!store.ok()) return store.status();
    store_ = *std::move(store);
  }

  DynamicBatchScheduler::Options scheduler_options;
  scheduler_options.queue = config_.queue;
  scheduler_options.lanes_per_device = config_.lanes_per_device;
  scheduler_options.dispatch_when_idle = config_.dispatch_when_idle;
  scheduler_options.dispatch_below_running = config_.dispatch_below_running;
  scheduler_options.lane_spin = config_.lane_spin;
  // With no healthy device left, health says so (a load balancer then
  // routes elsewhere); with some left the server keeps serving on them.
  scheduler_options.on_device_failed = [this](int device, int healthy_left) {
    LOG(ERROR) << "device " << engines_.engines[device]->Device().id
               << " failed and takes no more work; " << healthy_left << " healthy device(s) left";
    if (healthy_left == 0) {
      devices_lost_.store(true);
      SetServing(false);
    }
  };
  absl::StatusOr<std::unique_ptr<DynamicBatchScheduler>> scheduler =
      DynamicBatchScheduler::Create(scheduler_options, engines, metrics_.get());
  if (!scheduler.ok()) return scheduler.status();
  scheduler_ = *std::move(scheduler);

  if (!config_.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
        TokenAuthenticator::Create(config_.auth_tokens_file);
    if (!auth.ok()) return auth.status();
    auth_ = *std::move(auth);
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = Credentials();
  if (!credentials.ok()) return credentials.status();

  MatmulServiceImpl::Options service_options;
  service_options.limits = config_.limits;
  service_options.default_timeout = config_.default_timeout;
  service_options.max_stream_inflight = config_.max_stream_inflight;
  service_options.auth = auth_.get();
  service_options.max_inflight_per_client = config_.max_inflight_per_client;
  service_options.store = store_.get();
  // One pool serves every engine of a process (pinned memory is portable
  // across GPUs).
  service_options.host_buffers = engines.empty() ? nullptr : engines.front()->HostBuffers();
  if (config_.shared_memory) shared_memory_ = std::make_unique<SharedMemoryRegistry>();
  service_options.shared_memory = shared_memory_.get();
  service_ = std::make_unique<MatmulServiceImpl>(service_options, scheduler_.get(), metrics_.get(),
                                                 [this] { return Info(); });

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.listen, *credentials, &port_);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(config_.max_request_bytes));
  builder.SetMaxSendMessageSize(-1);
  // A second server on a busy port must fail, not share it silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Let clients keep idle connections alive with pings every 10 s or more.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Clients may send requests in HTTP/2 frames of up to 1 MiB rather than
  // 16 KiB: with both ends at 1 MiB the server spent 17% less CPU per
  // kept-weights request on the H200 host (docs/BENCHMARKS.md).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  // Operators' own arguments come last and so win over the above.
  for (const auto& [name, value] : config_.grpc_args) {
    int number;
    if (absl::SimpleAtoi(value, &number)) {
      builder.AddChannelArgument(name, number);
    } else {
      builder.AddChannelArgument(name, value);
    }
  }
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || port_ == 0) {
    grpc_server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config_.listen,
                                               " (address in use or not available)"));
  }
  SetServing(true);
  return absl::OkStatus();
}

void MatmulServer::SetServing(bool serving) {
  serving_.store(serving);
  if (grpc_server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceName, serving);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MatmulServer::Credentials() const {
  if (config_.tls_cert_file.empty() && config_.tls_key_file.empty()) {
    if (!config_.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError("tls_client_ca needs tls_cert and tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (config_.tls_cert_file.empty() || config_.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both tls_cert and tls_key");
  }
  auto read = [](const std::string& path) -> absl::StatusOr<std::string> {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  absl::StatusOr<std::string> cert = read(config_.tls_cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = read(config_.tls_key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!config_.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = read(config_.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::Status MatmulServer::ReloadTokens() {
  if (auth_ == nullptr) return absl::FailedPreconditionError("no token file configured");
  return auth_->Reload();
}

v1::ServerInfo MatmulServer::Info() const {
  v1::ServerInfo info;
  info.set_version(MATMUL_VERSION);
  info.set_build_commit(MATMUL_BUILD_COMMIT);
  info.set_engine(std::string(engines_.engines.front()->Name()));
  for (const auto& engine : engines_.engines) {
    const DeviceDescription& d = engine->Device();
    v1::DeviceInfo* device = info.add_devices();
    device->set_id(d.id);
    device->set_name(d.name);
    device->set_kind(d.kind);
    device->set_memory_bytes(d.memory_bytes);
    device->set_compute_units(d.compute_units);
    device->set_compute_capability(d.compute_capability);
    device->set_healthy(engine->Healthy());
  }
  for (v1::DType t : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT16,
                      v1::DTYPE_BFLOAT16}) {
    info.add_supported_dtypes(t);
  }
  v1::Limits* limits = info.mutable_limits();
  limits->set_max_dim(config_.limits.max_dim);
  limits->set_max_request_bytes(config_.max_request_bytes);
  limits->set_max_response_bytes(config_.limits.max_response_bytes);
  v1::BatchingSettings* batching = info.mutable_batching();
  batching->set_max_batch_size(static_cast<uint32_t>(config_.queue.max_batch_size));
  batching->set_max_queue_delay_us(absl::ToInt64Microseconds(config_.queue.max_queue_delay));
  batching->set_max_queue_gap_us(absl::ToInt64Microseconds(config_.queue.max_queue_gap));
  batching->set_max_batch_flops(config_.queue.max_batch_flops);
  batching->set_max_batch_bytes(config_.queue.max_batch_bytes);
  batching->set_queue_capacity(static_cast<uint32_t>(config_.queue.capacity));
  batching->set_default_timeout_ms(absl::ToInt64Milliseconds(config_.default_timeout));
  batching->set_priority_aging_ms(absl::ToInt64Milliseconds(config_.queue.priority_aging));
  batching->set_dispatch_when_idle(config_.dispatch_when_idle);
  batching->set_dispatch_below_running(static_cast<uint32_t>(config_.dispatch_below_running));
  batching->set_lanes_per_device(static_cast<uint32_t>(config_.lanes_per_device));
  batching->set_lane_spin_us(absl::ToInt64Microseconds(config_.lane_spin));
  if (store_ != nullptr) {
    v1::ResidentSettings* resident = info.mutable_resident();
    resident->set_max_bytes(config_.resident.max_bytes);
    resident->set_max_bytes_per_client(config_.resident.max_bytes_per_client);
    resident->set_default_ttl_seconds(absl::ToInt64Seconds(config_.resident.default_ttl));
    resident->set_max_ttl_seconds(absl::ToInt64Seconds(config_.resident.max_ttl));
  }
  return info;
}

bool MatmulServer::Shutdown(absl::Duration grace) {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return drained_;
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + grace;
  SetServing(false);
  if (service_ != nullptr) service_->StartDraining();
  drained_ = scheduler_ == nullptr || scheduler_->Drain(deadline);
  // Accepted work is done or running; keep the listener (answering
  // UNAVAILABLE) until clients have seen NOT_SERVING.
  absl::SleepFor(std::min(config_.drain_delay, deadline - absl::Now()));
  // Whatever is still queued ends UNAVAILABLE; running batches finish.
  if (scheduler_ != nullptr) scheduler_->Stop();
  if (grpc_server_ != nullptr) {
    // Every answer is on its way: wait until each call has sent its status
    // (within the grace period), then close at once. Waiting longer would
    // only wait for idle client connections to go away.
    if (service_ != nullptr) {
      service_->WaitForCalls(std::max(deadline, absl::Now() + absl::Seconds(1)));
    }
    grpc_server_->Shutdown(absl::ToChronoTime(absl::Now()));
    grpc_server_->Wait();
  }
  return drained_;
}

}  // namespace matmul::server
