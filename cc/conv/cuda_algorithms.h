// The CUDA convolution algorithm registry (host side). Each algorithm lives in its own
// cuda_*.cu file and defines one CudaAlgorithm; cuda_registry.cu lists them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cc/common/status.h"
#include "cc/conv/conv.h"

namespace jaxdnn::conv {

struct CudaAlgorithm {
  const char* name;
  bool deterministic;
  bool tensor_cores;
  Support (*supports)(const Args&);
  int64_t (*workspace_bytes)(const Args&);
  // Enqueues the computation on `stream`; `workspace` has workspace_bytes(args) bytes.
  Status (*run)(const Args&, const Buffers&, void* workspace, cudaStream_t stream);
};

extern const CudaAlgorithm kCudaDirect;  // cuda_direct.cu: the GPU oracle
// cuda_implicit_gemm.cu: tensor-core implicit GEMM, plain and split-K (ordered / atomic)
extern const CudaAlgorithm kCudaImplicitGemm;
extern const CudaAlgorithm kCudaImplicitGemmSplitK;
extern const CudaAlgorithm kCudaImplicitGemmSplitKAtomic;
extern const CudaAlgorithm kCudaImplicitPrecompGemm;  // cuda_implicit_precomp_gemm.cu
extern const CudaAlgorithm kCudaIm2colGemm;           // cuda_im2col_gemm.cu

const std::vector<const CudaAlgorithm*>& cuda_algorithms();
const CudaAlgorithm* find_cuda_algorithm(const char* name);

}  // namespace jaxdnn::conv
