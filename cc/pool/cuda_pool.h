// CUDA entry point of the pooling kernels (cuda_pool.cu, cuda_global.cu).
#pragma once

#include <cuda_runtime.h>

#include "cc/pool/pool.h"

namespace jaxdnn::pool {

// Enqueues `args.op` on `stream`: no allocation, no synchronisation (CUDA-graph safe).
Status cuda_run(const Args& args, const Buffers& bufs, cudaStream_t stream);

}  // namespace jaxdnn::pool
