// The CUDA convolution algorithm registry (host side). Each algorithm lives in its own
// cuda_*.cu file and defines one CudaAlgorithm; cuda_registry.cu lists them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cc/common/status.h"
#include "cc/conv/conv.h"
#include "cc/conv/epilogue.h"
#include "cc/conv/variant.h"

namespace jaxdnn::conv {

struct CudaAlgorithm {
  const char* name;
  bool deterministic;
  bool tensor_cores;
  Support (*supports)(const Args&);
  int64_t (*workspace_bytes)(const Args&);
  // Enqueues the computation on `stream`; `workspace` has workspace_bytes(args) bytes.
  Status (*run)(const Args&, const Buffers&, void* workspace, cudaStream_t stream);
  // Empty problems run on direct alone (variant.h: algorithm_supports).
  static constexpr bool kTiledEmpty = true;
  // The options its name may carry (space-separated; variant.h), and the options of the
  // variant that runs a problem (nullptr: it has none).
  const char* options = "";
  std::string (*resolve)(const Args&) = nullptr;
};

extern const CudaAlgorithm kCudaDirect;  // cuda_direct.cu: the GPU oracle
// cuda_implicit_gemm.cu: tensor-core implicit GEMM, plain and split-K (ordered / atomic)
extern const CudaAlgorithm kCudaImplicitGemm;
extern const CudaAlgorithm kCudaImplicitGemmSplitK;
extern const CudaAlgorithm kCudaImplicitGemmSplitKAtomic;
extern const CudaAlgorithm kCudaImplicitPrecompGemm;  // cuda_implicit_precomp_gemm.cu
extern const CudaAlgorithm kCudaIm2colGemm;           // cuda_im2col_gemm.cu
// Transforms: inf and NaN spread over a tile instead of propagating per output (conv.h).
extern const CudaAlgorithm kCudaWinograd;          // cuda_winograd.cu: fused F(2x2,3x3)
extern const CudaAlgorithm kCudaWinogradNonfused;  // cuda_winograd_nonfused.cu: F(4x4,3x3)
extern const CudaAlgorithm kCudaFft;        // cuda_fft.cu: one FFT plane per image
extern const CudaAlgorithm kCudaFftTiling;  // cuda_fft_tiling.cu: overlap-save tiles
extern const CudaAlgorithm kCudaDepthwise;  // cuda_depthwise.cu: groups == C
extern const CudaAlgorithm kCudaDepthwise3x3;  // cuda_depthwise_3x3.cu: 3x3 stride 1, K == C

const std::vector<const CudaAlgorithm*>& cuda_algorithms();

// The fused epilogue's pass over a forward's result (epilogue.h; cuda_epilogue.cu), enqueued on
// `stream`.
Status cuda_epilogue(const Epilogue& e, const EpilogueBuffers& b, cudaStream_t stream);

// Pieces of a workspace start on 256-byte boundaries (the alignment XLA gives the whole).
inline int64_t align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// cuda_find.cu: runs `alg` on a problem `repeats` times on buffers and a stream of its own,
// appending each run's device time (CUDA events, milliseconds) to *ms.
Status time_cuda_algorithm(const CudaAlgorithm& alg, const Args& a, int repeats,
                           std::vector<float>* ms);

}  // namespace jaxdnn::conv
