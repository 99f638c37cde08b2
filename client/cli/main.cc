// matmul-cli: call a matmul-server from the shell.
//
//   matmul-cli info --target=localhost:50051
//   matmul-cli multiply --m=512 --n=512 --k=512 --dtype=bf16 --verify
//   matmul-cli multiply --a=a.npy --b=b.npy --out=c.npy
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/matmul_client.h"
#include "client/npy.h"
#include "client/requests.h"
#include "kernels/reference_gemm.h"

ABSL_FLAG(std::string, target, "localhost:50051", "Server address (any gRPC target).");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle to verify the server with; turns TLS on.");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "", "Name expected in the server's certificate, if not the target's host.");
ABSL_FLAG(std::string, token_file, "", "File holding a bearer token to send with every call.");
ABSL_FLAG(double, timeout_s, 0, "Deadline per call in seconds; 0 means none.");
ABSL_FLAG(int64_t, m, 256, "Rows of op(A) and of the result (random inputs).");
ABSL_FLAG(int64_t, n, 256, "Columns of op(B) and of the result (random inputs).");
ABSL_FLAG(int64_t, k, 256, "Inner dimension (random inputs).");
ABSL_FLAG(std::string, dtype, "float32", "Input dtype: float32, float64, float16, bfloat16.");
ABSL_FLAG(std::string, output_dtype, "", "Result dtype; empty means the input dtype.");
ABSL_FLAG(bool, tf32, false, "Allow TF32 tensor cores for float32 inputs.");
ABSL_FLAG(bool, transpose_a, false, "Multiply by A transposed.");
ABSL_FLAG(bool, transpose_b, false, "Multiply by B transposed.");
ABSL_FLAG(double, alpha, 1.0, "Scale of op(A)*op(B).");
ABSL_FLAG(double, beta, 0.0, "Scale of C (a random C, or --c).");
ABSL_FLAG(std::string, a, "", "A from a .npy file (<f4, <f8, <f2, or <u2 = bfloat16 bits).");
ABSL_FLAG(std::string, b, "", "B from a .npy file.");
ABSL_FLAG(std::string, c, "", "C from a .npy file (used with --beta).");
ABSL_FLAG(std::string, out, "", "Write the result to this .npy file.");
ABSL_FLAG(bool, verify, false, "Check the result against a float64 reference computed here.");
ABSL_FLAG(int, repeat, 1, "Send the request this many times.");
ABSL_FLAG(int, priority, 0, "Request priority (higher first).");

namespace {

using matmul::DType;
namespace client = matmul::client;
namespace v1 = matmul::v1;

int Fail(const std::string& message) {
  std::cerr << "matmul-cli: " << message << "\n";
  return 1;
}

int Info(const client::MatmulClient& c) {
  absl::StatusOr<v1::ServerInfo> info = c.GetServerInfo();
  if (!info.ok()) return Fail(std::string(info.status().ToString()));
  std::cout << info->DebugString();
  return 0;
}

absl::StatusOr<v1::MultiplyRequest> BuildRequest() {
  const std::optional<DType> dtype = client::ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.has_value()) {
    return absl::InvalidArgumentError("--dtype must be float32, float64, float16 or bfloat16");
  }
  client::ProblemSpec spec;
  spec.dtype = *dtype;
  if (!absl::GetFlag(FLAGS_output_dtype).empty()) {
    spec.output_dtype = client::ParseDType(absl::GetFlag(FLAGS_output_dtype));
    if (!spec.output_dtype.has_value()) return absl::InvalidArgumentError("bad --output_dtype");
  }
  spec.precision = absl::GetFlag(FLAGS_tf32) ? matmul::Precision::kTF32 : matmul::Precision::kDefault;
  spec.transpose_a = absl::GetFlag(FLAGS_transpose_a);
  spec.transpose_b = absl::GetFlag(FLAGS_transpose_b);
  spec.m = absl::GetFlag(FLAGS_m);
  spec.n = absl::GetFlag(FLAGS_n);
  spec.k = absl::GetFlag(FLAGS_k);
  for (auto [name, value] : {std::pair{"m", spec.m}, {"n", spec.n}, {"k", spec.k}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " must be at least 1, got ", value));
    }
  }
  spec.alpha = absl::GetFlag(FLAGS_alpha);
  spec.beta = absl::GetFlag(FLAGS_beta);
  spec.priority = absl::GetFlag(FLAGS_priority);
  spec.request_id = "matmul-cli";
  std::mt19937_64 rng(std::random_device{}());
  v1::MultiplyRequest request = client::RandomRequest(spec, rng);
  // Operands from files replace the random ones.
  for (auto [path, matrix] : {std::pair{absl::GetFlag(FLAGS_a), &v1::MultiplyRequest::mutable_a},
                              std::pair{absl::GetFlag(FLAGS_b), &v1::MultiplyRequest::mutable_b},
                              std::pair{absl::GetFlag(FLAGS_c), &v1::MultiplyRequest::mutable_c}}) {
    if (path.empty()) continue;
    absl::StatusOr<client::NpyMatrix> npy = client::ReadNpy(path);
    if (!npy.ok()) return npy.status();
    *(request.*matrix)() = client::MakeMatrix(npy->rows, npy->cols,
                                              *client::DTypeOfDescr(npy->descr),
                                              std::move(npy->data));
  }
  return request;
}

int Multiply(const client::MatmulClient& c) {
  absl::StatusOr<v1::MultiplyRequest> request = BuildRequest();
  if (!request.ok()) return Fail(std::string(request.status().message()));
  const int repeat = std::max(1, absl::GetFlag(FLAGS_repeat));
  v1::MultiplyResponse response;
  for (int i = 0; i < repeat; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::MultiplyResponse> r = c.Multiply(*request);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (!r.ok()) return Fail(std::string(r.status().ToString()));
    response = *std::move(r);
    const v1::Timing& t = response.timing();
    std::cout << absl::StrFormat(
        "result %dx%d %s: round trip %.3f ms; server total %.3f ms, queue %.3f ms, compute "
        "%.3f ms, batch of %d on %s\n",
        response.c().rows(), response.c().cols(), v1::DType_Name(response.c().dtype()), ms,
        t.total_us() / 1e3, t.queue_us() / 1e3, t.compute_us() / 1e3, t.batch_size(), t.device());
  }
  if (!absl::GetFlag(FLAGS_out).empty()) {
    const std::optional<DType> out = client::FromWire(response.c().dtype());
    absl::Status s = client::WriteNpy(
        absl::GetFlag(FLAGS_out), {.rows = response.c().rows(), .cols = response.c().cols(),
                                   .descr = client::NpyDescr(*out), .data = response.c().data()});
    if (!s.ok()) return Fail(std::string(s.message()));
  }
  if (absl::GetFlag(FLAGS_verify)) {
    absl::StatusOr<double> err = client::CheckResponse(*request, response);
    if (!err.ok()) return Fail(std::string(err.status().message()));
    absl::StatusOr<matmul::GemmProblem> p = client::ProblemOf(*request);
    const double bound = matmul::ErrorBound(p->input_type, p->output_type, p->precision);
    std::cout << absl::StrFormat("relative error %.3g (bound %.0e): %s\n", *err, bound,
                                 *err <= bound ? "OK" : "TOO LARGE");
    if (!(*err <= bound)) return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --help lists the flags of this file (absl's default looks for a file
  // named after the program, and none is). absl hands the filter each
  // flag's file without its leading slashes.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    absl::string_view self = __FILE__;
    self.remove_prefix(std::min(self.find_first_not_of('/'), self.size()));
    return file == self;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "matmul-cli <info|multiply> [flags]: call a matmul-server.\n"
      "  info       print the server's GetServerInfo answer\n"
      "  multiply   send a multiply (random or .npy operands) and print its timing");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) return Fail("expected one command: info or multiply (see --help)");
  client::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  absl::Status security = client::ApplySecurityFlags(
      absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
      absl::GetFlag(FLAGS_tls_server_name), absl::GetFlag(FLAGS_token_file), &options);
  if (!security.ok()) return Fail(std::string(security.message()));
  absl::StatusOr<std::unique_ptr<client::MatmulClient>> c = client::MatmulClient::Create(options);
  if (!c.ok()) return Fail(std::string(c.status().message()));
  const std::string command = args[1];
  if (command == "info") return Info(**c);
  if (command == "multiply") return Multiply(**c);
  return Fail("unknown command \"" + command + "\" (expected info or multiply)");
}
