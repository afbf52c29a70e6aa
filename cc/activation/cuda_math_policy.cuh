// The CUDA math policy of activation_math.h (CudaMath), shared by the activation kernels and
// the convolution's fused epilogue (cc/conv/cuda_epilogue.cu).
#pragma once

namespace jaxdnn::activation {

// The math policy of activation_math.h. kFast (16-bit storage): exp is one MUFU.EX2 of x*log2(e)
// (ex2.approx without .ftz) instead of expf's ~10 instructions. Its relative error stays under
// 1e-5 for |x| < 88 (the rounding of x*log2(e) dominates), far inside the rounding of a
// bfloat16 or float16 result (2^-9, 2^-12).
template <bool kFastMath>
struct CudaMath {
  static constexpr bool kFast = kFastMath;
  static __device__ __forceinline__ float exp(float x) {
    if constexpr (kFast) {
      float r;
      asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f));
      return r;
    } else {
      return expf(x);
    }
  }
  static __device__ __forceinline__ double exp(double x) { return ::exp(x); }
  // exp(x) - 1. kFast: MUFU's exp minus 1, except for |x| < 1/16, where the subtraction would
  // cancel digits and the series x + x^2/2 + x^3/6 + x^4/24 is within 1.3e-7 (relative; the
  // MUFU form is within ~4e-6 at |x| = 1/16, and closer beyond).
  static __device__ __forceinline__ float expm1(float x) {
    if constexpr (kFast) {
      const float p = x * fmaf(x, fmaf(x, fmaf(x, 1.0f / 24, 1.0f / 6), 0.5f), 1.0f);
      return fabsf(x) < 0.0625f ? p : exp(x) - 1.0f;
    } else {
      return expm1f(x);
    }
  }
  static __device__ __forceinline__ double expm1(double x) { return ::expm1(x); }
  // log(1 + u) for u >= 0 (softplus takes it of exp(-|x|), in [0, 1]). kFast: MUFU's log2 of
  // 1 + u (absolute error about 2^-22 on [1, 2]) times ln 2, except for u < 1/16, where the
  // rounding of 1 + u would cost digits and u - u^2/2 + u^3/3 - u^4/4 + u^5/5 is within 1.7e-7.
  static __device__ __forceinline__ float log1p(float u) {
    if constexpr (kFast) {
      const float p =
          u * fmaf(u, fmaf(u, fmaf(u, fmaf(u, 0.2f, -0.25f), 1.0f / 3), -0.5f), 1.0f);
      float l;
      asm("lg2.approx.f32 %0, %1;" : "=f"(l) : "f"(1.0f + u));
      return u < 0.0625f ? p : l * 0.69314718055994531f;
    } else {
      return log1pf(u);
    }
  }
  static __device__ __forceinline__ double log1p(double x) { return ::log1p(x); }
  static __device__ __forceinline__ float tanh(float x) { return tanhf(x); }
  static __device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
  static __device__ __forceinline__ double erfc(double x) { return ::erfc(x); }
  // 2^x on MUFU.EX2 alone (.ftz: results below 2^-126 are 0; the form without it costs three
  // more instructions for the subnormal range).
  static __device__ __forceinline__ float exp2_ftz(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
  }
  static __device__ __forceinline__ float abs(float x) { return fabsf(x); }
  static __device__ __forceinline__ float fma(float a, float b, float c) { return fmaf(a, b, c); }
  // 1 / (1 + e) for e in [0, 5.05]: the fast path of the IEEE reciprocal (MUFU.RCP and one
  // Newton step, the same bits for a normal divisor or NaN) without its range check and
  // slow-path branch, 6 of silu's ~28 instructions per element. kFast: MUFU.RCP alone (about an
  // ulp of float off; the Newton step only makes it correctly rounded), for any e >= 0 (+inf
  // gives 0).
  static __device__ __forceinline__ float inv_one_plus(float e) {
    const float d = 1.0f + e;
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    if constexpr (kFast) return r;
    else return fmaf(r, fmaf(-d, r, 1.0f), r);
  }
  static __device__ __forceinline__ double inv_one_plus(double e) { return 1.0 / (1.0 + e); }
  template <typename A>
  static __device__ __forceinline__ A select(bool c, A a, A b) { return c ? a : b; }
};

}  // namespace jaxdnn::activation
