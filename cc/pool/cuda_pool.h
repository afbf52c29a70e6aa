// CUDA entry point of the pooling kernels (cuda_pool.cu, cuda_global.cu).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "cc/pool/pool.h"

namespace jaxdnn::pool {

// The CUDA registry (cuda_pool.cu), in preference order: forward "global" (one window over
// the whole input, split across threads and blocks: cuda_global.cu), "tile" (windows that tile
// the input, 2x2/2), "strip" (3x3/2-like windows, each input row read once per strip),
// "window" (any window); backward "gather" (each input element visits its windows; max_gather
// one thread per output element).
const std::vector<const Algorithm*>& cuda_algorithms();

// Enqueues `args.op` with `algo` (which supports args: the handlers check) on `stream`: no
// allocation, no synchronisation (CUDA-graph safe).
Status cuda_run(const Algorithm& algo, const Args& args, const Buffers& bufs,
                cudaStream_t stream);

}  // namespace jaxdnn::pool
