// The SIMT grouped GEMM: a persistent kernel on plain FMA units (FFMA for
// float32 and the 16-bit types, DFMA for float64). It takes any alignment,
// any leading dimension and every dtype, so it is the exact-float32/float64
// engine for small problems and the fallback for what the Hopper kernel
// cannot take. 64 x 64 output tiles, 256 threads of 4 x 4 outputs each, a
// K-slab of 16 staged in shared memory (double-buffered through registers).
// Float32 launches with enough work take 128 x 128 tiles instead, 8 x 8
// outputs a thread read from shared memory as float4 (SimtWideGemm): with
// 4 x 4, two shared loads feed each FMA pair and the kernel ran at about a
// third of cuBLAS's SGEMM on an H100; the wide tiles, whose fetches are
// copied straight to shared memory, run at 0.82-0.89x (docs/BENCHMARKS.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/kernels.h"
#include "kernels/cuda/tile_counters.cuh"

namespace matmul::cuda {
namespace {

constexpr int kTile = kSimtTile;  // 64
constexpr int kBK = 16;
constexpr int kThreads = 256;

__device__ __forceinline__ float ToAcc(float v, float) { return v; }
__device__ __forceinline__ double ToAcc(double v, double) { return v; }
__device__ __forceinline__ float ToAcc(__nv_bfloat16 v, float) { return __bfloat162float(v); }
__device__ __forceinline__ float ToAcc(__half v, float) { return __half2float(v); }

template <typename TIn, typename TAcc>
__device__ __forceinline__ TAcc LoadA(const DeviceGemmProblem& p, int64_t i, int64_t l) {
  if (i >= p.m || l >= p.k) return TAcc(0);
  const TIn* a = static_cast<const TIn*>(p.a);
  return ToAcc(p.transpose_a ? a[l * p.lda + i] : a[i * p.lda + l], TAcc(0));
}

template <typename TIn, typename TAcc>
__device__ __forceinline__ TAcc LoadB(const DeviceGemmProblem& p, int64_t l, int64_t j) {
  if (j >= p.n || l >= p.k) return TAcc(0);
  const TIn* b = static_cast<const TIn*>(p.b);
  return ToAcc(p.transpose_b ? b[j * p.ldb + l] : b[l * p.ldb + j], TAcc(0));
}

template <typename TOut, typename TAcc>
__device__ __forceinline__ TAcc LoadOut(const TOut* c) {
  if constexpr (std::is_same_v<TOut, __nv_bfloat16>) return __bfloat162float(*c);
  else if constexpr (std::is_same_v<TOut, __half>) return __half2float(*c);
  else return static_cast<TAcc>(*c);
}

template <typename TOut, typename TAcc>
__device__ __forceinline__ void StoreOut(TOut* d, TAcc v) {
  if constexpr (std::is_same_v<TOut, __nv_bfloat16>) *d = __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<TOut, __half>) *d = __float2half_rn(static_cast<float>(v));
  else *d = static_cast<TOut>(v);
}

// Which problem holds global tile `tile` (tile_offsets: each problem's
// first tile, ascending).
__device__ __forceinline__ int ProblemOf(const SimtLaunch& l, int tile) {
  int lo = 0, hi = l.num_problems - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (l.tile_offsets[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// A block's tiles in the persistent kernels, claimed from the launch's
// counter (one atomicAdd a tile), so that blocks that finish early take
// more and blocks that start late (more blocks than fit the GPU at once)
// take what is left. (With a fixed stride the persistent grid ran 2-6%
// slower than one block a tile on large float32 problems, H100.) Thread 0
// claims the next tile as the block starts a tile; the claim reaches the
// other threads through that tile's barriers, in one of two shared slots
// (a slot is written again two tiles later, once every thread has passed
// the barriers of the tile between). Without a counter a block's tiles are
// its index and then every grid-th tile.
class TileClaims {
 public:
  __device__ TileClaims(const SimtLaunch& l, int (&slots)[2])
      : counter_(l.tile_counter), slots_(slots) {}

  // The block's first tile (every thread of the block calls this).
  __device__ int First() {
    if (counter_ == nullptr) return static_cast<int>(blockIdx.x);
    if (threadIdx.x == 0) slots_[1] = static_cast<int>(atomicAdd(counter_, 1u));
    __syncthreads();
    return slots_[1];
  }

  // Claims the tile after `tile`, the block's i-th (from 0); Next(i) reads
  // it once the block has passed a barrier.
  __device__ void Claim(int i, int tile) {
    if (threadIdx.x != 0) return;
    slots_[i & 1] = counter_ != nullptr ? static_cast<int>(atomicAdd(counter_, 1u))
                                        : tile + static_cast<int>(gridDim.x);
  }
  __device__ int Next(int i) const { return slots_[i & 1]; }

  // After the block's last claim: the last block to finish claiming sets
  // the counters back to zero for the next launch (CountOutOfTileClaims).
  __device__ void Done() {
    if (threadIdx.x != 0 || counter_ == nullptr) return;
    CountOutOfTileClaims(counter_);
  }

 private:
  unsigned int* counter_;  // Claims, then blocks done; null without claims.
  int (&slots_)[2];        // Claimed tiles, shared by the block.
};

// Runs body(tile) for each tile of the block, in order (TileClaims), and
// counts the block out at the end. `slots`: two ints of the block's shared
// memory; `total`: the launch's tiles (l.total_tiles, unless a kernel cuts
// its own). The body must pass at least one barrier of the whole block.
template <typename Body>
__device__ __forceinline__ void ForEachTile(const SimtLaunch& l, int total, int (&slots)[2],
                                            Body&& body) {
  TileClaims claims(l, slots);
  for (int tile = claims.First(), i = 0; tile < total; tile = claims.Next(i++)) {
    claims.Claim(i, tile);
    body(tile);
  }
  claims.Done();
}

// Row (or column) of a thread's output `i`, the thread at `t` (0-15) of its
// 16 x 16 grid: 4 x 4 outputs a thread (64 x 64 tiles) lie 16 apart; 8 x 8
// (SimtWideGemm's 128 x 128 tiles) lie in two groups of four, 64 apart, so
// that each group is one float4 in shared memory.
template <int kPerThread>
__device__ __forceinline__ int OutputIndex(int t, int i) {
  if constexpr (kPerThread == 4) {
    return t + 16 * i;
  } else {
    static_assert(kPerThread == 8, "4 x 4 or 8 x 8 outputs a thread");
    return (i >> 2) * 64 + t * 4 + (i & 3);
  }
}

// D = alpha acc + beta C for the kPerThread x kPerThread outputs of the
// thread at (tx, ty) of the 16 x 16 grid, in the tile at (row0, col0).
template <typename TOut, typename TAcc, int kPerThread>
__device__ void Epilogue(const DeviceGemmProblem& p, const TAcc (&acc)[kPerThread][kPerThread],
                         int64_t row0, int64_t col0, int tx, int ty) {
  const TAcc alpha = static_cast<TAcc>(p.alpha);
  const TAcc beta = static_cast<TAcc>(p.beta);
  TOut* d = static_cast<TOut*>(p.d);
  const TOut* c = static_cast<const TOut*>(p.c);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t row = row0 + OutputIndex<kPerThread>(ty, i);
    if (row >= p.m) continue;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t col = col0 + OutputIndex<kPerThread>(tx, j);
      if (col >= p.n) continue;
      TAcc v = alpha * acc[i][j];
      if (p.beta != 0.0) v += beta * LoadOut<TOut, TAcc>(c + row * p.ldc + col);
      StoreOut<TOut, TAcc>(d + row * p.ldd + col, v);
    }
  }
}

template <typename TIn, typename TAcc>
__global__ void __launch_bounds__(kThreads) SimtGroupedGemm(SimtLaunch l) {
  __shared__ TAcc as[2][kBK][kTile + 1];
  __shared__ TAcc bs[2][kBK][kTile + 1];
  __shared__ int claimed[2];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  ForEachTile(l, l.total_tiles, claimed, [&](int tile) {
    const int problem = ProblemOf(l, tile);
    const DeviceGemmProblem p = l.problems[problem];
    const int local = tile - l.tile_offsets[problem];
    const int tiles_n = static_cast<int>((p.n + kTile - 1) / kTile);
    const int64_t row0 = static_cast<int64_t>(local / tiles_n) * kTile;
    const int64_t col0 = static_cast<int64_t>(local % tiles_n) * kTile;

    TAcc acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = TAcc(0);

    // Each thread stages 4 elements of A (64 x 16) and 4 of B (16 x 64).
    // Thread mapping follows the contiguous dimension for coalescing.
    TAcc ra[4], rb[4];
    auto fetch = [&](int64_t k0) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int idx = threadIdx.x + e * kThreads;  // 0..1023
        // A: contiguous along k when not transposed, along m otherwise.
        const int ai = p.transpose_a ? idx % kTile : idx / kBK;
        const int al = p.transpose_a ? idx / kTile : idx % kBK;
        ra[e] = LoadA<TIn, TAcc>(p, row0 + ai, k0 + al);
        // B: contiguous along n when not transposed, along k otherwise.
        const int bl = p.transpose_b ? idx % kBK : idx / kTile;
        const int bj = p.transpose_b ? idx / kBK : idx % kTile;
        rb[e] = LoadB<TIn, TAcc>(p, k0 + bl, col0 + bj);
      }
    };
    auto stash = [&](int buf) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int idx = threadIdx.x + e * kThreads;
        const int ai = p.transpose_a ? idx % kTile : idx / kBK;
        const int al = p.transpose_a ? idx / kTile : idx % kBK;
        as[buf][al][ai] = ra[e];
        const int bl = p.transpose_b ? idx % kBK : idx / kTile;
        const int bj = p.transpose_b ? idx / kBK : idx % kTile;
        bs[buf][bl][bj] = rb[e];
      }
    };

    const int64_t kblocks = (p.k + kBK - 1) / kBK;
    fetch(0);
    stash(0);
    __syncthreads();
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      const int buf = static_cast<int>(kb & 1);
      if (kb + 1 < kblocks) fetch((kb + 1) * kBK);
#pragma unroll
      for (int l2 = 0; l2 < kBK; ++l2) {
        TAcc a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = as[buf][l2][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = bs[buf][l2][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
      }
      if (kb + 1 < kblocks) stash(buf ^ 1);
      __syncthreads();
    }

    switch (l.output) {
      case DType::kFloat64:
        if constexpr (std::is_same_v<TAcc, double>) {
          Epilogue<double, TAcc>(p, acc, row0, col0, tx, ty);
        }
        break;
      case DType::kFloat32: Epilogue<float, TAcc>(p, acc, row0, col0, tx, ty); break;
      case DType::kBFloat16: Epilogue<__nv_bfloat16, TAcc>(p, acc, row0, col0, tx, ty); break;
      case DType::kFloat16: Epilogue<__half, TAcc>(p, acc, row0, col0, tx, ty); break;
    }
    __syncthreads();  // The next tile overwrites the staging buffers.
  });
}

// Float32 inputs, 128 x 128 tiles, a K-slab of 16, 256 threads of 8 x 8
// outputs. Each thread's rows and columns are two float4s of a slab row, so
// 4 shared loads feed 64 FMAs; a warp's 32 threads take 4 x 8 of the 16 x 16
// output groups, so each of those loads is one shared-memory wavefront.
// Slabs are fetched one ahead, in two shared-memory buffers. Where both
// operands allow it (16-byte aligned, leading dimensions multiples of 4:
// WideVector) threads fetch whole float4s, and an operand along n goes
// straight to shared memory (cp.async); otherwise elements one by one with
// bounds checks (any alignment, leading dimension and transpose, as in
// SimtGroupedGemm), through registers. The element-by-element fetch cost a
// quarter of the instructions on top of the FMAs at 4096^3 (Nsight Compute,
// H100), and the kernel is short of registers (128 for two blocks an SM).
// (The slab depth kBK, the blocks an SM, kMinBlocks, and what goes through
// registers, kAsync, are template parameters so that a diagnostic build can
// time other choices: see LaunchSimtGemm.)
constexpr int kWide = kSimtWideTile;  // 128
constexpr int kWidePad = 4;  // Keeps float4 alignment; spreads the stash's stores over the banks.
template <int kBK>
using WideSlab = float[kBK][kWide + kWidePad];

// A 16-byte copy from global to shared memory that does not pass through
// registers (cp.async, sm_80 and later); zeros where !valid. Complete once
// this thread runs WaitCopies.
__device__ __forceinline__ void CopyAsync16(float* shared, const float* global, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}
// The same for 4 bytes (cp.async.ca: 4-byte copies go through L1).
__device__ __forceinline__ void CopyAsync4(float* shared, const float* global, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(global),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void WaitCopies() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// One operand's share of a slab: 128 rows (A) or columns (B) by kBK k.
// Each thread moves kElems elements along the operand's contiguous
// dimension (along k for kAlongK: A as given, B transposed), in one of two
// ways (kVector):
//  - float4 groups of 4 consecutive elements, where the operand allows it
//    (WideVector): along k, a row's kBK / 4 groups go to consecutive
//    threads, through registers (Stash transposes them); otherwise the 32
//    groups of a k do, and with kAsync >= 1 they go straight to shared
//    memory (CopyAsync16: no staging registers, which the kernel is short
//    of).
//  - element by element with bounds checks: along k, kBK threads cover a
//    row's k and 256 / kBK rows follow; otherwise 128 threads cover the 128
//    rows and 2 k follow (consecutive threads, consecutive addresses). With
//    kAsync == 2 these go straight to shared memory too (CopyAsync4), and
//    so does an operand along k in place of its float4 groups.
// One operand's tile in global memory.
struct WideMatrix {
  const float* base;  // Element (0, 0) of the tile: its first row (or column) at k = 0.
  int64_t ld;
  int rows;  // Rows (or columns) of the tile inside the matrix (dimensions fit an int).
  int k;
};

template <bool kAlongK, int kBK, bool kVector, int kAsync>
struct WideOperand : WideMatrix {
  static constexpr int kElems = kWide * kBK / kThreads;
  static constexpr int kGroups = kElems / 4;
  static_assert(kGroups * 4 == kElems, "whole float4 groups a thread");
  static constexpr bool kCopies16 = kVector && !kAlongK && kAsync >= 1;  // CopyAsync16 groups.
  static constexpr bool kCopies4 = !kCopies16 && kAsync == 2;            // CopyAsync4 elements.
  static constexpr bool kCopies = kCopies16 || kCopies4;                 // Fetch copies to shared.
  static constexpr int kRegs = kCopies ? 1 : kElems;                     // Staging registers.

  // Row (or column) and k of element e, fetched element by element.
  __device__ static int Row(int e) {
    return kAlongK ? static_cast<int>(threadIdx.x) / kBK + (kThreads / kBK) * e
                   : static_cast<int>(threadIdx.x) % kWide;
  }
  __device__ static int Kk(int e) {
    return kAlongK ? static_cast<int>(threadIdx.x) % kBK
                   : static_cast<int>(threadIdx.x) / kWide + 2 * e;
  }
  // First row (or column) and k of float4 group g.
  __device__ static int GroupRow(int g) {
    const int q = static_cast<int>(threadIdx.x) + kThreads * g;
    return kAlongK ? q / (kBK / 4) : (q % (kWide / 4)) * 4;
  }
  __device__ static int GroupK(int g) {
    const int q = static_cast<int>(threadIdx.x) + kThreads * g;
    return kAlongK ? (q % (kBK / 4)) * 4 : q / (kWide / 4);
  }
  // The slab at k0, into registers r (Stash stores them in `slab`) or,
  // where kCopies, on its way into `slab` (complete after WaitCopies).
  __device__ void Fetch(float (&r)[kRegs], WideSlab<kBK>& slab, int k0) const {
    if constexpr (kCopies4) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const int row = Row(e), kk = k0 + Kk(e);
        const bool valid = row < rows && kk < k;
        const float* from = base + (kAlongK ? row * ld + kk : kk * ld + row);
        CopyAsync4(&slab[Kk(e)][row], valid ? from : base, valid);
      }
    } else if constexpr (kCopies16) {
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const int row = GroupRow(g), kk = GroupK(g);
        const bool valid = row < rows && k0 + kk < k;
        CopyAsync16(&slab[kk][row], valid ? base + (k0 + kk) * ld + row : base, valid);
      }
    } else if constexpr (kVector) {
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const int row = GroupRow(g), kk = k0 + GroupK(g);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row < rows && kk < k) {  // A group lies wholly inside or outside (WideVector).
          v = *reinterpret_cast<const float4*>(base + (kAlongK ? row * ld + kk : kk * ld + row));
        }
        r[4 * g] = v.x;
        r[4 * g + 1] = v.y;
        r[4 * g + 2] = v.z;
        r[4 * g + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const int row = Row(e), kk = k0 + Kk(e);
        r[e] = row < rows && kk < k ? base[kAlongK ? row * ld + kk : kk * ld + row] : 0.0f;
      }
    }
  }
  // A slab fetched into registers, into shared memory.
  __device__ static void Stash(WideSlab<kBK>& slab, const float (&r)[kRegs]) {
    if constexpr (kCopies) {
      return;
    } else if constexpr (kVector) {
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const int row = GroupRow(g), kk = GroupK(g);
        if constexpr (kAlongK) {
#pragma unroll
          for (int c = 0; c < 4; ++c) slab[kk + c][row] = r[4 * g + c];
        } else {
          *reinterpret_cast<float4*>(&slab[kk][row]) =
              make_float4(r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]);
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < kElems; ++e) slab[Kk(e)][Row(e)] = r[e];
    }
  }
};

// Whether an operand's tile can be fetched as float4 groups, each wholly
// inside or outside the matrix: base 16-byte aligned, ld a multiple of 4,
// and the dimension the groups run along (k, or the tile's rows) a
// multiple of 4 or (rows) at least the tile.
template <bool kAlongK>
__device__ __forceinline__ bool WideVector(const WideMatrix& t) {
  return reinterpret_cast<uintptr_t>(t.base) % 16 == 0 && t.ld % 4 == 0 &&
         (kAlongK ? t.k % 4 == 0 : t.rows >= kWide || t.rows % 4 == 0);
}

// One 128 x 128 tile with A and B laid out as the template says, both
// fetched as float4 groups or both element by element (kVector).
template <int kBK, int kAsync, bool kAAlongK, bool kBAlongK, bool kVector>
__device__ __forceinline__ void WideTile(const DeviceGemmProblem& p, int64_t row0, int64_t col0,
                                         const WideMatrix& a, const WideMatrix& b,
                                         WideSlab<kBK> (&as)[2], WideSlab<kBK> (&bs)[2]) {
  using OperandA = WideOperand<kAAlongK, kBK, kVector, kAsync>;
  using OperandB = WideOperand<kBAlongK, kBK, kVector, kAsync>;
  constexpr bool kCopies = OperandA::kCopies || OperandB::kCopies;
  // A warp covers 4 x 8 of the 16 x 16 groups of 8 x 8 outputs.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int tx = lane % 8 + 8 * (warp % 2), ty = lane / 8 + 4 * (warp / 2);
  const OperandA wa{a};
  const OperandB wb{b};

  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

  float ra[OperandA::kRegs], rb[OperandB::kRegs];
  const int kblocks = static_cast<int>((p.k + kBK - 1) / kBK);
  wa.Fetch(ra, as[0], 0);
  wb.Fetch(rb, bs[0], 0);
  OperandA::Stash(as[0], ra);
  OperandB::Stash(bs[0], rb);
  if constexpr (kCopies) WaitCopies();
  __syncthreads();
  for (int kb = 0; kb < kblocks; ++kb) {
    const int buf = kb & 1;
    if (kb + 1 < kblocks) {
      wa.Fetch(ra, as[buf ^ 1], (kb + 1) * kBK);
      wb.Fetch(rb, bs[buf ^ 1], (kb + 1) * kBK);
    }
#pragma unroll
    for (int l2 = 0; l2 < kBK; ++l2) {
      float x[8], y[8];
      *reinterpret_cast<float4*>(&x[0]) = *reinterpret_cast<const float4*>(&as[buf][l2][ty * 4]);
      *reinterpret_cast<float4*>(&x[4]) =
          *reinterpret_cast<const float4*>(&as[buf][l2][64 + ty * 4]);
      *reinterpret_cast<float4*>(&y[0]) = *reinterpret_cast<const float4*>(&bs[buf][l2][tx * 4]);
      *reinterpret_cast<float4*>(&y[4]) =
          *reinterpret_cast<const float4*>(&bs[buf][l2][64 + tx * 4]);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(x[i], y[j], acc[i][j]);
    }
    if (kb + 1 < kblocks) {
      OperandA::Stash(as[buf ^ 1], ra);
      OperandB::Stash(bs[buf ^ 1], rb);
    }
    if constexpr (kCopies) WaitCopies();
    __syncthreads();
  }

  // Float32 in, float32 out (IsSupportedOutput).
  Epilogue<float, float, 8>(p, acc, row0, col0, tx, ty);
  // The next tile's first stash follows this tile's last reads through
  // the loop's final __syncthreads.
}

// A tile of any layout: picks WideTile's template arguments.
template <int kBK, int kAsync, bool kAAlongK, bool kBAlongK>
__device__ __forceinline__ void WideTileOfLayout(const DeviceGemmProblem& p, int64_t row0,
                                                 int64_t col0, WideSlab<kBK> (&as)[2],
                                                 WideSlab<kBK> (&bs)[2]) {
  const WideMatrix a{static_cast<const float*>(p.a) + (kAAlongK ? row0 * p.lda : row0), p.lda,
                     static_cast<int>(p.m - row0), static_cast<int>(p.k)};
  const WideMatrix b{static_cast<const float*>(p.b) + (kBAlongK ? col0 * p.ldb : col0), p.ldb,
                     static_cast<int>(p.n - col0), static_cast<int>(p.k)};
  if (WideVector<kAAlongK>(a) && WideVector<kBAlongK>(b)) {
    WideTile<kBK, kAsync, kAAlongK, kBAlongK, true>(p, row0, col0, a, b, as, bs);
  } else {
    WideTile<kBK, kAsync, kAAlongK, kBAlongK, false>(p, row0, col0, a, b, as, bs);
  }
}

// kAsync: 0 every fetch through registers, 1 float4 groups along n copied
// straight to shared memory, 2 every element (WideOperand; shipped).
template <int kBK, int kMinBlocks, int kAsync = 2>
__global__ void __launch_bounds__(kThreads, kMinBlocks) SimtWideGemm(SimtLaunch l) {
  __shared__ __align__(16) WideSlab<kBK> as[2];
  __shared__ __align__(16) WideSlab<kBK> bs[2];
  __shared__ int claimed[2];
  ForEachTile(l, l.total_tiles, claimed, [&](int tile) {
    const int problem = ProblemOf(l, tile);
    const DeviceGemmProblem& p = l.problems[problem];
    const int local = tile - l.tile_offsets[problem];
    const int tiles_n = static_cast<int>((p.n + kWide - 1) / kWide);
    const int64_t row0 = static_cast<int64_t>(local / tiles_n) * kWide;
    const int64_t col0 = static_cast<int64_t>(local % tiles_n) * kWide;
    // A is read along k unless transposed, B only when transposed.
    if (!p.transpose_a) {
      if (p.transpose_b) WideTileOfLayout<kBK, kAsync, true, true>(p, row0, col0, as, bs);
      else WideTileOfLayout<kBK, kAsync, true, false>(p, row0, col0, as, bs);
    } else {
      if (p.transpose_b) WideTileOfLayout<kBK, kAsync, false, true>(p, row0, col0, as, bs);
      else WideTileOfLayout<kBK, kAsync, false, false>(p, row0, col0, as, bs);
    }
  });
}

#ifdef MATMUL_HOPPER_DIAG
// ---- Diagnostic builds only: 256 x 128 tiles, 16 x 8 outputs a thread --------
//
// An experiment for exact float32, measured slower than the wide kernel
// (0.76-0.78x cuBLAS against 0.82-0.89x, H100, fifteenth round; not
// profiled: perhaps one block an SM has too little to overlap its slab
// waits with): the shape of cuBLAS's
// SGEMM kernel on Hopper (Nsight Compute: 256 x 128 x 8 tiles, 3 stages, 8
// warps, 254 registers, one block an SM, 87% of issue slots busy against
// the wide kernel's 72%). A thread's 128 accumulators give each k-step 128
// independent FMAs for 6 shared loads (the wide kernel: 64 for 4), meant
// to hide the loads' latency with two warps a scheduler. Every fetch goes
// straight to shared memory (cp.async) in a 3-slab ring, so nothing is
// staged in registers. Only what gemm-bench's single rows need: one
// problem, A and B as given (row-major), 16-byte aligned, leading
// dimensions and N multiples of 4; anything else traps.
constexpr int kTallM = 256, kTallN = 128, kTallBK = 8, kTallStages = 3;

template <int kGroups>
__device__ __forceinline__ void WaitCopiesBut() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kGroups) : "memory");
}
__device__ __forceinline__ void CommitCopies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__global__ void __launch_bounds__(kThreads, 1) SimtTallGemm(SimtLaunch l) {
  __shared__ __align__(16) float as[kTallStages][kTallBK][kTallM + 4];
  __shared__ __align__(16) float bs[kTallStages][kTallBK][kTallN + 4];
  __shared__ int claimed[2];
  const DeviceGemmProblem& p = l.problems[0];
  const float* a = static_cast<const float*>(p.a);
  const float* b = static_cast<const float*>(p.b);
  if (l.num_problems != 1 || p.transpose_a || p.transpose_b ||
      reinterpret_cast<uintptr_t>(a) % 16 != 0 || reinterpret_cast<uintptr_t>(b) % 16 != 0 ||
      p.ldb % 4 != 0 || p.n % 4 != 0) {
    __trap();
  }
  const int tiles_n = static_cast<int>((p.n + kTallN - 1) / kTallN);
  const int total = static_cast<int>((p.m + kTallM - 1) / kTallM) * tiles_n;
  const int k = static_cast<int>(p.k);
  const int kblocks = (k + kTallBK - 1) / kTallBK;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int tx = lane % 8 + 8 * (warp % 2), ty = lane / 8 + 4 * (warp / 2);
  // This thread's copies: A elements (row t / 8 + 32 e, k t % 8), one
  // 16-byte group of B (k t / 32, columns (t % 32) * 4 ...).
  const int a_row = threadIdx.x / kTallBK, a_k = threadIdx.x % kTallBK;
  const int b_k = threadIdx.x / 32, b_col = (threadIdx.x % 32) * 4;
  ForEachTile(l, total, claimed, [&](int tile) {
    const int64_t row0 = static_cast<int64_t>(tile / tiles_n) * kTallM;
    const int64_t col0 = static_cast<int64_t>(tile % tiles_n) * kTallN;
    const int rows_a = static_cast<int>(p.m - row0), cols_b = static_cast<int>(p.n - col0);
    const float* a_tile = a + row0 * p.lda;
    const float* b_tile = b + col0;
    auto fetch = [&](int stage, int k0) {
#pragma unroll
      for (int e = 0; e < kTallM / 32; ++e) {
        const int row = a_row + 32 * e, kk = k0 + a_k;
        const bool valid = row < rows_a && kk < k;
        CopyAsync4(&as[stage][a_k][row], valid ? a_tile + row * p.lda + kk : a, valid);
      }
      const int kk = k0 + b_k;
      const bool valid = b_col < cols_b && kk < k;
      CopyAsync16(&bs[stage][b_k][b_col], valid ? b_tile + kk * p.ldb + b_col : b, valid);
    };

    float acc[16][8];
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

#pragma unroll
    for (int s = 0; s < kTallStages - 1; ++s) {
      if (s < kblocks) fetch(s, s * kTallBK);
      CommitCopies();
    }
    for (int kb = 0; kb < kblocks; ++kb) {
      WaitCopiesBut<kTallStages - 2>();  // This thread's copies of slab kb have landed.
      __syncthreads();  // Everyone's have, and everyone is done with slab kb - 1.
      if (kb + kTallStages - 1 < kblocks) {
        fetch((kb + kTallStages - 1) % kTallStages, (kb + kTallStages - 1) * kTallBK);
      }
      CommitCopies();  // Possibly empty: keeps one group a slab.
      const int stage = kb % kTallStages;
#pragma unroll
      for (int l2 = 0; l2 < kTallBK; ++l2) {
        float x[16], y[8];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          *reinterpret_cast<float4*>(&x[4 * q]) =
              *reinterpret_cast<const float4*>(&as[stage][l2][64 * q + ty * 4]);
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          *reinterpret_cast<float4*>(&y[4 * q]) =
              *reinterpret_cast<const float4*>(&bs[stage][l2][64 * q + tx * 4]);
        }
#pragma unroll
        for (int i = 0; i < 16; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(x[i], y[j], acc[i][j]);
      }
    }
    WaitCopies();
    __syncthreads();  // The next tile's first copies overwrite stages still being read.

    const float alpha = static_cast<float>(p.alpha), beta = static_cast<float>(p.beta);
    float* d = static_cast<float*>(p.d);
    const float* c = static_cast<const float*>(p.c);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int64_t row = row0 + 64 * (i / 4) + ty * 4 + i % 4;
      if (row >= p.m) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t col = col0 + 64 * (j / 4) + tx * 4 + j % 4;
        if (col >= p.n) continue;
        float v = alpha * acc[i][j];
        if (p.beta != 0.0) v += beta * c[row * p.ldc + col];
        d[row * p.ldd + col] = v;
      }
    }
  });
}
#endif  // MATMUL_HOPPER_DIAG

}  // namespace

cudaError_t LaunchSimtGemm(const SimtLaunch& l) {
  if (l.total_tiles == 0) return cudaSuccess;
  if (l.tile == kSimtWideTile) {
    if (l.input != DType::kFloat32 || l.output != DType::kFloat32) return cudaErrorInvalidValue;
#ifdef MATMUL_HOPPER_DIAG
    // gemm-bench-diag only: MATMUL_SIMT_WIDE=BK,BLOCKS[,FETCH] (8,2 / 16,1 /
    // 16,2,regs / 16,2,async / 16,2,copy4) times another slab depth,
    // register budget or way of fetching (kAsync 0, 1 or 2) against the
    // shipped 16,2 with kAsync 2 (16,2,copy4 is the shipped kernel, built
    // the diagnostic way, as a control);
    // MATMUL_SIMT_WIDE=tall the 256 x 128 experiment (SimtTallGemm), one
    // block an SM (half the wide grid) or, without claims, one a wide tile.
    if (const char* v = std::getenv("MATMUL_SIMT_WIDE"); v != nullptr) {
      const std::string variant(v);
      const unsigned grid = l.grid;
      if (variant == "tall") {
        const unsigned tall_grid = l.tile_counter != nullptr ? (grid + 1) / 2 : grid;
        SimtTallGemm<<<tall_grid, kThreads, 0, l.stream>>>(l);
      } else if (variant == "8,2") SimtWideGemm<8, 2><<<grid, kThreads, 0, l.stream>>>(l);
      else if (variant == "16,1") SimtWideGemm<16, 1><<<grid, kThreads, 0, l.stream>>>(l);
      else if (variant == "16,2,regs") SimtWideGemm<16, 2, 0><<<grid, kThreads, 0, l.stream>>>(l);
      else if (variant == "16,2,async") SimtWideGemm<16, 2, 1><<<grid, kThreads, 0, l.stream>>>(l);
      else if (variant == "16,2,copy4") SimtWideGemm<16, 2, 2><<<grid, kThreads, 0, l.stream>>>(l);
      else return cudaErrorInvalidValue;
      return cudaGetLastError();
    }
#endif
    // A slab of 16 with two blocks an SM: measured on an H100 against 8,2
    // (0.63x cuBLAS at 4096^3), 16,1 (0.58x) and 8,1 (0.45x), 0.70x
    // (docs/BENCHMARKS.md, thirteenth round). Operands along n copied
    // straight to shared memory (kAsync 1): 0.80x, against 0.78x through
    // registers (kAsync 0) and 0.79x with every element copied (kAsync 2;
    // fourteenth round). Since the tile geometry is built once a tile
    // (WideMatrix), kAsync 2 is the one without spills (kAsync 1 spills 48
    // bytes) and ran 0.83-0.89x against kAsync 1's 0.79-0.85x in two
    // alternating rounds on an H100 (fifteenth round).
    SimtWideGemm<16, 2, 2><<<l.grid, kThreads, 0, l.stream>>>(l);
    return cudaGetLastError();
  }
  if (l.tile != kSimtTile) return cudaErrorInvalidValue;
  switch (l.input) {
    case DType::kFloat32:
      SimtGroupedGemm<float, float><<<l.grid, kThreads, 0, l.stream>>>(l);
      break;
    case DType::kFloat64:
      SimtGroupedGemm<double, double><<<l.grid, kThreads, 0, l.stream>>>(l);
      break;
    case DType::kBFloat16:
      SimtGroupedGemm<__nv_bfloat16, float><<<l.grid, kThreads, 0, l.stream>>>(l);
      break;
    case DType::kFloat16:
      SimtGroupedGemm<__half, float><<<l.grid, kThreads, 0, l.stream>>>(l);
      break;
  }
  return cudaGetLastError();
}

namespace {

// Up to kTransposesPerLaunch matrices in one launch: block b takes 32 x 32
// tile b - first[j] of the job j with first[j] <= b < first[j + 1].
struct TransposeBatch {
  TransposeJob jobs[kTransposesPerLaunch];
  int64_t first[kTransposesPerLaunch + 1];  // Each job's first block; the last: all blocks.
  int count;
};

__global__ void Transposes32(const __grid_constant__ TransposeBatch batch) {
  __shared__ float tile[32][33];
  const int64_t block = blockIdx.x;
  int j = 0;
  while (j + 1 < batch.count && batch.first[j + 1] <= block) ++j;
  const TransposeJob& job = batch.jobs[j];
  const int64_t local = block - batch.first[j];
  const int64_t tiles_x = (job.cols + 31) / 32;
  const int64_t r0 = local / tiles_x * 32, c0 = local % tiles_x * 32;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < job.rows && c < job.cols) tile[i][threadIdx.x] = job.in[r * job.ldi + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < job.rows && c < job.cols) job.out[c * job.ldo + r] = tile[threadIdx.x][i];
  }
}

}  // namespace

cudaError_t LaunchTransposes32(const TransposeJob* jobs, int count, cudaStream_t stream,
                               int* launches) {
  for (int at = 0; at < count; at += kTransposesPerLaunch) {
    TransposeBatch batch{};
    batch.count = std::min(count - at, kTransposesPerLaunch);
    int64_t blocks = 0;
    for (int j = 0; j < batch.count; ++j) {
      const TransposeJob& job = jobs[at + j];
      batch.jobs[j] = job;
      batch.first[j] = blocks;
      blocks += ((job.rows + 31) / 32) * ((job.cols + 31) / 32);
    }
    batch.first[batch.count] = blocks;
    if (blocks == 0) continue;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    Transposes32<<<static_cast<unsigned>(blocks), dim3(32, 8), 0, stream>>>(batch);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    ++*launches;
  }
  return cudaSuccess;
}

}  // namespace matmul::cuda
