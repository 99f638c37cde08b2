// Host memory copies for staging, spread over a small shared pool of
// threads once a batch's copies are large enough to pay for the hand-off:
// one thread copies about 12-20 GB/s on the GPU hosts (docs/BENCHMARKS.md,
// twenty-fifth round), and a batch of 64 small requests stages about 10 MB
// in and out.
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

// When and how RunCopies spreads its copies.
struct CopyPolicy {
  // Jobs totalling fewer bytes are copied on the calling thread alone.
  size_t parallel_bytes = size_t{512} << 10;
  // Pieces handed out: whole rows, or byte ranges of contiguous jobs, of
  // about this size.
  size_t piece_bytes = size_t{128} << 10;
  // Pool tasks asked for besides the calling thread; -1: as many as the
  // process's copy pool has threads (half the host's cores, at most 8), or
  // none on a host of fewer than four cores. Tasks beyond the pool's
  // threads queue, and any that start after the pieces are gone do nothing.
  int helpers = -1;
};

// Copies every job and returns once all are done. The calling thread
// copies too; pool threads that take part only shorten the wait.
void RunCopies(const std::vector<CopyJob>& jobs, const CopyPolicy& policy = CopyPolicy());

}  // namespace matmul::cuda

#endif  // MATMUL_KERNELS_CUDA_PARALLEL_COPY_H_
