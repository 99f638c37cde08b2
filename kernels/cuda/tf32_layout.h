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
// Host-only code (no CUDA calls), all inline: tested without a GPU.
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

// These are inline: the launcher calls them for every problem of a TF32
// batch, several times, and as calls returning 112-byte problems by value
// they were most of its plan for 1,024 problems (docs/BENCHMARKS.md,
// twenty-fifth round).

namespace tf32_internal {
// Each copy starts on this many bytes of the workspace.
inline constexpr size_t kCopyAlign = 256;
inline size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }
// TMA reads rows that start on 16 bytes.
inline bool RowsAligned(const void* base, int64_t ld) {
  return ((reinterpret_cast<uintptr_t>(base) | static_cast<uintptr_t>(ld * 4)) & 15) == 0;
}
}  // namespace tf32_internal

inline Tf32Copies Tf32CopiesOf(const DeviceGemmProblem& p, bool register_a) {
  if (!register_a) return {p.transpose_a, !p.transpose_b};
  Tf32Copies c;
  c.a = p.transpose_a && !tf32_internal::RowsAligned(p.a, p.lda);
  // A B stored k x n beside an A that stays stored k x m (only one of them
  // can be the A that goes through registers) is copied, as is one whose
  // rows do not start on 16 bytes.
  c.b = !p.transpose_b && ((p.transpose_a && !c.a) || !tf32_internal::RowsAligned(p.b, p.ldb));
  return c;
}

// Leading dimension (floats) of the K-major copy of an operand with `k`
// columns: rows padded to 16 bytes.
inline int64_t Tf32CopyLd(int64_t k) {
  return static_cast<int64_t>(tf32_internal::AlignUp(k * 4, 16) / 4);
}

// Workspace bytes of such a copy of `rows` rows, rounded up so that the
// next copy starts on 256 bytes.
inline size_t Tf32CopyBytes(int64_t rows, int64_t k) {
  return tf32_internal::AlignUp(static_cast<size_t>(rows) * Tf32CopyLd(k) * 4,
                                tf32_internal::kCopyAlign);
}

// Bytes of the copies `c` (Tf32CopiesOf(p, ...)) names (0 when none).
inline size_t Tf32TransposeBytes(const DeviceGemmProblem& p, const Tf32Copies& c) {
  return (c.a ? Tf32CopyBytes(p.m, p.k) : 0) + (c.b ? Tf32CopyBytes(p.n, p.k) : 0);
}

// Bytes of all of `p`'s copies (0 when none).
inline size_t Tf32TransposeBytes(const DeviceGemmProblem& p, bool register_a) {
  return Tf32TransposeBytes(p, Tf32CopiesOf(p, register_a));
}

// D^T = op(B)^T op(A)^T as a problem: m and n swap, A and B swap with each
// one's storage read the other way round, and D (and C) are stored
// transposed. Transposed(Transposed(p)) is p.
inline DeviceGemmProblem Transposed(const DeviceGemmProblem& p) {
  DeviceGemmProblem t = p;
  t.m = p.n;
  t.n = p.m;
  t.a = p.b;
  t.lda = p.ldb;
  t.transpose_a = !p.transpose_b;  // B stored k x n: an A stored k x m.
  t.b = p.a;
  t.ldb = p.lda;
  t.transpose_b = !p.transpose_a;  // A stored m x k: a B stored n x k.
  t.transpose_d = !p.transpose_d;
  return t;
}

// TF32 problem `p` as the Hopper kernel takes it, written into `*run`
// field by field: the operands that `copies` (Tf32CopiesOf(p, either way))
// names read from their copies at `copy_a` and `copy_b` (null when only
// sizing: the kernel's alignment checks pass for null), and a B still
// stored k x n read as the A of D^T = B^T A^T (Transposed). The result's B
// is always K-major. (Built as a copy of `p` with bytes then written into
// it and the whole copied again, a problem cost the launcher a stalled
// load per field written: 16 ns each, most of a 1,024-problem TF32 plan.)
inline void Tf32AsRunInto(const DeviceGemmProblem& p, const Tf32Copies& copies,
                          const float* copy_a, const float* copy_b, DeviceGemmProblem* run) {
  static_assert(sizeof(DeviceGemmProblem) == 112, "write the new field below too");
  const void* a = copies.a ? copy_a : p.a;
  const int64_t lda = copies.a ? Tf32CopyLd(p.k) : p.lda;
  const bool transpose_a = copies.a ? false : p.transpose_a;
  const void* b = copies.b ? copy_b : p.b;
  const int64_t ldb = copies.b ? Tf32CopyLd(p.k) : p.ldb;
  const bool transpose_b = copies.b ? true : p.transpose_b;
  const bool transposed = !transpose_b;
  run->m = transposed ? p.n : p.m;
  run->n = transposed ? p.m : p.n;
  run->k = p.k;
  run->a = transposed ? b : a;
  run->lda = transposed ? ldb : lda;
  run->transpose_a = transposed ? !transpose_b : transpose_a;
  run->b = transposed ? a : b;
  run->ldb = transposed ? lda : ldb;
  run->transpose_b = transposed ? !transpose_a : transpose_b;
  run->c = p.c;
  run->ldc = p.ldc;
  run->d = p.d;
  run->ldd = p.ldd;
  run->alpha = p.alpha;
  run->beta = p.beta;
  run->transpose_d = transposed ? !p.transpose_d : p.transpose_d;
}

// Tf32AsRunInto, returned.
inline DeviceGemmProblem Tf32AsRun(const DeviceGemmProblem& p, const Tf32Copies& copies,
                                   const float* copy_a, const float* copy_b) {
  DeviceGemmProblem run;
  Tf32AsRunInto(p, copies, copy_a, copy_b, &run);
  return run;
}

// What the launcher's plan needs of Tf32AsRun(p, copies, ...) for sizing,
// without building it: its rows and columns (swapped when it runs
// transposed) and whether its operands' rows start on 16 bytes (copies
// always do). Tf32AsRun's alignment check reads A and B alike, so which of
// them ends up as the kernel's A does not matter.
struct Tf32RunShape {
  int64_t m = 0, n = 0;
  bool rows_aligned = false;
};

inline Tf32RunShape Tf32RunShapeOf(const DeviceGemmProblem& p, const Tf32Copies& copies) {
  const bool transposed = !copies.b && !p.transpose_b;
  Tf32RunShape s;
  s.m = transposed ? p.n : p.m;
  s.n = transposed ? p.m : p.n;
  s.rows_aligned = (copies.a || tf32_internal::RowsAligned(p.a, p.lda)) &&
                   (copies.b || tf32_internal::RowsAligned(p.b, p.ldb));
  return s;
}

}  // namespace matmul::cuda

#endif  // MATMUL_KERNELS_CUDA_TF32_LAYOUT_H_
