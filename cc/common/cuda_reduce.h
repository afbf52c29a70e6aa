// Warp and block reductions for CUDA kernels. All are deterministic: the combination order
// depends only on thread indices, never on timing.
#pragma once

#include "cc/common/cuda_util.h"

namespace jaxdnn::cuda {

struct SumOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};

// Butterfly reduction across a full warp; every lane returns the result.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduction across the whole block (blockDim.x a multiple of 32, at most 1024 threads); every
// thread returns the result. `scratch` must hold 32 values and may be reused after return.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  return warp_reduce(v, op);
}

// Reduction across the G threads that own one row (cuda_rows.h): a warp (G == 32), or the whole
// block (G == blockDim.x > 32) through block_reduce's scratch and barriers.
template <int G, typename T, typename Op>
__device__ __forceinline__ T group_reduce(T v, Op op, T identity, T* scratch) {
  static_assert(G % 32 == 0, "a row group is whole warps");
  if constexpr (G == 32) return warp_reduce(v, op);
  else return block_reduce(v, op, identity, scratch);
}

}  // namespace jaxdnn::cuda
