// CUDA entry points of the norm kernels (cc/norm/norm.h describes the problem and buffers).
// Each only enqueues kernels (and memsets) on `stream`: no allocation, no synchronisation, so
// a caller can capture it in a CUDA graph. Results are deterministic.
#pragma once

#include <cuda_runtime.h>

#include "cc/common/status.h"
#include "cc/norm/norm.h"

namespace jaxdnn::norm {

Status cuda_forward(const Problem& p, const FwdBuffers& b, cudaStream_t stream);
// The training forward as two calls (column and segment paths; norm.h's two_call_forward says
// where the lowering uses them): the statistics (mean, var, and the workspace the apply reads;
// b.y unused), then y from them (b.mean, b.var, b.ws as written).
Status cuda_forward_stats(const Problem& p, const FwdBuffers& b, cudaStream_t stream);
Status cuda_forward_apply(const Problem& p, const FwdBuffers& b, cudaStream_t stream);
Status cuda_inference(const Problem& p, const FwdBuffers& b, cudaStream_t stream);
Status cuda_backward(const Problem& p, const BwdBuffers& b, cudaStream_t stream);

}  // namespace jaxdnn::norm
