#include <cstring>

#include "cc/conv/cpu_algorithms.h"

namespace jaxdnn::conv {

const std::vector<const CpuAlgorithm*>& cpu_algorithms() {
  static const std::vector<const CpuAlgorithm*> kAll = {
      &kCpuDirect,
  };
  return kAll;
}

const CpuAlgorithm* find_cpu_algorithm(const char* name) {
  for (const CpuAlgorithm* a : cpu_algorithms())
    if (std::strcmp(a->name, name) == 0) return a;
  return nullptr;
}

}  // namespace jaxdnn::conv
