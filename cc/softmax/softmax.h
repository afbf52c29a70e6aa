// softmax and log_softmax over the last axis of a (rows, cols) row-major array, and the
// backward kernels: the linear maps their derivatives need. Other axes are moved last in Python.
//
//   forward   x -> y          softmax:      y = exp(x - m) / s,   m = max(x), s = sum exp(x - m)
//                             log_softmax:  y = x - m - log(s)
//   backward  (y, c) -> out   kSoftmax:        y * (c - sum(y c))          vjp = jvp (symmetric)
//                             kLogSoftmaxVjp:  c - exp(y) * sum(c)
//                             kLogSoftmaxJvp:  c - sum(exp(y) c)           transpose of the above
// All sums run along a row. Like jax.nn: a row holding +inf or NaN gives NaN everywhere, and a
// row of only -inf gives NaN (0/0); -inf elsewhere gives softmax 0 and log_softmax -inf.
//
// Traffic (minimal): forward reads and writes rows*cols elements once, backward reads 2x and
// writes 1x.
#pragma once

#include <cstdint>

#include "cc/common/dtype.h"
#include "cc/common/parallel.h"
#include "cc/common/status.h"

namespace jaxdnn::softmax {

// The backward kernel's linear map. Part of the FFI contract (jaxdnn/ops/softmax.py uses the
// same codes).
enum class Linear : int { kSoftmax = 0, kLogSoftmaxVjp = 1, kLogSoftmaxJvp = 2 };
constexpr int kNumLinear = 3;

struct Problem {
  DType dtype;  // of every operand and result
  int64_t rows, cols;
};

// CPU kernels (cpu_softmax.cc), on the intra-op thread pool.
Status cpu_forward(const Problem& p, bool log, const void* x, void* y, const Parallel& par);
Status cpu_backward(const Problem& p, Linear kind, const void* y, const void* c, void* out,
                  const Parallel& par);

}  // namespace jaxdnn::softmax
