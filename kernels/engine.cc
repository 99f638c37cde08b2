#include "kernels/engine.h"

namespace matmul {

uint64_t ProblemBytes(const GemmProblem& p) {
  const uint64_t in = ElementSize(p.input_type);
  const uint64_t out = ElementSize(p.output_type);
  const uint64_t m = p.m, n = p.n, k = p.k;
  uint64_t bytes = (m * k + k * n) * in + m * n * out;
  if (p.beta != 0.0) bytes += m * n * out;
  return bytes;
}

}  // namespace matmul
