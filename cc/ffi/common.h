// Helpers shared by every FFI handler: dtype mapping and Status -> ffi::Error.
#pragma once

#include <optional>
#include <string>

#include "cc/common/dtype.h"
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

}  // namespace jaxdnn::ffi_util
