// The activation formulas, shared by the CPU and CUDA kernels. `M` supplies exp, expm1, log1p,
// tanh, erfc, inv_one_plus(e) (= 1 / (1 + e) for e in [0, 1] or NaN, correctly rounded) and
// select(c, a, b) (= c ? a : b) for the compute type A (float, or double for float64):
// cpu_math on the CPU (whose select is a bitwise blend, so the loops vectorise), the CUDA math
// library and `?:` on the GPU.
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
    return A(0.5) * x * M::erfc(-x * A(kSqrtHalf));
  } else if constexpr (kOp == Op::kSilu) {
    return x * sigmoid_pair<M>(x).s;
  } else {
    static_assert(kOp == Op::kSoftplus);
    // log(1 + e^x) = max(x, 0) + log1p(e^-|x|); NaN reaches the result through the log1p.
    return M::select(x > A(0), x, A(0)) + M::log1p(M::exp(M::select(x < A(0), x, -x)));
  }
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
    const A t = M::tanh(x);
    return dy * ((A(1) - t) * (A(1) + t));
  } else if constexpr (kOp == Op::kGeluTanh) {
    // d/dx x sigmoid(2u) = S + x (2u)' S (1 - S),  (2u)' = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    const SigmoidPair<A> p = sigmoid_pair<M>(gelu_two_u(x));
    const A du = A(2 * kSqrt2OverPi) * (A(1) + A(3 * kGeluCubic) * x * x);
    return dy * (p.s + x * du * (p.s * p.sm));
  } else if constexpr (kOp == Op::kGeluErf) {
    // d/dx x Phi(x) = Phi(x) + x phi(x)
    const A cdf = A(0.5) * M::erfc(-x * A(kSqrtHalf));
    const A pdf = A(kInvSqrt2Pi) * M::exp(A(-0.5) * x * x);
    return dy * (cdf + x * pdf);
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
