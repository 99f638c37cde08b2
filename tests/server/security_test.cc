// TLS, mutual TLS, bearer tokens and per-client limits, against a real
// server process. Certificates are made with openssl at test time; nothing
// secret is in the repository.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/util/test_util.h"

namespace matmul {
namespace {

using testing::Rng;

using ::testing::HasSubstr;
using testing::ServerProcess;

// A throwaway PKI in a temporary directory.
class Pki {
 public:
  Pki() {
    char dir[] = "/tmp/matmul-pki-XXXXXX";
    dir_ = mkdtemp(dir);
    Run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout ca.key -out ca.pem -days 2 -subj /CN=matmul-test-ca");
    Run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=someone-else");
    Issue("server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth");
    Issue("client", "test-client", "extendedKeyUsage=clientAuth");
  }
  ~Pki() { std::system(absl::StrCat("rm -rf ", dir_).c_str()); }
  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

 private:
  void Run(const std::string& command) {
    const int rc = std::system(absl::StrCat("cd ", dir_, " && ", command, " >/dev/null 2>&1").c_str());
    ASSERT_EQ(rc, 0) << command;
  }
  void Issue(const std::string& name, const std::string& cn, const std::string& ext) {
    std::ofstream(Path(name + ".ext")) << ext << "\n";
    Run(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ",
                     name, ".key -out ", name, ".csr -subj /CN=", cn));
    Run(absl::StrCat("openssl x509 -req -in ", name, ".csr -CA ca.pem -CAkey ca.key -CAcreateserial ",
                     "-out ", name, ".pem -days 2 -extfile ", name, ".ext"));
  }
  std::string dir_;
};

const Pki& TestPki() {
  static const Pki* pki = new Pki();
  return *pki;
}

// GetServerInfo through a client built from `options` (target filled in).
absl::Status Ping(const ServerProcess& server, client::ClientOptions options) {
  options.target = absl::StrCat("localhost:", server.port());
  options.timeout = absl::Seconds(20);
  auto c = client::MatmulClient::Create(options);
  if (!c.ok()) return c.status();
  return (*c)->GetServerInfo().status();
}

std::vector<std::string> TlsFlags(bool mutual) {
  const Pki& pki = TestPki();
  std::vector<std::string> flags = {"--backend=cpu", "--tls_cert=" + pki.Path("server.pem"),
                                    "--tls_key=" + pki.Path("server.key")};
  if (mutual) flags.push_back("--tls_client_ca=" + pki.Path("ca.pem"));
  return flags;
}

TEST(SecurityTest, TlsServerRefusesPlainClientsAndUntrustedCertificates) {
  auto server = ServerProcess::Start(TlsFlags(false));
  ASSERT_TRUE(server.ok()) << server.status();
  const Pki& pki = TestPki();
  EXPECT_EQ(Ping(**server, {}).code(), absl::StatusCode::kUnavailable);  // Plain text.
  EXPECT_TRUE(Ping(**server, {.tls_ca_file = pki.Path("ca.pem")}).ok());
  EXPECT_EQ(Ping(**server, {.tls_ca_file = pki.Path("other-ca.pem")}).code(),
            absl::StatusCode::kUnavailable);  // Wrong CA.
  // A correct multiply over TLS.
  auto c = client::MatmulClient::Create(
      {.target = absl::StrCat("localhost:", (*server)->port()), .tls_ca_file = pki.Path("ca.pem")});
  const auto request = client::RandomRequest({.m = 20, .n = 30, .k = 40}, Rng());
  auto response = (*c)->Multiply(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_LE(*client::CheckResponse(request, *response), 1e-5);
}

TEST(SecurityTest, MutualTlsRequiresAClientCertificate) {
  auto server = ServerProcess::Start(TlsFlags(true));
  ASSERT_TRUE(server.ok()) << server.status();
  const Pki& pki = TestPki();
  EXPECT_EQ(Ping(**server, {.tls_ca_file = pki.Path("ca.pem")}).code(),
            absl::StatusCode::kUnavailable);  // No client certificate.
  EXPECT_TRUE(Ping(**server, {.tls_ca_file = pki.Path("ca.pem"),
                              .tls_cert_file = pki.Path("client.pem"),
                              .tls_key_file = pki.Path("client.key")})
                  .ok());
}

class TokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/matmul-tokens-XXXXXX";
    dir_ = mkdtemp(dir);
    tokens_ = absl::StrCat(dir_, "/tokens");
    log_ = absl::StrCat(dir_, "/server.log");
    Write({"alice " + kAlice, "# a comment", "", kBob});
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf ", dir_).c_str()); }
  void Write(const std::vector<std::string>& lines) {
    const std::string tmp = tokens_ + ".tmp";
    std::ofstream out(tmp);
    for (const auto& l : lines) out << l << "\n";
    out.close();
    std::rename(tmp.c_str(), tokens_.c_str());
  }
  absl::Status Call(const ServerProcess& s, const std::string& token) {
    auto c = client::MatmulClient::Create({.target = s.target(), .auth_token = token});
    const auto request = client::RandomRequest({.m = 8, .n = 8, .k = 8}, Rng());
    auto r = (*c)->Multiply(request);
    return r.status();
  }
  std::string ReadLog() {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  const std::string kAlice = "alice-token-0123456789abcdef";
  const std::string kBob = "bob-token-fedcba9876543210";
  std::string dir_, tokens_, log_;
};

TEST_F(TokenTest, GoodTokensPassBadOrMissingOnesAreUnauthenticated) {
  auto server = ServerProcess::Start({"--backend=cpu", "--auth_tokens_file=" + tokens_}, log_);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(Call(**server, kAlice).ok());
  EXPECT_TRUE(Call(**server, kBob).ok());
  for (const std::string& bad : {std::string(""), std::string("alice-token-0123456789abcdeX"),
                                 kAlice.substr(0, 10), kAlice + "x"}) {
    const absl::Status s = Call(**server, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_EQ(s.message(), "missing or invalid bearer token");  // No hint.
  }
  // Streams and server info need a token too.
  auto c = client::MatmulClient::Create({.target = (*server)->target()});
  EXPECT_EQ((*c)->GetServerInfo().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*c)->MultiplyStream({client::RandomRequest({.m = 2, .n = 2, .k = 2}, Rng())})
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  // Health stays open for probes.
  auto channel = grpc::CreateChannel((*server)->target(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("matmul.v1.MatmulService");
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&context, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->Wait(), 0);
  const std::string log = ReadLog();
  EXPECT_THAT(log, HasSubstr("2 token(s) loaded"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr(kAlice)));
  EXPECT_THAT(log, ::testing::Not(HasSubstr(kBob)));
}

TEST_F(TokenTest, TokensAreReloadedOnSighupAndWhenTheFileChanges) {
  auto server = ServerProcess::Start({"--backend=cpu", "--auth_tokens_file=" + tokens_}, log_);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string carol = "carol-token-aaaabbbbccccdddd";
  Write({"carol " + carol});
  (*server)->Signal(SIGHUP);
  // The reload happens on the server's signal thread; wait for it.
  while (!Call(**server, carol).ok()) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(Call(**server, kAlice).code(), absl::StatusCode::kUnauthenticated);
  // Without a signal: the server notices the file changed.
  absl::SleepFor(absl::Milliseconds(20));  // A distinct modification time.
  Write({"dave dave-token-1111222233334444"});
  while (!Call(**server, "dave-token-1111222233334444").ok()) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(Call(**server, carol).code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TokenTest, OneClientCannotTakeMoreThanItsShare) {
  // Requests wait 0.5 s in the queue, so a client's in-flight count stays up.
  auto server = ServerProcess::Start({"--backend=cpu", "--auth_tokens_file=" + tokens_,
                                      "--max_inflight_per_client=2",
                                      "--max_queue_delay_us=500000", "--dispatch_when_idle=false"},
                                     log_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto alice = *client::MatmulClient::Create({.target = (*server)->target(), .auth_token = kAlice});
  struct AsyncCall {
    grpc::ClientContext context;
    v1::MultiplyRequest request;
    v1::MultiplyResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<AsyncCall>> calls;
  for (int i = 0; i < 5; ++i) {
    auto call = std::make_unique<AsyncCall>();
    call->request = client::RandomRequest({.m = 4, .n = 4, .k = 4}, Rng());
    alice->MultiplyAsync(&call->context, &call->request, &call->response,
                         [raw = call.get()](grpc::Status s) {
                           raw->status = std::move(s);
                           raw->done.Notify();
                         });
    calls.push_back(std::move(call));
  }
  // Bob is not held back by Alice.
  EXPECT_TRUE(Call(**server, kBob).ok());
  int ok = 0, refused = 0;
  for (auto& call : calls) {
    call->done.WaitForNotification();
    if (call->status.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(call->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_THAT(call->status.error_message(), HasSubstr("max_inflight_per_client"));
      ++refused;
    }
  }
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(refused, 3);
  EXPECT_TRUE(Call(**server, kAlice).ok());  // Slots come back.
}

}  // namespace
}  // namespace matmul
