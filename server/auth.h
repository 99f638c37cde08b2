// Bearer-token authentication for matmul.v1.MatmulService.
//
//   auto auth = TokenAuthenticator::Create("/etc/matmul/tokens");
//   absl::StatusOr<std::string> client = (*auth)->Authenticate(context->client_metadata());
//   // client: the token's name, used for per-client limits; UNAUTHENTICATED otherwise.
//   (*auth)->Reload();   // on SIGHUP; the file is also re-read when it changes
//
// Token file: one token per line, as "NAME TOKEN" or just "TOKEN" (then the
// name is "client-<n>"); blank lines and lines starting with '#' are
// skipped. Tokens are compared in constant time against every known token,
// and never logged; a refusal says only that the token is missing or not
// valid.
#ifndef MATMUL_SERVER_AUTH_H_
#define MATMUL_SERVER_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace matmul::server {

class TokenAuthenticator {
 public:
  // Reads `path`; watches it for changes every `poll` (0 = no watching).
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> Create(
      const std::string& path, absl::Duration poll = absl::Seconds(2));
  ~TokenAuthenticator();

  // The client name for the call's "authorization: Bearer <token>", or
  // UNAUTHENTICATED.
  absl::StatusOr<std::string> Authenticate(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;
  absl::StatusOr<std::string> AuthenticateToken(absl::string_view token) const;

  // Re-reads the file; on error the previous tokens stay in force.
  absl::Status Reload();

  size_t size() const;

 private:
  struct Entry {
    std::string name;
    std::string token;
  };
  explicit TokenAuthenticator(std::string path) : path_(std::move(path)) {}
  static absl::StatusOr<std::vector<Entry>> Read(const std::string& path);
  void Watch(absl::Duration poll);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  // The file's last modification time seen by the watcher.
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stop_;
  std::thread watcher_;
};

// True when a and b are equal; takes the same time for any b of a given
// length whatever the contents.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace matmul::server

#endif  // MATMUL_SERVER_AUTH_H_
