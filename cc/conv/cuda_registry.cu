#include "cc/conv/cuda_algorithms.h"

namespace jaxdnn::conv {

const std::vector<const CudaAlgorithm*>& cuda_algorithms() {
  static const std::vector<const CudaAlgorithm*> kAll = {
      &kCudaDirect,
      &kCudaImplicitGemm,
      &kCudaImplicitGemmSplitK,
      &kCudaImplicitGemmSplitKAtomic,
      &kCudaImplicitPrecompGemm,
      &kCudaIm2colGemm,
      &kCudaWinograd,
      &kCudaWinogradNonfused,
      &kCudaFft,
      &kCudaFftTiling,
      &kCudaDepthwise,
      &kCudaDepthwise3x3,
  };
  return kAll;
}

}  // namespace jaxdnn::conv
