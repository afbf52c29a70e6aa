// The CPU convolution algorithm registry. Each algorithm lives in its own file and defines
// one CpuAlgorithm; cpu_registry.cc lists them (adding an algorithm is one file and one line).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cc/common/parallel.h"
#include "cc/common/status.h"
#include "cc/conv/conv.h"
#include "cc/conv/epilogue.h"
#include "cc/conv/variant.h"

namespace jaxdnn::conv {

struct CpuAlgorithm {
  const char* name;
  bool deterministic;
  Support (*supports)(const Args&);
  // Bytes of temporary memory one call allocates (for reporting and workspace limits).
  int64_t (*workspace_bytes)(const Args&, int num_threads);
  Status (*run)(const Args&, const Buffers&, const Parallel&);
  // Every CPU algorithm runs empty problems (variant.h: algorithm_supports).
  static constexpr bool kTiledEmpty = false;
  // The options its name may carry (space-separated; variant.h), and the options of the
  // variant that runs a problem (nullptr: it has none).
  const char* options = "";
  std::string (*resolve)(const Args&) = nullptr;
};

extern const CpuAlgorithm kCpuDirect;       // cpu_direct.cc: the oracle
extern const CpuAlgorithm kCpuIm2colGemm;   // cpu_im2col_gemm.cc: im2col + blocked GEMM

const std::vector<const CpuAlgorithm*>& cpu_algorithms();

// The fused epilogue's pass over a forward's result (epilogue.h; cpu_epilogue.cc).
Status cpu_epilogue(const Epilogue& e, const EpilogueBuffers& b, const Parallel& par);

}  // namespace jaxdnn::conv
