// Building requests from shapes and checking responses against the float64
// reference; shared by matmul-cli, matmul-bench and the tests.
//
//   std::mt19937_64 rng(std::random_device{}());
//   ProblemSpec spec{.m = 128, .n = 64, .k = 32, .dtype = DType::kBFloat16};
//   v1::MultiplyRequest request = RandomRequest(spec, rng);   // never zeros
//   absl::StatusOr<double> err = CheckResponse(request, response);
#ifndef MATMUL_CLIENT_REQUESTS_H_
#define MATMUL_CLIENT_REQUESTS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "kernels/engine.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul::client {

struct ProblemSpec {
  int64_t m = 1, n = 1, k = 1;
  DType dtype = DType::kFloat32;
  // Unset: the input dtype.
  std::optional<DType> output_dtype;
  Precision precision = Precision::kDefault;
  bool transpose_a = false;
  bool transpose_b = false;
  std::optional<double> alpha;
  // When set and non-zero, a random C is sent too.
  std::optional<double> beta;
  std::string request_id;
  int32_t priority = 0;
};

v1::DType ToWire(DType type);
// std::nullopt for UNSPECIFIED and unknown values.
std::optional<DType> FromWire(v1::DType type);
// Parses "float32", "f32", "bfloat16", "bf16", "float16", "f16", "float64", "f64".
std::optional<DType> ParseDType(absl::string_view name);

// A Matrix message of `rows` x `cols` holding `data`.
v1::Matrix MakeMatrix(uint64_t rows, uint64_t cols, DType type, std::string data);

// A request with fresh random operands (uniform in [-1, 1), no zeros).
v1::MultiplyRequest RandomRequest(const ProblemSpec& spec, std::mt19937_64& rng);

// The engine problem a (well-formed) request describes, pointing into it;
// `d` is left null. INVALID_ARGUMENT when the shapes don't fit together.
absl::StatusOr<GemmProblem> ProblemOf(const v1::MultiplyRequest& request);

// Output elements CheckResponse compares at most (SampledGemmRelativeError):
// every element of results up to 256 x 256, a random grid of larger ones.
inline constexpr size_t kCheckSamples = 65536;

// Checks that `response` carries a result of the right shape and dtype and
// returns its relative error against the float64 reference
// (||out - ref|| / ||ref||), over at most kCheckSamples elements.
absl::StatusOr<double> CheckResponse(const v1::MultiplyRequest& request,
                                     const v1::MultiplyResponse& response);

}  // namespace matmul::client

#endif  // MATMUL_CLIENT_REQUESTS_H_
