#include "cc/conv/cpu_algorithms.h"

namespace jaxdnn::conv {

const std::vector<const CpuAlgorithm*>& cpu_algorithms() {
  static const std::vector<const CpuAlgorithm*> kAll = {
      &kCpuDirect,
      &kCpuIm2colGemm,
  };
  return kAll;
}

}  // namespace jaxdnn::conv
