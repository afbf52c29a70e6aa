// Handler registration. Each handler file registers its targets with
//   JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_<name>", kHandler);   (files cc/ffi/*_cpu.cc)
//   JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_<name>", kHandler);  (files cc/ffi/*_cuda.cc)
// and the modules (module_cpu.cc, module_cuda.cc) return the lists from registrations(), so an
// op family adds handlers without touching shared files. Every target name is registered on
// both platforms with the same operands and attributes.
#pragma once

#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jaxdnn::ffi_util {

using HandlerList = std::vector<std::pair<const char*, XLA_FFI_Handler*>>;

HandlerList& cpu_handlers();   // defined in module_cpu.cc
HandlerList& cuda_handlers();  // defined in module_cuda.cc

struct HandlerRegistrar {
  HandlerRegistrar(HandlerList& (*list)(), const char* name, XLA_FFI_Handler* handler) {
    list().emplace_back(name, handler);
  }
};

}  // namespace jaxdnn::ffi_util

#define JAXDNN_CONCAT_INNER(a, b) a##b
#define JAXDNN_CONCAT(a, b) JAXDNN_CONCAT_INNER(a, b)
#define JAXDNN_REGISTER_CPU_HANDLER(name, handler)                                 \
  static ::jaxdnn::ffi_util::HandlerRegistrar JAXDNN_CONCAT(jaxdnn_reg_, __COUNTER__)( \
      ::jaxdnn::ffi_util::cpu_handlers, name, handler)
#define JAXDNN_REGISTER_CUDA_HANDLER(name, handler)                                \
  static ::jaxdnn::ffi_util::HandlerRegistrar JAXDNN_CONCAT(jaxdnn_reg_, __COUNTER__)( \
      ::jaxdnn::ffi_util::cuda_handlers, name, handler)
