// CUDA activation kernels (cuda_activation.cu): enqueued on `stream`, no allocation, no sync.
#pragma once

#include <cuda_runtime.h>

#include "cc/activation/activation.h"

namespace jaxdnn::activation {

Status cuda_forward(const Problem& p, const void* x, void* y, cudaStream_t stream);
Status cuda_backward(const Problem& p, const void* x, const void* dy, void* dx,
                     cudaStream_t stream);

}  // namespace jaxdnn::activation
