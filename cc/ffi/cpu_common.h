// Helpers for CPU handlers.
#pragma once

#include <initializer_list>

#include "cc/ffi/common.h"
#include "cc/ffi/cpu_parallel.h"

namespace jaxdnn::ffi_util {

// The CPU side of a handler body that both platforms share (cuda_common.h: CudaPlatform): the
// context the handler binds, what the kernels run on, how outputs are poisoned, and the
// handler's traits.
struct CpuPlatform {
  using Context = ffi::ThreadPool;
  static constexpr std::initializer_list<ffi::Traits> kTraits = {};
  static auto bind() { return ffi::Ffi::Bind().Ctx<ffi::ThreadPool>(); }
  static FfiParallel exec(ffi::ThreadPool pool) { return FfiParallel(pool); }
  static ffi::Error poison(ffi::AnyBuffer& result, ffi::ThreadPool) {
    poison_host(result);
    return ffi::Error::Success();
  }
};

}  // namespace jaxdnn::ffi_util
