// Elementwise activations: one forward and one backward kernel per platform, templated on the
// op (the formulas are in activation_math.h, shared by the CPU and CUDA kernels).
//
//   forward:   y  = f(x)
//   backward:  dx = dy * f'(x), from x (for every op: then nothing but x needs saving, and
//              sigmoid' = sigmoid(x) sigmoid(-x) has no cancellation, unlike y (1 - y))
//
// Traffic (minimal, and what the kernels move): forward reads n and writes n elements,
// backward reads 2n and writes n.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cc/common/dtype.h"
#include "cc/common/parallel.h"
#include "cc/common/status.h"

namespace jaxdnn::activation {

// The codes are part of the FFI contract: jaxdnn/ops/activation.py lists the names in this
// order.
enum class Op : int {
  kRelu = 0,
  kRelu6 = 1,
  kLeakyRelu = 2,  // alpha = negative slope
  kElu = 3,        // alpha
  kSigmoid = 4,
  kTanh = 5,
  kGeluTanh = 6,   // jax.nn.gelu(approximate=True)
  kGeluErf = 7,    // jax.nn.gelu(approximate=False)
  kSilu = 8,
  kSoftplus = 9,
};
constexpr int kNumOps = 10;

struct Problem {
  Op op;
  double alpha;  // leaky_relu's negative slope or elu's alpha; unused by the other ops
  DType dtype;   // of every operand and result
  int64_t n;     // elements
};

// X(op) for every Op, in code order: the one list that the switches over a runtime op
// (dispatch_op here, forward_op in activation_math.h) expand.
#define JAXDNN_ACTIVATION_OPS(X) \
  X(Op::kRelu) X(Op::kRelu6) X(Op::kLeakyRelu) X(Op::kElu) X(Op::kSigmoid) X(Op::kTanh) \
  X(Op::kGeluTanh) X(Op::kGeluErf) X(Op::kSilu) X(Op::kSoftplus)

// Calls fn(std::integral_constant<Op, op>{}) for a runtime op; false for an unknown code.
template <typename Fn>
bool dispatch_op(Op op, Fn&& fn) {
  switch (op) {
#define JAXDNN_ACT_CASE(o) \
  case o: fn(std::integral_constant<Op, o>{}); return true;
    JAXDNN_ACTIVATION_OPS(JAXDNN_ACT_CASE)
#undef JAXDNN_ACT_CASE
  }
  return false;
}

// CPU kernels (cpu_activation.cc), on the intra-op thread pool.
Status cpu_forward(const Problem& p, const void* x, void* y, const Parallel& par);
Status cpu_backward(const Problem& p, const void* x, const void* dy, void* dx,
                    const Parallel& par);

}  // namespace jaxdnn::activation
