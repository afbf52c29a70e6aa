// The activation formulas, shared by the CPU and CUDA kernels. `M` supplies exp, expm1, log1p,
// tanh, erfc (double only), inv_one_plus(e) (= 1 / (1 + e) for e in [0, 5.05] or NaN, correctly
// rounded; with kFast, any e >= 0, +inf giving 0), abs, fma, select(c, a, b) (= c ? a : b),
// kFast (true: results are rounded to a 16-bit type, so float-level accuracy is not needed) and,
// with kFast, exp2_ftz(x) (2^x, 0 below 2^-126) for the compute type A (float, or double for
// float64): cpu_math on the CPU (whose select is a bitwise blend, so the loops vectorise), the
// CUDA math library and `?:` on the GPU. For float, both platforms' normal CDF (gelu_exact) is
// normal_fitted below on their own exp and reciprocal.
//
// They follow jax.nn exactly, special values included: relu/relu6 propagate NaN; relu'(0) = 0
// and relu6' is 0 at 0 and 6 (jax's choice); leaky_relu' is the negative slope at NaN;
// gelu(-inf) and silu(-inf) are NaN (-inf * 0), as in jax; and the derivatives of gelu and silu
// are NaN at +-inf, as jax's are.
#pragma once

#include "cc/activation/activation.h"

#if defined(__CUDACC__)
#define JAXDNN_ACT_FN __device__ __forceinline__
#else
#define JAXDNN_ACT_FN inline __attribute__((always_inline))
#endif

namespace jaxdnn::activation {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;                 // tanh-gelu's cubic coefficient
constexpr double kSqrtHalf = 0.70710678118654752440;     // sqrt(1/2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2 pi)

// Phi(x), the normal CDF (= erfc(-x/sqrt(2))/2), as p / scale, and e = exp(-x^2/2), which
// gelu_exact's derivative takes too (phi(x) = e/sqrt(2 pi)). scale is 1 or 2, a constant of each
// form: with scale 2, p = erfc(-x/sqrt(2)), and gelu = (x/2) p as in jax, whose intermediate is
// a normal float where Phi itself is subnormal (x near -13), which a CPU run with
// flush-to-zero, as XLA's is, would lose.
template <typename A>
struct Normal {
  A p, e, scale;
};

// exp(-a*b), with the rounding error of a*b compensated to first order.
template <typename M>
JAXDNN_ACT_FN float exp_neg_product(float a, float b) {
  const float hi = a * b, lo = M::fma(a, b, -hi);
  const float e = M::exp(-hi);
  return e - e * lo;
}

// Phi(x) for float: with a = |x|/sqrt(2), erfc(a) = exp(-a^2) g(t) for t = 1/(1 + a/2), where
// g(t) = erfcx(2/t - 2) is a polynomial fitted (relative least squares, reweighted towards
// minimax) on a in [0, 10.06]; erfc(-a) = 2 - erfc(a). No separate erf branch: the one
// polynomial covers a = 0 (g = 1) to the float underflow of erfc near a = 10. Straight-line
// code: it vectorises on the CPU, and on the GPU it took gelu_exact off the CUDA library's erfcf
// (docs/perf/activation.md).
//   float results (scale 2): degree 9 (max fit error 0.6 ulp; erfc 6.1 ulp after float rounding
//     and evaluation with an exact exp and division), e from x with the rounding of x^2/2
//     compensated, and e = 0 where a > 10.1 (erfc(10.1) < 2^-149), so that gelu(-inf) and its
//     derivative at +-inf are NaN (inf * 0), as in jax.
//   M::kFast (16-bit results, scale 1): Phi directly, with g's coefficients halved: degree 7
//     (max fit error 4.2e-7; 6.8e-7 evaluated in float), on s = |x| sqrt(log2(e)/2): e =
//     2^-(s^2) is one MUFU.EX2 (M::exp2_ftz; below 2^-126 it is 0, which leaves the results
//     that are 16-bit subnormals, under 2^-126, at 0), and t = 1/(1 + 0.41627731 s). At +-inf
//     e = 0 and t = 0 without the clamp: ~19 instructions an element (PTX; the erfc form it
//     replaced took 31).
template <typename M>
JAXDNN_ACT_FN Normal<float> normal_fitted(float x) {
  float t, e, g, scale;
  if constexpr (M::kFast) {
    scale = 1.0f;
    const float s = M::abs(x) * 0.849321800f;  // sqrt(log2(e) / 2)
    t = M::inv_one_plus(s * 0.416277306f);      // a/2 = s / (2 sqrt(log2(e)))
    e = M::exp2_ftz(-s * s);
    g = 4.88609299e-02f;
    g = g * t - 1.96215883e-01f;
    g = g * t + 2.21890569e-01f;
    g = g * t - 2.96302279e-03f;
    g = g * t + 1.50685534e-01f;
    g = g * t + 1.36258960e-01f;
    g = g * t + 1.41500890e-01f;
    g = g * t - 1.77829043e-05f;
  } else {
    scale = 2.0f;
    const float a = M::abs(x) * float(kSqrtHalf);
    t = M::inv_one_plus(0.5f * M::select(a > 10.1f, 10.1f, a));  // NaN stays NaN
    e = M::select(a > 10.1f, 0.0f, exp_neg_product<M>(0.5f * x, x));
    g = -5.5153266e-02f;
    g = g * t + 2.6443475e-01f;
    g = g * t - 4.4267151e-01f;
    g = g * t + 2.2270219e-01f;
    g = g * t + 1.5892832e-02f;
    g = g * t + 1.8184473e-01f;
    g = g * t + 2.4960282e-01f;
    g = g * t + 2.8113595e-01f;
    g = g * t + 2.8221726e-01f;
    g = g * t - 5.8211240e-06f;
  }
  const float r = e * g;  // scale * Phi(-|x|): Phi(-|x|), or erfc(|x|/sqrt(2))
  return {M::select(x < 0.0f, r, scale - r), e, scale};
}

template <typename M, typename A>
JAXDNN_ACT_FN Normal<A> normal(A x) {
  if constexpr (sizeof(A) == 8) return {M::erfc(-x * A(kSqrtHalf)), M::exp(A(-0.5) * x * x), 2};
  else return normal_fitted<M>(x);
}

// sigmoid(x) and sigmoid(-x) = 1 - sigmoid(x) from one exp(-|x|), which never overflows; both
// are exact limits (0 or 1) at +-inf.
template <typename A>
struct SigmoidPair {
  A s, sm;
};

template <typename M, typename A>
JAXDNN_ACT_FN SigmoidPair<A> sigmoid_pair(A x) {
  const A e = M::exp(M::select(x < A(0), x, -x));  // NaN stays NaN
  const A r = M::inv_one_plus(e), er = e * r;
  const bool pos = x >= A(0);
  return {M::select(pos, r, er), M::select(pos, er, r)};
}

// tanh-gelu is x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the same function as
// x * (1 + tanh(u)) / 2, without the cancellation of 1 + tanh(u) for x < 0.
template <typename A>
JAXDNN_ACT_FN A gelu_two_u(A x) {
  return A(2 * kSqrt2OverPi) * x * (A(1) + A(kGeluCubic) * x * x);
}

template <Op kOp, typename M, typename A>
JAXDNN_ACT_FN A forward(A x, A alpha) {
  if constexpr (kOp == Op::kRelu) {
    return M::select(x <= A(0), A(0), x);  // NaN stays NaN
  } else if constexpr (kOp == Op::kRelu6) {
    const A r = M::select(x <= A(0), A(0), x);
    return M::select(r >= A(6), A(6), r);
  } else if constexpr (kOp == Op::kLeakyRelu) {
    return M::select(x >= A(0), x, alpha * x);
  } else if constexpr (kOp == Op::kElu) {
    return M::select(x > A(0), x, alpha * M::expm1(x));
  } else if constexpr (kOp == Op::kSigmoid) {
    return sigmoid_pair<M>(x).s;
  } else if constexpr (kOp == Op::kTanh) {
    return M::tanh(x);
  } else if constexpr (kOp == Op::kGeluTanh) {
    return x * sigmoid_pair<M>(gelu_two_u(x)).s;
  } else if constexpr (kOp == Op::kGeluErf) {
    const Normal<A> n = normal<M>(x);
    return x / n.scale * n.p;
  } else if constexpr (kOp == Op::kSilu) {
    return x * sigmoid_pair<M>(x).s;
  } else {
    static_assert(kOp == Op::kSoftplus);
    // log(1 + e^x) = max(x, 0) + log1p(e^-|x|); NaN reaches the result through the log1p.
    return M::select(x > A(0), x, A(0)) + M::log1p(M::exp(M::select(x < A(0), x, -x)));
  }
}

// forward<op> for an op known only at run time, in a kernel that fuses any activation without
// an instantiation per op (the conv GEMMs' epilogue); x itself for an unknown code.
template <typename M, typename A>
JAXDNN_ACT_FN A forward_op(Op op, A x, A alpha) {
  switch (op) {
#define JAXDNN_ACT_CASE(o) \
  case o: return forward<o, M>(x, alpha);
    JAXDNN_ACTIVATION_OPS(JAXDNN_ACT_CASE)
#undef JAXDNN_ACT_CASE
  }
  return x;
}

// dy * f'(x).
template <Op kOp, typename M, typename A>
JAXDNN_ACT_FN A backward(A x, A dy, A alpha) {
  if constexpr (kOp == Op::kRelu) {
    return M::select(x > A(0), dy, A(0));
  } else if constexpr (kOp == Op::kRelu6) {
    return M::select((x > A(0)) & (x < A(6)), dy, A(0));
  } else if constexpr (kOp == Op::kLeakyRelu) {
    return M::select(x >= A(0), dy, alpha * dy);
  } else if constexpr (kOp == Op::kElu) {
    return M::select(x > A(0), dy, dy * (alpha * M::exp(x)));
  } else if constexpr (kOp == Op::kSigmoid) {
    const SigmoidPair<A> p = sigmoid_pair<M>(x);
    return dy * (p.s * p.sm);
  } else if constexpr (kOp == Op::kTanh) {
    // 1 - tanh(x)^2 = 4e / (1 + e)^2 with e = exp(-2|x|) in [0, 1]: no cancellation where
    // tanh(x) nears +-1 (1 - t*t from a rounded t keeps no digits there).
    const A e = M::exp(A(2) * M::select(x < A(0), x, -x));  // NaN stays NaN
    const A r = M::inv_one_plus(e);
    return dy * (A(4) * e * r * r);
  } else if constexpr (kOp == Op::kGeluTanh) {
    // d/dx x sigmoid(2u) = S + x (2u)' S (1 - S),  (2u)' = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    const SigmoidPair<A> p = sigmoid_pair<M>(gelu_two_u(x));
    const A du = A(2 * kSqrt2OverPi) * (A(1) + A(3 * kGeluCubic) * x * x);
    return dy * (p.s + x * du * (p.s * p.sm));
  } else if constexpr (kOp == Op::kGeluErf) {
    // d/dx x Phi(x) = Phi(x) + x phi(x)
    const Normal<A> n = normal<M>(x);
    return dy * (n.p / n.scale + x * (A(kInvSqrt2Pi) * n.e));
  } else if constexpr (kOp == Op::kSilu) {
    // d/dx x sigmoid(x) = sigmoid(x) (1 + x sigmoid(-x))
    const SigmoidPair<A> p = sigmoid_pair<M>(x);
    return dy * (p.s * (A(1) + x * p.sm));
  } else {
    static_assert(kOp == Op::kSoftplus);
    return dy * sigmoid_pair<M>(x).s;
  }
}

}  // namespace jaxdnn::activation
