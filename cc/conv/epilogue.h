// The fused epilogue of a forward convolution (jaxdnn.conv(..., bias=, activation=, residual=)):
//   z = conv(x, w) + bias[k] + residual,   y = act(z)
// per output element (row m = (n, z, p, q), channel k of K), in the accumulator type (float, or
// double for float64 results), rounded once to y's dtype; z (the pre-activation, which the
// backward of an activation other than relu needs) is written too when asked for.
//
// It runs as one pass over the convolution's result inside the same call, after any algorithm
// (cpu_epilogue.cc, cuda_epilogue.cu): read y, bias, the residual, write y (and z). Traffic
// against the unfused chain (XLA's bias add, jaxdnn's activation, XLA's residual add): one
// pass instead of three, each reading and writing y.
#pragma once

#include <cstdint>

#include "cc/activation/activation.h"
#include "cc/common/dtype.h"
#include "cc/common/status.h"

namespace jaxdnn::conv {

struct Epilogue {
  bool act = false;  // apply activation `op` (activation.h codes) with `alpha`
  activation::Op op = activation::Op::kRelu;
  double alpha = 0;
  int64_t rows = 0, K = 0;       // y is (rows, K)
  DType dtype = DType::kF32;     // of y, z and the residual; bias is the accumulator type
};

struct EpilogueBuffers {
  void* y = nullptr;               // in: the convolution; out: act(z)
  void* z = nullptr;               // out, or null
  const void* bias = nullptr;      // (K,) or null
  const void* residual = nullptr;  // like y, or null
};

// The passes: cpu_epilogue (cpu_algorithms.h) and cuda_epilogue (cuda_algorithms.h).

}  // namespace jaxdnn::conv
