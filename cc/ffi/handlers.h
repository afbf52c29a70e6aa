// Handler registration. Each handler file registers its targets with
//   JAXDNN_REGISTER_CPU_HANDLER("jaxdnn_<name>", kHandler);   (files cc/ffi/*_cpu.cc)
//   JAXDNN_REGISTER_CUDA_HANDLER("jaxdnn_<name>", kHandler);  (files cc/ffi/*_cuda.cc)
// and the modules (module_cpu.cc, module_cuda.cc) return the lists from registrations(), so an
// op family adds handlers without touching shared files. Every target name is registered on
// both platforms with the same operands and attributes.
//
// The registered name carries the FFI version: "jaxdnn_<name>_v<JAXDNN_FFI_VERSION>". The
// version covers every target's operands, results and attributes (their order, types and
// meaning); bump it when any of them changes, so that a program exported with jax.export
// against one version fails to load ("no registered implementation") under another instead of
// running with wrong arguments. The modules report it as ffi_version(); jaxdnn/_ffi.py lowers
// to the versioned names.
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

#define JAXDNN_FFI_VERSION 3

#define JAXDNN_STRINGIFY_INNER(x) #x
#define JAXDNN_STRINGIFY(x) JAXDNN_STRINGIFY_INNER(x)
// The registered (versioned) name of the target `name`, a string literal.
#define JAXDNN_FFI_TARGET(name) name "_v" JAXDNN_STRINGIFY(JAXDNN_FFI_VERSION)

#define JAXDNN_CONCAT_INNER(a, b) a##b
#define JAXDNN_CONCAT(a, b) JAXDNN_CONCAT_INNER(a, b)
#define JAXDNN_REGISTER_CPU_HANDLER(name, handler)                                 \
  static ::jaxdnn::ffi_util::HandlerRegistrar JAXDNN_CONCAT(jaxdnn_reg_, __COUNTER__)( \
      ::jaxdnn::ffi_util::cpu_handlers, JAXDNN_FFI_TARGET(name), handler)
#define JAXDNN_REGISTER_CUDA_HANDLER(name, handler)                                \
  static ::jaxdnn::ffi_util::HandlerRegistrar JAXDNN_CONCAT(jaxdnn_reg_, __COUNTER__)( \
      ::jaxdnn::ffi_util::cuda_handlers, JAXDNN_FFI_TARGET(name), handler)
