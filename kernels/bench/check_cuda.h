// CHECK_CUDA for the benchmarks: a CUDA call that fails prints where, what
// and the error, and ends the program with status 1.
//
//   CHECK_CUDA(cudaMalloc(&p, bytes));
#ifndef MATMUL_KERNELS_BENCH_CHECK_CUDA_H_
#define MATMUL_KERNELS_BENCH_CHECK_CUDA_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/grouped_gemm.h"

#define CHECK_CUDA(expr)                                                                    \
  do {                                                                                      \
    cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                   \
                   ::matmul::cuda::CudaErrorString(e_).c_str());                            \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

#endif  // MATMUL_KERNELS_BENCH_CHECK_CUDA_H_
