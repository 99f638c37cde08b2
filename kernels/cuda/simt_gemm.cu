// The SIMT grouped GEMM: a persistent kernel on plain FMA units (FFMA for
// float32 and the 16-bit types, DFMA for float64). It takes any alignment,
// any leading dimension and every dtype, so it is the exact-float32/float64
// engine for small problems and the fallback for what the Hopper kernel
// cannot take. 64 x 64 output tiles, 256 threads of 4 x 4 outputs each, a
// K-slab of 16 staged in shared memory (double-buffered through registers).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/kernels.h"

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

template <typename TOut, typename TAcc>
__device__ void Epilogue(const DeviceGemmProblem& p, const TAcc (&acc)[4][4], int64_t row0,
                         int64_t col0) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const TAcc alpha = static_cast<TAcc>(p.alpha);
  const TAcc beta = static_cast<TAcc>(p.beta);
  TOut* d = static_cast<TOut*>(p.d);
  const TOut* c = static_cast<const TOut*>(p.c);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + ty + 16 * i;
    if (row >= p.m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = col0 + tx + 16 * j;
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
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int tile = blockIdx.x; tile < l.total_tiles; tile += gridDim.x) {
    int lo = 0, hi = l.num_problems - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (l.tile_offsets[mid] <= tile) lo = mid;
      else hi = mid - 1;
    }
    const DeviceGemmProblem p = l.problems[lo];
    const int local = tile - l.tile_offsets[lo];
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
        if constexpr (std::is_same_v<TAcc, double>) Epilogue<double, TAcc>(p, acc, row0, col0);
        break;
      case DType::kFloat32: Epilogue<float, TAcc>(p, acc, row0, col0); break;
      case DType::kBFloat16: Epilogue<__nv_bfloat16, TAcc>(p, acc, row0, col0); break;
      case DType::kFloat16: Epilogue<__half, TAcc>(p, acc, row0, col0); break;
    }
    __syncthreads();  // The next tile overwrites the staging buffers.
  }
}

}  // namespace

cudaError_t LaunchSimtGemm(const SimtLaunch& l) {
  if (l.total_tiles == 0) return cudaSuccess;
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

__global__ void Transpose32(const float* in, int64_t rows, int64_t cols, int64_t ldi, float* out,
                            int64_t ldo) {
  __shared__ float tile[32][33];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * ldi + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[c * ldo + r] = tile[threadIdx.x][i];
  }
}

}  // namespace

cudaError_t LaunchTranspose32(const float* in, int64_t rows, int64_t cols, int64_t ldi, float* out,
                              int64_t ldo, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
  Transpose32<<<grid, dim3(32, 8), 0, stream>>>(in, rows, cols, ldi, out, ldo);
  return cudaGetLastError();
}

}  // namespace matmul::cuda
