#include "cc/common/registry.h"

#include "cc/conv/cpu_algorithms.h"

namespace jaxdnn::conv {

const std::vector<const CpuAlgorithm*>& cpu_algorithms() {
  static const std::vector<const CpuAlgorithm*> kAll = {
      &kCpuDirect,
      &kCpuIm2colGemm,
  };
  return kAll;
}

const CpuAlgorithm* find_cpu_algorithm(const char* name) {
  return find_by_name(cpu_algorithms(), name);
}

}  // namespace jaxdnn::conv
