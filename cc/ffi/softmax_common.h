// Softmax pieces shared by the CPU and CUDA handlers: buffers -> softmax::Problem.
//
//   jaxdnn_softmax_fwd(x)       -> y     attribute: log (bool)
//   jaxdnn_softmax_bwd(y, c)    -> out   attribute: kind (int64, softmax::Linear)
// Operands of any rank >= 1; the reduction runs along the last axis.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>

#include "cc/ffi/common.h"
#include "cc/softmax/softmax.h"

namespace jaxdnn::ffi_util {

// Checks that every buffer has the dtype and dimensions of the first. On failure returns an
// error message.
inline std::string make_softmax_problem(std::initializer_list<const ffi::AnyBuffer*> buffers,
                                        softmax::Problem* out) {
  const ffi::AnyBuffer& first = **buffers.begin();
  auto dtype = to_dtype(first.element_type());
  if (!dtype) return "operands must be float32, float64, float16 or bfloat16";
  auto dims = first.dimensions();
  if (dims.size() == 0) return "operands must have rank >= 1";
  for (const ffi::AnyBuffer* b : buffers) {
    auto d = b->dimensions();
    if (b->element_type() != first.element_type() || d.size() != dims.size() ||
        !std::equal(d.begin(), d.end(), dims.begin()))
      return "operands and result must have one dtype and one shape";
  }
  const int64_t cols = dims[dims.size() - 1];
  *out = {*dtype, cols == 0 ? 0 : int64_t(first.element_count()) / cols, cols};
  return {};
}

}  // namespace jaxdnn::ffi_util
