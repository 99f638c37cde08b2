// C++ client of matmul.v1.MatmulService.
//
//   auto client = matmul::client::MatmulClient::Create({.target = "localhost:50051"});
//   matmul::v1::MultiplyRequest request = matmul::client::RandomRequest(spec, rng);
//   absl::StatusOr<matmul::v1::MultiplyResponse> response = (*client)->Multiply(request);
//   if (!response.ok()) { ... response.status() carries the gRPC code and message ... }
//
// Targets are gRPC target strings: "host:port", "dns:///name:port" (every
// address the name resolves to), or "ipv4:10.0.0.1:50051,10.0.0.2:50051".
#ifndef MATMUL_CLIENT_MATMUL_CLIENT_H_
#define MATMUL_CLIENT_MATMUL_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "matmul/v1/matmul.grpc.pb.h"

namespace matmul::client {

struct ClientOptions {
  // gRPC target (see above).
  std::string target = "localhost:50051";
  // "pick_first" or "round_robin" (spreads calls over every resolved
  // address, e.g. the pods behind a headless Kubernetes Service).
  std::string load_balancing = "pick_first";
  // Attempts per call for UNAVAILABLE answers (gRPC retry policy); 1 = no
  // retries.
  int max_attempts = 1;
  // Largest message sent or received.
  int max_message_bytes = 1 << 30;
  // Deadline of each call; zero means none.
  absl::Duration timeout = absl::ZeroDuration();
  // Separate TCP connections: calls are spread over this many channels.
  int channels = 1;
  // TLS: a CA bundle (PEM) to verify the server with turns TLS on; a client
  // certificate and key (PEM files) for mutual TLS; a name to expect in the
  // server's certificate instead of the target's host.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // Sent as "authorization: Bearer <token>" on every call when set.
  std::string auth_token;
};

// Channel credentials for `options` (TLS settings), read from the files.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientOptions& options);

// Fills the TLS and token fields of `options` from command-line style
// settings; the token is read from `token_file` (surrounding whitespace
// dropped) so that it does not show in process listings.
absl::Status ApplySecurityFlags(const std::string& tls_ca, const std::string& tls_cert,
                                const std::string& tls_key, const std::string& tls_server_name,
                                const std::string& token_file, ClientOptions* options);

// Channel arguments for `options` besides credentials (message sizes, TLS
// name override).
// HTTP/2 frames the client accepts (and the server, by default): 1 MiB.
inline constexpr int kHttp2FrameBytes = 1 << 20;

grpc::ChannelArguments MakeChannelArguments(const ClientOptions& options);

// gRPC status as absl::Status (same codes, same message).
absl::Status FromGrpc(const grpc::Status& status);

class MatmulClient {
 public:
  static absl::StatusOr<std::unique_ptr<MatmulClient>> Create(const ClientOptions& options);

  absl::StatusOr<v1::MultiplyResponse> Multiply(const v1::MultiplyRequest& request) const;

  // Sends every request over one stream and returns one response per
  // request, in the order they arrived (match them by request_id). Fails
  // only when the stream itself fails; per-item errors are in `error`.
  absl::StatusOr<std::vector<v1::MultiplyResponse>> MultiplyStream(
      absl::Span<const v1::MultiplyRequest> requests) const;

  absl::StatusOr<v1::ServerInfo> GetServerInfo() const;

  // Matrices kept on the server (see the PutMatrix RPC). Use the handle's
  // id as Matrix.handle in later requests.
  //
  // Keeps `matrix` (inline data) for `ttl_seconds` (0: server default).
  // Sends it in one message when it fits `chunk_bytes`, else streams it in
  // chunks of that size (UploadMatrix), so any size up to the store's
  // budget goes.
  absl::StatusOr<v1::MatrixHandle> PutMatrix(const v1::Matrix& matrix, uint64_t ttl_seconds = 0,
                                             uint64_t chunk_bytes = 4 << 20) const;
  // Downloads a kept matrix (rows, cols, dtype and data).
  absl::StatusOr<v1::Matrix> GetMatrix(const std::string& id) const;
  absl::Status DeleteMatrix(const std::string& id) const;
  absl::StatusOr<std::vector<v1::MatrixHandle>> ListMatrices() const;

  // Asynchronous unary call for load generators: `done` runs on a gRPC
  // thread once `response` is filled. `context` must outlive the call.
  void MultiplyAsync(grpc::ClientContext* context, const v1::MultiplyRequest* request,
                     v1::MultiplyResponse* response, std::function<void(grpc::Status)> done) const;

  // A stub over one of the channels, rotating; for callers that drive
  // streams themselves.
  v1::MatmulService::Stub* stub() const;

  const ClientOptions& options() const { return options_; }

  // Sets the call deadline from options().timeout and adds the token.
  void PrepareContext(grpc::ClientContext* context) const;
  // Adds the token (if any) to a context the caller set up.
  void Authorize(grpc::ClientContext* context) const;

 private:
  explicit MatmulClient(const ClientOptions& options) : options_(options) {}

  const ClientOptions options_;
  // One stub per channel.
  std::vector<std::unique_ptr<v1::MatmulService::Stub>> stubs_;
  mutable std::atomic<size_t> next_stub_{0};
};

}  // namespace matmul::client

#endif  // MATMUL_CLIENT_MATMUL_CLIENT_H_
