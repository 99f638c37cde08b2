#include "client/matmul_client.h"

#include <condition_variable>
#include <fstream>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace matmul::client {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::unique_ptr<MatmulClient>> MatmulClient::Create(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("target is empty");
  if (options.load_balancing != "pick_first" && options.load_balancing != "round_robin") {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_balancing must be pick_first or round_robin, got ", options.load_balancing));
  }
  if (options.max_attempts < 1 || options.max_attempts > 5) {
    return absl::InvalidArgumentError("max_attempts must be in [1, 5]");
  }
  if (options.channels < 1) return absl::InvalidArgumentError("channels must be >= 1");
  // round_robin also watches each backend's health service, so a replica
  // that drains (health NOT_SERVING) stops getting new calls at once.
  const std::string health =
      options.load_balancing == "round_robin"
          ? R"(, "healthCheckConfig": {"serviceName": "matmul.v1.MatmulService"})"
          : "";
  std::string service_config = absl::StrFormat(
      R"({"loadBalancingConfig": [{"%s": {}}]%s})", options.load_balancing, health);
  if (options.max_attempts > 1) {
    service_config = absl::StrFormat(
        R"({"loadBalancingConfig": [{"%s": {}}]%s,
            "methodConfig": [{"name": [{"service": "matmul.v1.MatmulService"}],
              "retryPolicy": {"maxAttempts": %d, "initialBackoff": "0.05s",
                              "maxBackoff": "1s", "backoffMultiplier": 2,
                              "retryableStatusCodes": ["UNAVAILABLE"]}}]})",
        options.load_balancing, health, options.max_attempts);
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<MatmulClient> client(new MatmulClient(options));
  for (int i = 0; i < options.channels; ++i) {
    grpc::ChannelArguments args = MakeChannelArguments(options);
    args.SetServiceConfigJSON(service_config);
    // Distinct channels get distinct connections.
    args.SetInt("matmul.channel_index", i);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Retries buffer the request; allow large ones.
    args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, options.max_message_bytes);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, options.max_attempts > 1 ? 1 : 0);
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomChannel(options.target, *credentials, args);
    client->stubs_.push_back(v1::MatmulService::NewStub(channel));
  }
  return client;
}

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientOptions& options) {
  if (options.tls_ca_file.empty()) {
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      return absl::InvalidArgumentError("a client certificate needs tls_ca_file (TLS) too");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadFile(options.tls_ca_file);
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("mutual TLS needs both tls_cert_file and tls_key_file");
  }
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(options.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(options.tls_key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

absl::Status ApplySecurityFlags(const std::string& tls_ca, const std::string& tls_cert,
                                const std::string& tls_key, const std::string& tls_server_name,
                                const std::string& token_file, ClientOptions* options) {
  options->tls_ca_file = tls_ca;
  options->tls_cert_file = tls_cert;
  options->tls_key_file = tls_key;
  options->tls_server_name = tls_server_name;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFile(token_file);
    if (!token.ok()) return token.status();
    options->auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (options->auth_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(token_file, " is empty"));
    }
  }
  return absl::OkStatus();
}

grpc::ChannelArguments MakeChannelArguments(const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // The server may send results in HTTP/2 frames of up to 1 MiB instead of
  // 16 KiB: less per-frame work on both ends (docs/BENCHMARKS.md).
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  return args;
}

v1::MatmulService::Stub* MatmulClient::stub() const {
  return stubs_[next_stub_.fetch_add(1, std::memory_order_relaxed) % stubs_.size()].get();
}

void MatmulClient::PrepareContext(grpc::ClientContext* context) const {
  if (options_.timeout > absl::ZeroDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  }
  Authorize(context);
}

void MatmulClient::Authorize(grpc::ClientContext* context) const {
  if (!options_.auth_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.auth_token);
  }
}

absl::StatusOr<v1::MultiplyResponse> MatmulClient::Multiply(
    const v1::MultiplyRequest& request) const {
  grpc::ClientContext context;
  PrepareContext(&context);
  v1::MultiplyResponse response;
  const grpc::Status status = stub()->Multiply(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return response;
}

absl::StatusOr<v1::ServerInfo> MatmulClient::GetServerInfo() const {
  grpc::ClientContext context;
  PrepareContext(&context);
  v1::ServerInfo info;
  const grpc::Status status = stub()->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  if (!status.ok()) return FromGrpc(status);
  return info;
}

absl::StatusOr<v1::MatrixHandle> MatmulClient::PutMatrix(const v1::Matrix& matrix,
                                                         uint64_t ttl_seconds,
                                                         uint64_t chunk_bytes) const {
  grpc::ClientContext context;
  PrepareContext(&context);
  v1::MatrixHandle handle;
  if (chunk_bytes == 0 || matrix.data().size() <= chunk_bytes) {
    v1::PutMatrixRequest request;
    *request.mutable_matrix() = matrix;
    request.set_ttl_seconds(ttl_seconds);
    const grpc::Status status = stub()->PutMatrix(&context, request, &handle);
    if (!status.ok()) return FromGrpc(status);
    return handle;
  }
  std::unique_ptr<grpc::ClientWriter<v1::UploadMatrixChunk>> writer =
      stub()->UploadMatrix(&context, &handle);
  const std::string& data = matrix.data();
  for (size_t offset = 0; offset < data.size(); offset += chunk_bytes) {
    v1::UploadMatrixChunk chunk;
    if (offset == 0) {
      chunk.set_rows(matrix.rows());
      chunk.set_cols(matrix.cols());
      chunk.set_dtype(matrix.dtype());
      chunk.set_ttl_seconds(ttl_seconds);
    }
    chunk.set_data(data.substr(offset, chunk_bytes));
    if (!writer->Write(chunk)) break;  // The server ended the call; Finish says why.
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpc(status);
  return handle;
}

absl::StatusOr<v1::Matrix> MatmulClient::GetMatrix(const std::string& id) const {
  grpc::ClientContext context;
  PrepareContext(&context);
  v1::GetMatrixRequest request;
  request.set_id(id);
  std::unique_ptr<grpc::ClientReader<v1::MatrixChunk>> reader = stub()->GetMatrix(&context, request);
  v1::Matrix matrix;
  v1::MatrixChunk chunk;
  bool first = true;
  while (reader->Read(&chunk)) {
    if (first) {
      matrix.set_rows(chunk.handle().rows());
      matrix.set_cols(chunk.handle().cols());
      matrix.set_dtype(chunk.handle().dtype());
      matrix.mutable_data()->reserve(chunk.handle().bytes());
      first = false;
    }
    matrix.mutable_data()->append(chunk.data());
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpc(status);
  return matrix;
}

absl::Status MatmulClient::DeleteMatrix(const std::string& id) const {
  grpc::ClientContext context;
  PrepareContext(&context);
  v1::DeleteMatrixRequest request;
  request.set_id(id);
  v1::DeleteMatrixResponse response;
  return FromGrpc(stub()->DeleteMatrix(&context, request, &response));
}

absl::StatusOr<std::vector<v1::MatrixHandle>> MatmulClient::ListMatrices() const {
  grpc::ClientContext context;
  PrepareContext(&context);
  v1::ListMatricesResponse response;
  const grpc::Status status = stub()->ListMatrices(&context, v1::ListMatricesRequest(), &response);
  if (!status.ok()) return FromGrpc(status);
  return std::vector<v1::MatrixHandle>(response.matrices().begin(), response.matrices().end());
}

absl::StatusOr<std::vector<v1::MultiplyResponse>> MatmulClient::MultiplyStream(
    absl::Span<const v1::MultiplyRequest> requests) const {
  grpc::ClientContext context;
  PrepareContext(&context);
  std::shared_ptr<grpc::ClientReaderWriter<v1::MultiplyRequest, v1::MultiplyResponse>> stream =
      stub()->MultiplyStream(&context);
  std::vector<v1::MultiplyResponse> responses;
  // Read on a second thread so that neither side's flow control stalls.
  std::thread reader([&] {
    v1::MultiplyResponse response;
    while (stream->Read(&response)) responses.push_back(std::move(response));
  });
  for (const v1::MultiplyRequest& request : requests) {
    if (!stream->Write(request)) break;
  }
  stream->WritesDone();
  reader.join();
  const grpc::Status status = stream->Finish();
  if (!status.ok()) return FromGrpc(status);
  return responses;
}

void MatmulClient::MultiplyAsync(grpc::ClientContext* context, const v1::MultiplyRequest* request,
                                 v1::MultiplyResponse* response,
                                 std::function<void(grpc::Status)> done) const {
  Authorize(context);
  stub()->async()->Multiply(context, request, response, std::move(done));
}

}  // namespace matmul::client
