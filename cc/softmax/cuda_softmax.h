// CUDA softmax kernels (cuda_softmax.cu picks one): enqueued on `stream`, no allocation, no
// sync.
#pragma once

#include <cuda_runtime.h>

#include "cc/softmax/softmax.h"

namespace jaxdnn::softmax {

Status cuda_forward(const Problem& p, bool log, const void* x, void* y, cudaStream_t stream);
Status cuda_backward(const Problem& p, Linear kind, const void* y, const void* c, void* out,
                     cudaStream_t stream);

}  // namespace jaxdnn::softmax
