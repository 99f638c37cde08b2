#include "kernels/cuda/tf32_layout.h"

namespace matmul::cuda {
namespace {

// Each copy starts on this many bytes of the workspace.
constexpr size_t kCopyAlign = 256;

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// TMA reads rows that start on 16 bytes.
bool RowsAligned(const void* base, int64_t ld) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && (ld * 4) % 16 == 0;
}

}  // namespace

Tf32Copies Tf32CopiesOf(const DeviceGemmProblem& p, bool register_a) {
  if (!register_a) return {p.transpose_a, !p.transpose_b};
  Tf32Copies c;
  c.a = p.transpose_a && !RowsAligned(p.a, p.lda);
  // A B stored k x n beside an A that stays stored k x m (only one of them
  // can be the A that goes through registers) is copied, as is one whose
  // rows do not start on 16 bytes.
  c.b = !p.transpose_b && ((p.transpose_a && !c.a) || !RowsAligned(p.b, p.ldb));
  return c;
}

int64_t Tf32CopyLd(int64_t k) { return static_cast<int64_t>(AlignUp(k * 4, 16) / 4); }

size_t Tf32CopyBytes(int64_t rows, int64_t k) {
  return AlignUp(static_cast<size_t>(rows) * Tf32CopyLd(k) * 4, kCopyAlign);
}

size_t Tf32TransposeBytes(const DeviceGemmProblem& p, bool register_a) {
  const Tf32Copies c = Tf32CopiesOf(p, register_a);
  return (c.a ? Tf32CopyBytes(p.m, p.k) : 0) + (c.b ? Tf32CopyBytes(p.n, p.k) : 0);
}

DeviceGemmProblem Transposed(const DeviceGemmProblem& p) {
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

DeviceGemmProblem Tf32AsRun(const DeviceGemmProblem& p, const Tf32Copies& copies,
                            const float* copy_a, const float* copy_b) {
  DeviceGemmProblem r = p;
  if (copies.a) {
    r.a = copy_a;
    r.lda = Tf32CopyLd(p.k);
    r.transpose_a = false;
  }
  if (copies.b) {
    r.b = copy_b;
    r.ldb = Tf32CopyLd(p.k);
    r.transpose_b = true;
  }
  return r.transpose_b ? r : Transposed(r);
}

}  // namespace matmul::cuda
