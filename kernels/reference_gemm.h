// A float64 reference GEMM and the error measure that every correctness test
// and `matmul-cli --verify` use, plus random operand generation.
//
//   std::mt19937_64 rng(std::random_device{}());
//   std::vector<uint8_t> a = RandomMatrix(DType::kBFloat16, m * k, rng);
//   std::vector<double> ref = ReferenceGemm(problem);
//   double err = RelativeError(ref, problem.d, problem.output_type);
//   // err = ||out - ref|| / ||ref||; +inf when out holds a NaN the reference
//   // does not.
#ifndef MATMUL_KERNELS_REFERENCE_GEMM_H_
#define MATMUL_KERNELS_REFERENCE_GEMM_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/engine.h"

namespace matmul {

// Reads `n` elements of `type` as doubles.
std::vector<double> ToDouble(const void* data, DType type, size_t n);

// Writes doubles as `type` (rounding to nearest even).
void FromDouble(const std::vector<double>& in, DType type, void* out);

// `n` random elements of `type`, uniform in [-1, 1), bytes little-endian.
// Exact zeros are replaced, so no element is 0.
std::vector<uint8_t> RandomMatrix(DType type, size_t n, std::mt19937_64& rng);

// alpha * op(A) * op(B) + beta * C in float64 from the problem's inputs
// (row-major m x n). Reads p.c only when beta != 0.
std::vector<double> ReferenceGemm(const GemmProblem& p);

// ||out - ref||_2 / ||ref||_2 over `ref.size()` elements of `out` (of
// `type`). Returns +infinity when `out` has a NaN or infinity where `ref` is
// finite, and the absolute norm when ||ref|| is 0.
double RelativeError(const std::vector<double>& ref, const void* out, DType type);

// The relative error of `out` (p.output_type, m x n) for problem `p`:
// ||out - ref||_2 / max(||ref||_2, ||scale||_2), where ref is ReferenceGemm
// and scale_ij = sqrt(alpha^2 sum_l (a_il b_lj)^2 + beta^2 c_ij^2), the size
// of the independent terms whose rounding errors add up. For random inputs
// the two norms are alike; the scale only matters when the terms cancel
// (e.g. a 1x1x1 product with alpha*a*b close to -beta*c), where an error
// relative to the tiny ||ref|| would blame the kernel for its inputs'
// rounding.
double GemmRelativeError(const GemmProblem& p, const void* out);

// GemmRelativeError over a grid of output elements drawn at random: about
// `samples` of them, from up to that many distinct rows and columns, each
// with its reference and scale summed in float64 over the whole of K. It
// costs O(samples k) instead of O(m n k): a full check of one 4096^3
// response took 90 s on two cores, which put a benchmark's one check per
// shape past its time limit. Every element where m n <= samples. A fault
// confined to one 128 x 128 tile of a 4096 x 4096 result is missed with
// probability below 1e-3 at samples = 65536.
double SampledGemmRelativeError(const GemmProblem& p, const void* out, size_t samples,
                                std::mt19937_64& rng);

// The bound a correct result of this precision class stays under, for
// inputs in [-1, 1): float64 1e-12, float32 1e-5, TF32 2e-3, 16-bit 1e-2
// (output rounding included).
double ErrorBound(DType input, DType output, Precision precision);

}  // namespace matmul

#endif  // MATMUL_KERNELS_REFERENCE_GEMM_H_
