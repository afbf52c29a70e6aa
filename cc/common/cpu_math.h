// Vectorisable float32 math for CPU kernels, and running a loop compiled for the CPU's widest
// vector ISA.
//
// libm calls do not vectorise, so a loop that calls std::exp runs one element at a time. The
// functions below are branch-free (selects, not jumps), use no tables and call nothing, so a
// loop over them vectorises to AVX-512/AVX2 once it is compiled for that ISA (with_best_isa).
// Accuracy, measured on every 97th float32 bit pattern against double libm (subnormal results
// in units of the smallest normal's ulp): exp 1.0 ulp, expm1 1.5, log1p 1.5, tanh 5.1 (and
// activation_math.h's fitted erfc on this exp: 6.1). Special values follow C: exp(-inf) = 0,
// exp(inf) = inf, tanh(+-inf) = +-1, log1p(-1) = -inf, and NaN in gives NaN out. Results may be
// float32 subnormals.
//
// The double overloads forward to <cmath>: float64 exists for gradient checks, not for speed.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cc/common/dtype.h"

namespace jaxdnn::cpu_math {

#define JAXDNN_INLINE inline __attribute__((always_inline))

// ---- bit-level helpers ----------------------------------------------------------------------

JAXDNN_INLINE float from_bits(uint32_t u) { return bits_to_float(u); }
JAXDNN_INLINE uint32_t to_bits(float f) { return float_to_bits(f); }
JAXDNN_INLINE float copy_sign(float mag, float sign) {
  return from_bits((to_bits(mag) & 0x7fffffffu) | (to_bits(sign) & 0x80000000u));
}
JAXDNN_INLINE bool is_nan(float x) { return x != x; }

// c ? a : b as a bitwise blend. Written as `?:`, chains of selects reach the optimiser as
// branches, which jump threading duplicates until the loop no longer if-converts (and so no
// longer vectorises); a blend never branches.
JAXDNN_INLINE float select(bool c, float a, float b) {
  const uint32_t m = 0u - uint32_t(c);
  return from_bits((to_bits(a) & m) | (to_bits(b) & ~m));
}
JAXDNN_INLINE double select(bool c, double a, double b) {
  uint64_t ua, ub;
  std::memcpy(&ua, &a, 8);
  std::memcpy(&ub, &b, 8);
  const uint64_t m = 0u - uint64_t(c), r = (ua & m) | (ub & ~m);
  double d;
  std::memcpy(&d, &r, 8);
  return d;
}
// 2^n for n in [-126, 127] (unsigned arithmetic: any n is defined behaviour).
JAXDNN_INLINE float pow2(int32_t n) { return from_bits((uint32_t(n) + 127u) << 23); }

// ---- exp and expm1 --------------------------------------------------------------------------

// x = n*ln2 + r with |r| <= ln2/2 (cephes' two-part ln2 keeps n*ln2 exact for |n| < 512), and
// expm1(r) from a degree-7 polynomial. n is returned as n1 + n2, so that 2^n1 * 2^n2 (each a
// normal float for n in [-150, 128]) reaches both overflow and subnormals. Meaningful for x in
// [-104, 88.73]; any other input (inf, NaN) gives garbage but no undefined behaviour (n comes
// from the bits of the rounded value, not a float-to-int conversion), for the caller to
// replace.
struct ExpReduced {
  float em1_r;     // expm1(r)
  int32_t n1, n2;  // n = n1 + n2, each within [-75, 64]
};

JAXDNN_INLINE ExpReduced exp_reduce(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * kLog2e + kRound;
  const float n = t - kRound;
  const int32_t ni = int32_t(to_bits(t) - to_bits(kRound));
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const int32_t n1 = ni >> 1;
  return {p * r * r + r, n1, ni - n1};
}

constexpr float kExpMaxArg = 88.7228394f;  // largest x with exp(x) finite

JAXDNN_INLINE float exp(float x) {
  const ExpReduced e = exp_reduce(x);
  const float s1 = pow2(e.n1);
  float y = (e.em1_r * s1 + s1) * pow2(e.n2);
  y = select(x > kExpMaxArg, std::numeric_limits<float>::infinity(), y);
  y = select(x < -104.0f, 0.0f, y);
  return select(is_nan(x), x, y);
}

// exp(x) - 1 without the cancellation near 0: 2^n*expm1(r) + (2^n - 1).
JAXDNN_INLINE float expm1(float x) {
  const ExpReduced e = exp_reduce(x);
  const float s1 = pow2(e.n1);
  float y = (e.em1_r * s1 + (s1 - pow2(-e.n2))) * pow2(e.n2);
  y = select(x > kExpMaxArg, std::numeric_limits<float>::infinity(), y);
  y = select(x < -18.0f, -1.0f, y);  // exp(-18) is below half an ulp of 1
  return select(is_nan(x), x, y);
}

// ---- log1p ----------------------------------------------------------------------------------

// log(1 + u): w = 1 + u = m * 2^k with m in [sqrt(1/2), sqrt(2)), log(m) from cephes' logf
// polynomial, plus (u - (w - 1)) / w for the rounding of 1 + u.
JAXDNN_INLINE float log1p(float u) {
  const float w = 1.0f + u;
  const bool finite_positive = (w > 0.0f) & (w < std::numeric_limits<float>::infinity());
  const float wc = select(finite_positive, w, 1.0f);
  const uint32_t bits = to_bits(wc);
  const float m1 = from_bits((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  const float m1_half = 0.5f * m1;
  const bool big = m1 > 1.41421356f;
  const float m = select(big, m1_half, m1);
  const float kf = float(int32_t(bits >> 23) - 127 + int32_t(big));
  const float f = m - 1.0f, z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  float y = p * f * z + kf * -2.12194440e-4f;
  y = y - 0.5f * z;
  y = (f + y) + kf * 0.693359375f;
  y = y + (u - (wc - 1.0f)) / wc;
  y = select(w == std::numeric_limits<float>::infinity(), w, y);
  y = select(w == 0.0f, -std::numeric_limits<float>::infinity(), y);
  y = select(w < 0.0f, std::numeric_limits<float>::quiet_NaN(), y);
  return select(is_nan(u), u, y);
}

// ---- tanh -----------------------------------------------------------------------------------

// tanh(x) = x P(x^2) / Q(x^2) with P and Q of degree 4, fitted on [0, 9] (Loeb's iteration for
// the relative error, then L^p refinement; fit error 0.4 ulp, 5.1 ulp after float32 rounding and
// evaluation); exactly +-1 beyond |x| = 9, where 1 - tanh is below half an ulp. One division and
// nine multiply-adds: half the cost of an exp-based formula.
JAXDNN_INLINE float tanh(float x) {
  const float a = from_bits(to_bits(x) & 0x7fffffffu);
  const float ac = select(a > 9.0f, 9.0f, a);  // NaN stays NaN, and so does the result
  const float z = ac * ac;
  float p = 1.345041151833e-08f;
  p = p * z + 2.068606389836e-05f;
  p = p * z + 3.500619144748e-03f;
  p = p * z + 1.338538239778e-01f;
  p = p * z + 9.999999946980e-01f;
  float q = 7.818054279709e-07f;
  q = q * z + 3.293612235010e-04f;
  q = q * z + 2.589649445386e-02f;
  q = q * z + 4.671870421641e-01f;
  q = q * z + 1.0f;
  const float t = ac * p / q;
  return copy_sign(select(a >= 9.0f, 1.0f, t), x);
}

// ---- float64: <cmath> ----------------------------------------------------------------------

JAXDNN_INLINE double exp(double x) { return std::exp(x); }
JAXDNN_INLINE double expm1(double x) { return std::expm1(x); }
JAXDNN_INLINE double log1p(double x) { return std::log1p(x); }
JAXDNN_INLINE double tanh(double x) { return std::tanh(x); }

// ---- storage conversions that vectorise ----------------------------------------------------

// Element load/store in the compute type (float, or double for float64). The bfloat16 store
// rounds to nearest even and keeps NaN quiet with a select instead of dtype.h's branch; float16
// uses dtype.h's scalar conversions (not vectorised: float16 is not a CPU performance target).
JAXDNN_INLINE float load(float v) { return v; }
JAXDNN_INLINE double load(double v) { return v; }
JAXDNN_INLINE float load(bf16_t v) { return from_bits(uint32_t(v.bits) << 16); }
JAXDNN_INLINE float load(f16_t v) { return to_float(v); }

template <typename T> JAXDNN_INLINE T store(acc_t<T> v);
template <> JAXDNN_INLINE float store<float>(float v) { return v; }
template <> JAXDNN_INLINE double store<double>(double v) { return v; }
template <> JAXDNN_INLINE f16_t store<f16_t>(float v) { return f16_from_float(v); }
template <> JAXDNN_INLINE bf16_t store<bf16_t>(float v) {
  const uint32_t u = to_bits(v);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  const uint32_t m = 0u - uint32_t((u & 0x7fffffffu) > 0x7f800000u);
  return bf16_t{uint16_t((quiet_nan & m) | (rounded & ~m))};
}

// ---- ISA dispatch ---------------------------------------------------------------------------

enum class Isa { kBaseline, kAvx2, kAvx512 };

inline Isa best_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kBaseline;
  }();
  return isa;
}

// `flatten` inlines fn's body (and everything it calls) into these functions, so the loops in
// it are compiled, and vectorised, for the target's ISA.
template <typename Fn>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512"),
               flatten)) void run_avx512(const Fn& fn) {
  fn();
}
template <typename Fn>
__attribute__((target("avx2,fma,f16c"), flatten)) void run_avx2(const Fn& fn) {
  fn();
}
template <typename Fn>
__attribute__((flatten)) void run_baseline(const Fn& fn) {
  fn();
}

// Runs fn() compiled for the widest vector ISA this CPU supports. fn should hold just the
// loops (no thread-pool calls): call it inside each parallel task.
template <typename Fn>
void with_best_isa(const Fn& fn) {
  switch (best_isa()) {
    case Isa::kAvx512: run_avx512(fn); return;
    case Isa::kAvx2: run_avx2(fn); return;
    case Isa::kBaseline: run_baseline(fn); return;
  }
}

}  // namespace jaxdnn::cpu_math
