// Tile counters of the persistent kernels: a pair of unsigned ints per
// stream in device memory, zero before a launch. Blocks claim tiles from
// the first (one atomicAdd a tile) and count themselves out on the second
// when their claims are over; the grid's last block to count sets both back
// to zero, so the next launch on the stream finds them ready without a
// memset. The Hopper kernel's scheduler warp and the SIMT kernels'
// TileClaims share this ending.
//
//   if (threadIdx.x == 0) {
//     for (int t = atomicAdd(counters, 1u); t < total; t = atomicAdd(counters, 1u)) ...
//     CountOutOfTileClaims(counters);
//   }
#ifndef MATMUL_KERNELS_CUDA_TILE_COUNTERS_CUH_
#define MATMUL_KERNELS_CUDA_TILE_COUNTERS_CUH_

namespace matmul::cuda {

// Counts the calling block out of the launch's claims on counters[1]; the
// last of the grid's gridDim.x blocks to do so zeroes both counters. Call
// from one thread a block, after that block's last claim on counters[0].
__device__ __forceinline__ void CountOutOfTileClaims(unsigned int* counters) {
  __threadfence();  // This block's claims before its count, for every block.
  if (atomicAdd(counters + 1, 1u) == gridDim.x - 1) {
    atomicExch(counters, 0u);
    atomicExch(counters + 1, 0u);
  }
}

}  // namespace matmul::cuda

#endif  // MATMUL_KERNELS_CUDA_TILE_COUNTERS_CUH_
