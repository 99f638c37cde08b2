// The launcher's TF32 layouts (tf32_layout.h) on the host, with no GPU:
// for every stored layout of A and B, rows aligned to 16 bytes or not,
// with and without C, and both ways (register_a), the problem as the
// Hopper kernel takes it (copies made as the launcher's transpose kernel
// makes them) computes the same D as the problem as given, in the same
// order of summation, so the two agree exactly; its B is always K-major,
// and copies are made only where Tf32CopiesOf names them.
#include "kernels/cuda/tf32_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace matmul::cuda {
namespace {

// Element (r, c) of a logical rows x cols operand stored at `base` with
// leading dimension `ld`, row-major or (`transposed`) as its transpose.
double At(const void* base, int64_t ld, bool transposed, int64_t r, int64_t c) {
  const float* f = static_cast<const float*>(base);
  return transposed ? f[c * ld + r] : f[r * ld + c];
}

// D = alpha op(A) op(B) + beta C in double, into `out` at the places D is
// stored (transpose_d: D(i, j) at j * ldd + i); C is read the same way.
void Gemm(const DeviceGemmProblem& p, std::vector<double>* out) {
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0;
      for (int64_t q = 0; q < p.k; ++q) {
        sum += At(p.a, p.lda, p.transpose_a, i, q) * At(p.b, p.ldb, p.transpose_b, q, j);
      }
      const int64_t at = p.transpose_d ? j * p.ldd + i : i * p.ldd + j;
      double v = p.alpha * sum;
      if (p.beta != 0) v += p.beta * static_cast<const float*>(p.c)[p.transpose_d ? j * p.ldc + i : i * p.ldc + j];
      (*out)[at] = v;
    }
  }
}

// The launcher's copy (LaunchTransposes32's job): a `rows` x `cols` matrix
// stored with leading dimension `ld` into `cols` rows of Tf32CopyLd(rows).
std::vector<float> CopyKMajor(const void* stored, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t ldo = Tf32CopyLd(rows);
  std::vector<float> out(static_cast<size_t>(cols * ldo) + 4, -1.0f);
  const float* in = static_cast<const float*>(stored);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * ldo + r] = in[r * ld + c];
  }
  return out;
}

bool RowsAligned(const void* base, int64_t ld) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && (ld * 4) % 16 == 0;
}

// A float buffer of `n` random values starting `offset` floats past a
// 16-byte boundary.
struct Buffer {
  Buffer(size_t n, int offset, std::mt19937_64& rng) : storage(n + 8) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (float& f : storage) f = value(rng);
    const uintptr_t base = reinterpret_cast<uintptr_t>(storage.data());
    data = storage.data() + ((16 - base % 16) % 16) / 4 + offset;
  }
  std::vector<float> storage;
  float* data;
};

TEST(Tf32LayoutTest, EveryLayoutComputesTheSameD) {
  std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int64_t> dim(1, 9);
  int cases = 0;
  for (int layout = 0; layout < 4; ++layout) {
    for (int misalign = 0; misalign < 4; ++misalign) {  // bit 0: A's rows, bit 1: B's.
      for (bool with_c : {false, true}) {
        for (bool register_a : {true, false}) {
          DeviceGemmProblem p;
          p.m = dim(rng);
          p.n = dim(rng);
          p.k = dim(rng);
          p.transpose_a = layout & 1;
          p.transpose_b = layout & 2;
          // Aligned rows: a multiple of 4 floats; else one more than that.
          auto ld = [&](int64_t cols, bool odd) { return (cols + 3) / 4 * 4 + (odd ? 1 : 0); };
          p.lda = ld(p.transpose_a ? p.m : p.k, misalign & 1);
          p.ldb = ld(p.transpose_b ? p.k : p.n, misalign & 2);
          p.ldc = p.ldd = p.n;
          Buffer a((p.transpose_a ? p.k : p.m) * p.lda, 0, rng);
          Buffer b((p.transpose_b ? p.n : p.k) * p.ldb, 0, rng);
          Buffer c(p.m * p.n, 0, rng);
          p.a = a.data;
          p.b = b.data;
          p.c = c.data;
          p.alpha = 1.25;
          p.beta = with_c ? -0.5 : 0.0;
          const std::string what = ::testing::PrintToString(
              std::vector<int64_t>{p.m, p.n, p.k, layout, misalign, with_c, register_a});

          const Tf32Copies copies = Tf32CopiesOf(p, register_a);
          std::vector<float> copy_a, copy_b;
          if (copies.a) copy_a = CopyKMajor(p.a, p.k, p.m, p.lda);
          if (copies.b) copy_b = CopyKMajor(p.b, p.k, p.n, p.ldb);
          const DeviceGemmProblem run =
              Tf32AsRun(p, copies, copies.a ? copy_a.data() : nullptr,
                        copies.b ? copy_b.data() : nullptr);

          // The kernel's constraints.
          EXPECT_TRUE(run.transpose_b) << what << ": B must be K-major";
          if (!register_a) {
            EXPECT_FALSE(run.transpose_a) << what;
            EXPECT_FALSE(run.transpose_d) << what;
            EXPECT_EQ(copies.a, p.transpose_a) << what;
            EXPECT_EQ(copies.b, !p.transpose_b) << what;
          } else {
            // An A read through registers has aligned rows; aligned
            // operands are copied only for a B stored k x n beside an A
            // stored k x m.
            if (run.transpose_a) EXPECT_TRUE(RowsAligned(run.a, run.lda)) << what;
            if (misalign == 0) {
              EXPECT_FALSE(copies.a) << what;
              EXPECT_EQ(copies.b, p.transpose_a && !p.transpose_b) << what;
            }
          }
          if (copies.a) EXPECT_TRUE(RowsAligned(copy_a.data(), Tf32CopyLd(p.k))) << what;
          EXPECT_EQ(Tf32TransposeBytes(p, register_a),
                    (copies.a ? Tf32CopyBytes(p.m, p.k) : 0) +
                        (copies.b ? Tf32CopyBytes(p.n, p.k) : 0))
              << what;
          if (copies.a) EXPECT_GE(Tf32CopyBytes(p.m, p.k), copy_a.size() * 4 - 16) << what;

          // The same D, element for element.
          std::vector<double> want(p.m * p.ldd, 0.0), got(p.m * p.ldd, 0.0);
          Gemm(p, &want);
          Gemm(run, &got);
          EXPECT_EQ(got, want) << what;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 4 * 2 * 2);
}

TEST(Tf32LayoutTest, TransposedTwiceIsTheProblem) {
  DeviceGemmProblem p;
  p.m = 3, p.n = 5, p.k = 7, p.lda = 8, p.ldb = 12, p.ldc = 5, p.ldd = 6;
  float x = 0;
  p.a = &x, p.b = &x + 1, p.c = &x + 2, p.d = &x + 3;
  p.transpose_a = true;
  const DeviceGemmProblem t = Transposed(p);
  EXPECT_EQ(t.m, 5);
  EXPECT_EQ(t.n, 3);
  EXPECT_EQ(t.a, p.b);
  EXPECT_EQ(t.lda, 12);
  EXPECT_TRUE(t.transpose_a);   // B stored k x n: an A stored k x m.
  EXPECT_FALSE(t.transpose_b);  // A stored k x m: a B stored k x n.
  EXPECT_TRUE(t.transpose_d);
  const DeviceGemmProblem back = Transposed(t);
  EXPECT_EQ(back.m, p.m);
  EXPECT_EQ(back.n, p.n);
  EXPECT_EQ(back.a, p.a);
  EXPECT_EQ(back.b, p.b);
  EXPECT_EQ(back.lda, p.lda);
  EXPECT_EQ(back.ldb, p.ldb);
  EXPECT_EQ(back.transpose_a, p.transpose_a);
  EXPECT_EQ(back.transpose_b, p.transpose_b);
  EXPECT_EQ(back.transpose_d, p.transpose_d);
  EXPECT_EQ(back.c, p.c);
  EXPECT_EQ(back.d, p.d);
}

// Every field of two problems equal (their padding is not compared).
bool SameProblem(const DeviceGemmProblem& x, const DeviceGemmProblem& y) {
  static_assert(sizeof(DeviceGemmProblem) == 112, "compare the new field too");
  return x.m == y.m && x.n == y.n && x.k == y.k && x.lda == y.lda && x.ldb == y.ldb &&
         x.ldc == y.ldc && x.ldd == y.ldd && x.a == y.a && x.b == y.b && x.c == y.c && x.d == y.d &&
         x.alpha == y.alpha && x.beta == y.beta && x.transpose_a == y.transpose_a &&
         x.transpose_b == y.transpose_b && x.transpose_d == y.transpose_d;
}

// Tf32AsRun builds the problem field for field as the copies-then-transpose
// definition does, and the plan's shortcut (Tf32RunShapeOf) gives its rows,
// columns and row alignment, for random layouts, sizes,
// base addresses and leading dimensions, both ways, with copies at null
// (as the plan sizes them) or in a workspace.
TEST(Tf32LayoutTest, RunShapeMatchesTheProblemAsRun) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<int64_t> dim(1, 5000), pad(0, 9), offset(0, 7);
  auto aligned = [](const DeviceGemmProblem& r) {
    return ((reinterpret_cast<uintptr_t>(r.a) | reinterpret_cast<uintptr_t>(r.b) |
             static_cast<uintptr_t>(r.lda * 4) | static_cast<uintptr_t>(r.ldb * 4)) & 15) == 0;
  };
  for (int i = 0; i < 20000; ++i) {
    DeviceGemmProblem p;
    p.m = dim(rng);
    p.n = dim(rng);
    p.k = dim(rng);
    p.transpose_a = rng() & 1;
    p.transpose_b = rng() & 1;
    p.lda = (p.transpose_a ? p.m : p.k) + pad(rng);
    p.ldb = (p.transpose_b ? p.k : p.n) + pad(rng);
    p.ldc = p.n + pad(rng);
    p.ldd = p.n + pad(rng);
    p.c = reinterpret_cast<const void*>(uintptr_t{1 << 26} + 4 * offset(rng));
    p.d = reinterpret_cast<void*>(uintptr_t{1 << 28} + 4 * offset(rng));
    p.alpha = 1.0 + static_cast<double>(offset(rng));
    p.beta = -static_cast<double>(offset(rng));
    p.transpose_d = rng() & 1;
    p.a = reinterpret_cast<const void*>(uintptr_t{1 << 20} + 4 * offset(rng));
    p.b = reinterpret_cast<const void*>(uintptr_t{1 << 24} + 4 * offset(rng));
    const bool register_a = rng() & 1;
    const Tf32Copies copies = Tf32CopiesOf(p, register_a);
    const float* workspace = reinterpret_cast<const float*>(uintptr_t{1} << 30);
    for (const float* copy : {static_cast<const float*>(nullptr), workspace}) {
      const DeviceGemmProblem run = Tf32AsRun(p, copies, copy, copy);
      // The problem as run, built the way Tf32AsRun was defined before it
      // wrote each field once: the copies, then Transposed where B is
      // still stored k x n. Every field must agree.
      DeviceGemmProblem expected = p;
      if (copies.a) {
        expected.a = copy;
        expected.lda = Tf32CopyLd(p.k);
        expected.transpose_a = false;
      }
      if (copies.b) {
        expected.b = copy;
        expected.ldb = Tf32CopyLd(p.k);
        expected.transpose_b = true;
      }
      if (!expected.transpose_b) expected = Transposed(expected);
      ASSERT_TRUE(SameProblem(run, expected)) << "problem " << i;
      const Tf32RunShape shape = Tf32RunShapeOf(p, copies);
      ASSERT_EQ(shape.m, run.m) << "problem " << i;
      ASSERT_EQ(shape.n, run.n) << "problem " << i;
      ASSERT_EQ(shape.rows_aligned, aligned(run)) << "problem " << i;
    }
  }
}

}  // namespace
}  // namespace matmul::cuda
