// The fused epilogue's arithmetic on the GPU (epilogue.h), one definition for both places that
// apply it: the pass after any algorithm (cuda_epilogue.cu) and the wgmma GEMMs' stores
// (cuda_gemm_wgmma.cuh: FusedRows).
#pragma once

#include "cc/activation/activation_math.h"
#include "cc/activation/cuda_math_policy.cuh"
#include "cc/common/cuda_util.h"

namespace jaxdnn::conv {

// v <- act(v + bias[k + i] + res[i]) for kN consecutive values of one row (channels k..
// k + kN - 1): v holds the convolution's result, already rounded to T, as the unfused chain
// rounds it; the sum and the activation (an activation.h code, or -1 for none) run in the
// accumulator type (float, double for float64), with activation_math.h's formulas on CudaMath
// (its fast forms for 16-bit results), and are rounded once. bias and res may be null.
template <int kN, typename T>
__device__ __forceinline__ void apply_epilogue(T (&v)[kN], const cuda::dev_acc_t<T>* bias,
                                               int k, const T* res, int act,
                                               cuda::dev_acc_t<T> alpha) {
  using A = cuda::dev_acc_t<T>;
  using M = activation::CudaMath<sizeof(T) == 2>;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    A z = A(cuda::to_acc(v[i]));
    if (bias) z += __ldg(bias + k + i);
    if (res) z += A(cuda::to_acc(res[i]));
    if (act >= 0) z = activation::forward_op<M>(activation::Op(act), z, alpha);
    v[i] = cuda::from_acc<T>(z);
  }
}

}  // namespace jaxdnn::conv
