// The x86-64 instruction sets the CPU GEMM (cpu_gemm.h) is compiled for. A conv algorithm's name
// may pin one (cc/conv/variant.h: the options generic, avx2 and avx512).
#pragma once

#include <cstdint>

namespace jaxdnn {

enum class CpuIsa : int8_t {
  kAuto = 0,  // the best one the CPU supports (cpu_gemm.h: best_isa)
  kGeneric,   // baseline x86-64
  kAvx2,      // AVX2, FMA and F16C
  kAvx512,    // AVX-512 F, VL, BW and DQ (and the AVX2 set)
};

// The option naming `isa`: "generic", "avx2" or "avx512" ("auto" for kAuto).
inline const char* isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kGeneric: return "generic";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAuto: break;
  }
  return "auto";
}

}  // namespace jaxdnn
