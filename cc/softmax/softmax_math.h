// The backward kernels' per-element formulas, shared by the CPU and CUDA kernels:
// out = output(y, c, r), where r is the row sum of summand(y, c). `M` supplies exp for the
// compute type A (float, or double for float64).
#pragma once

#include "cc/softmax/softmax.h"

#if defined(__CUDACC__)
#define JAXDNN_SOFTMAX_FN __device__ __forceinline__
#else
#define JAXDNN_SOFTMAX_FN inline __attribute__((always_inline))
#endif

namespace jaxdnn::softmax {

template <Linear kKind, typename M, typename A>
JAXDNN_SOFTMAX_FN A summand(A y, A c) {
  if constexpr (kKind == Linear::kSoftmax) return y * c;
  else if constexpr (kKind == Linear::kLogSoftmaxVjp) return c;
  else return M::exp(y) * c;
}

template <Linear kKind, typename M, typename A>
JAXDNN_SOFTMAX_FN A output(A y, A c, A r) {
  if constexpr (kKind == Linear::kSoftmax) return y * (c - r);
  else if constexpr (kKind == Linear::kLogSoftmaxVjp) return c - M::exp(y) * r;
  else return c - r;
}

}  // namespace jaxdnn::softmax
