// Each op family's handler file appends its (target name, handler) pairs; the modules
// (module_cpu.cc, module_cuda.cc) turn the lists into registrations() dicts for Python.
#pragma once

#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jaxdnn::ffi_util {

using HandlerList = std::vector<std::pair<const char*, XLA_FFI_Handler*>>;

// CPU (module_cpu.cc)
void add_conv_cpu_handlers(HandlerList& out);

// CUDA (module_cuda.cc)
void add_conv_cuda_handlers(HandlerList& out);

}  // namespace jaxdnn::ffi_util
