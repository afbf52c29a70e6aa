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

// Calls fn(std::integral_constant<Op, op>{}) for a runtime op; false for an unknown code.
template <typename Fn>
bool dispatch_op(Op op, Fn&& fn) {
  switch (op) {
#define JAXDNN_ACT_CASE(o) \
  case o: fn(std::integral_constant<Op, o>{}); return true;
    JAXDNN_ACT_CASE(Op::kRelu)
    JAXDNN_ACT_CASE(Op::kRelu6)
    JAXDNN_ACT_CASE(Op::kLeakyRelu)
    JAXDNN_ACT_CASE(Op::kElu)
    JAXDNN_ACT_CASE(Op::kSigmoid)
    JAXDNN_ACT_CASE(Op::kTanh)
    JAXDNN_ACT_CASE(Op::kGeluTanh)
    JAXDNN_ACT_CASE(Op::kGeluErf)
    JAXDNN_ACT_CASE(Op::kSilu)
    JAXDNN_ACT_CASE(Op::kSoftplus)
#undef JAXDNN_ACT_CASE
  }
  return false;
}

// CPU kernels (cpu_activation.cc), on the intra-op thread pool.
Status cpu_forward(const Problem& p, const void* x, void* y, const Parallel& par);
Status cpu_backward(const Problem& p, const void* x, const void* dy, void* dx,
                    const Parallel& par);

}  // namespace jaxdnn::activation
