// The fused epilogue of a forward convolution (jaxdnn.conv(..., bias=, activation=, residual=)):
//   c = conv(x, w),   y = act(c + bias[k] + residual)
// per output element (row m = (n, z, p, q), channel k of K), c rounded to y's dtype (as the
// unfused chain rounds the convolution's result), the rest in the accumulator type (float, or
// double for float64 results), rounded once to y's dtype.
//
// The wgmma GEMM kernels apply it as they store their result (FusedEpilogue below); after any
// other algorithm it runs as one pass over the convolution's result inside the same call
// (cpu_epilogue.cc, cuda_epilogue.cu): the algorithm writes c into y, and the pass reads it,
// bias and the residual and writes y in place; or, when the backward of the activation needs
// the pre-activation (every activation but relu), the algorithm writes c into its own output,
// which the call returns, and the pass reads c and writes y. Keeping c rather than the
// pre-activation z = c + bias + residual costs the backward a read of the residual (it
// recomputes z inside the derivative's fusion) and saves the forward a write of z. Traffic
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
  void* y = nullptr;               // out: act(c + bias + residual); in: c, when c is null
  const void* c = nullptr;         // the convolution's result when it is not in y, or null
  const void* bias = nullptr;      // (K,) or null
  const void* residual = nullptr;  // like y, or null
};

// The epilogue as a forward algorithm sees it (Args::epilogue). An algorithm whose kernels
// apply it on their way out (the wgmma GEMMs' dense stores: cuda_gemm_wgmma.cuh) sets
// `applied`; otherwise the call runs the pass after it. Only a kernel that stores straight into
// the algorithm's own result (`result()`), in its layout, may apply the epilogue.
struct FusedEpilogue {
  Epilogue e;
  EpilogueBuffers b;
  mutable bool applied = false;
  // Where the algorithm's result goes: c when the call keeps it, else y.
  const void* result() const { return b.c ? b.c : b.y; }
};

// The passes: cpu_epilogue (cpu_algorithms.h) and cuda_epilogue (cuda_algorithms.h).

}  // namespace jaxdnn::conv
