// Host memory copies for staging, spread over a small shared pool of
// threads when they are large: one thread copies about 5-10 GB/s, a batch of
// big operands needs several.
//
//   std::vector<CopyJob> jobs = {{dst, dst_pitch, src, src_pitch, row_bytes, rows}};
//   RunCopies(jobs);   // returns when every copy is done
#ifndef MATMUL_KERNELS_CUDA_PARALLEL_COPY_H_
#define MATMUL_KERNELS_CUDA_PARALLEL_COPY_H_

#include <cstddef>
#include <vector>

namespace matmul::cuda {

// `rows` rows of `row_bytes` each, between row pitches in bytes.
struct CopyJob {
  void* dst;
  size_t dst_pitch;
  const void* src;
  size_t src_pitch;
  size_t row_bytes;
  size_t rows;
};

void RunCopies(const std::vector<CopyJob>& jobs);

}  // namespace matmul::cuda

#endif  // MATMUL_KERNELS_CUDA_PARALLEL_COPY_H_
