// The CPU math policy of activation_math.h (CpuMath: cpu_math's branch-free forms, so that
// loops vectorise), shared by the activation kernels and the convolution's fused epilogue
// (cc/conv/cpu_epilogue.cc).
#pragma once

#include <cmath>

#include "cc/common/cpu_math.h"

namespace jaxdnn::activation {

// The math policy of activation_math.h.
struct CpuMath {
  static constexpr bool kFast = false;
  template <typename A> static JAXDNN_INLINE A exp(A x) { return cpu_math::exp(x); }
  template <typename A> static JAXDNN_INLINE A expm1(A x) { return cpu_math::expm1(x); }
  template <typename A> static JAXDNN_INLINE A log1p(A x) { return cpu_math::log1p(x); }
  template <typename A> static JAXDNN_INLINE A tanh(A x) { return cpu_math::tanh(x); }
  static JAXDNN_INLINE double erfc(double x) { return std::erfc(x); }
  template <typename A> static JAXDNN_INLINE A inv_one_plus(A e) { return A(1) / (A(1) + e); }
  static JAXDNN_INLINE float abs(float x) { return std::fabs(x); }
  static JAXDNN_INLINE float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  template <typename A>
  static JAXDNN_INLINE A select(bool c, A a, A b) { return cpu_math::select(c, a, b); }
};

}  // namespace jaxdnn::activation
