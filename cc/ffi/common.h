// Helpers shared by every FFI handler: dtype mapping and Status -> ffi::Error.
#pragma once

#include <cstring>
#include <optional>
#include <string>

#include "cc/common/dtype.h"
#include "cc/common/env.h"
#include "cc/common/status.h"
#include "xla/ffi/api/ffi.h"

namespace jaxdnn::ffi_util {

namespace ffi = xla::ffi;

inline std::optional<DType> to_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::kF32;
    case ffi::DataType::F64: return DType::kF64;
    case ffi::DataType::F16: return DType::kF16;
    case ffi::DataType::BF16: return DType::kBF16;
    default: return std::nullopt;
  }
}

inline ffi::Error to_error(const Status& s) {
  return s.ok() ? ffi::Error::Success() : ffi::Error(ffi::ErrorCode::kInternal, s.message);
}

inline ffi::Error invalid(const std::string& what) {
  return ffi::Error::InvalidArgument(what);
}

// JAXDNN_POISON_OUTPUTS=1 (set by the test suite) makes every handler fill its results with
// 0xFF bytes (NaN in every float dtype) before the kernel runs, so an element a kernel forgets
// to write fails the tests instead of passing with stale memory.
inline bool poison_outputs() {
  static const bool on = [] {
    const char c = env_switch("JAXDNN_POISON_OUTPUTS");
    return c != '\0' && c != '0';
  }();
  return on;
}

inline void poison_host(ffi::AnyBuffer& result) {
  if (poison_outputs()) std::memset(result.untyped_data(), 0xFF, result.size_bytes());
}

}  // namespace jaxdnn::ffi_util
