// The CUDA softmax algorithms (a registry, like conv's: chosen per problem at lowering time by
// jaxdnn/algo.py, named in the custom call): enqueued on `stream`, no allocation, no sync.
//   rows    the row in registers: one HBM read (cuda_softmax_rows.cu), rows up to 16K
//           floats / 8K doubles
//   online  any row length: online max/sum, then a second pass (cuda_softmax_online.cu)
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "cc/softmax/softmax.h"

namespace jaxdnn::softmax {

struct CudaAlgorithm {
  const char* name;
  Support (*supports)(const Problem&);
};

const std::vector<const CudaAlgorithm*>& cuda_algorithms();

Status cuda_forward(const char* algo, const Problem& p, bool log, const void* x, void* y,
                    cudaStream_t stream);
Status cuda_backward(const char* algo, const Problem& p, Linear kind, const void* y,
                     const void* c, void* out, cudaStream_t stream);

}  // namespace jaxdnn::softmax
