// How a TF32 problem reaches the Hopper kernel. TF32 wgmma reads operands
// from shared memory only K-major (A stored m x k, B stored n x k). The
// kernel also takes an A stored k x m, through registers (its consumers
// load wgmma's register fragment from the TMA tile). A B stored k x n (the
// usual row-major layout) it cannot take, but D = A B is also
// D^T = B^T A^T, in which that B is an A stored k x m: the launcher runs the
// problem transposed, with D written transposed (transpose_d). What is left
// (a B stored k x n beside an A stored k x m, and rows that do not start on
// 16 bytes, which TMA cannot read) is copied K-major into the workspace
// before the launch. With `register_a` false every MN-major operand is
// copied (GroupedGemmOptions::hopper_tf32_register_a).
//
//   Tf32Copies c = Tf32CopiesOf(p, /*register_a=*/true);
//   // ... copy p.a (k x m) to copy_a if c.a, p.b (k x n) to copy_b if c.b,
//   // Tf32CopyLd(p.k) floats a row ...
//   DeviceGemmProblem run = Tf32AsRun(p, c, copy_a, copy_b);
//   // run.transpose_b is true: B is K-major.
//
// Host-only code (no CUDA calls): tested without a GPU.
#ifndef MATMUL_KERNELS_CUDA_TF32_LAYOUT_H_
#define MATMUL_KERNELS_CUDA_TF32_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/grouped_gemm.h"

namespace matmul::cuda {

// The operands of a TF32 problem that the launcher copies K-major.
struct Tf32Copies {
  bool a = false;  // A stored k x m, copied to m rows of k.
  bool b = false;  // B stored k x n, copied to n rows of k.
};

Tf32Copies Tf32CopiesOf(const DeviceGemmProblem& p, bool register_a);

// Leading dimension (floats) of the K-major copy of an operand with `k`
// columns: rows padded to 16 bytes.
int64_t Tf32CopyLd(int64_t k);

// Workspace bytes of such a copy of `rows` rows, rounded up so that the
// next copy starts on 256 bytes.
size_t Tf32CopyBytes(int64_t rows, int64_t k);

// Bytes of all of `p`'s copies (0 when none).
size_t Tf32TransposeBytes(const DeviceGemmProblem& p, bool register_a);

// D^T = op(B)^T op(A)^T as a problem: m and n swap, A and B swap with each
// one's storage read the other way round, and D (and C) are stored
// transposed. Transposed(Transposed(p)) is p.
DeviceGemmProblem Transposed(const DeviceGemmProblem& p);

// TF32 problem `p` as the Hopper kernel takes it: the operands that
// `copies` (Tf32CopiesOf(p, either way)) names read from their copies at
// `copy_a` and `copy_b` (null when only sizing: the kernel's alignment
// checks pass for null), and a B still stored k x n read as the A of
// D^T = B^T A^T. The result's B is always K-major.
DeviceGemmProblem Tf32AsRun(const DeviceGemmProblem& p, const Tf32Copies& copies,
                            const float* copy_a, const float* copy_b);

}  // namespace matmul::cuda

#endif  // MATMUL_KERNELS_CUDA_TF32_LAYOUT_H_
