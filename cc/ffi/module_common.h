// nanobind glue shared by the CPU and CUDA modules.
#pragma once

#include <nanobind/nanobind.h>

#include "cc/ffi/handlers.h"

namespace jaxdnn::ffi_util {

inline nanobind::dict to_registrations(const HandlerList& list) {
  nanobind::dict d;
  for (const auto& [name, handler] : list)
    d[name] = nanobind::capsule(reinterpret_cast<void*>(handler));
  return d;
}

}  // namespace jaxdnn::ffi_util
