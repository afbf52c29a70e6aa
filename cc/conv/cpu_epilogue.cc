// The fused epilogue's pass on the CPU (epilogue.h): z = y + bias + residual, y = act(z), per
// chunk of whole rows, one parallel task each, the loop compiled for the widest vector ISA
// (activation_math.h's formulas on cpu_math, as the activation kernels). Traffic: read y (and
// the residual), write y (and z).

#include <algorithm>

#include "cc/activation/activation_math.h"
#include "cc/activation/cpu_math_policy.h"
#include "cc/conv/cpu_algorithms.h"

namespace jaxdnn::conv {
namespace {

namespace cm = cpu_math;

constexpr int64_t kChunkValues = 65536;  // values per task (256 KiB of float32 per operand)

template <activation::Op kOp, typename T>
void epilogue_rows(const Epilogue& e, const EpilogueBuffers& b, int64_t r0, int64_t r1) {
  using A = acc_t<T>;
  T* y = static_cast<T*>(b.y);
  T* z = static_cast<T*>(b.z);
  const A* bias = static_cast<const A*>(b.bias);
  const T* res = static_cast<const T*>(b.residual);
  const A alpha = A(e.alpha);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t base = r * e.K;
    for (int64_t k = 0; k < e.K; ++k) {
      A v = cm::load(y[base + k]);
      if (bias) v += bias[k];
      if (res) v += cm::load(res[base + k]);
      if (z) z[base + k] = cm::store<T>(v);
      if (e.act) v = activation::forward<kOp, activation::CpuMath>(v, alpha);
      y[base + k] = cm::store<T>(v);
    }
  }
}

}  // namespace

Status cpu_epilogue(const Epilogue& e, const EpilogueBuffers& b, const Parallel& par) {
  if (e.rows * e.K == 0) return Status::Ok();
  const int64_t rows_per_task = std::max<int64_t>(1, kChunkValues / std::max<int64_t>(e.K, 1));
  const int64_t tasks = (e.rows + rows_per_task - 1) / rows_per_task;
  bool dtype_ok = false;
  const bool op_ok = activation::dispatch_op(e.op, [&](auto op) {
    dtype_ok = dispatch_io(e.dtype, e.dtype, [&](auto tag, auto) {
      using T = decltype(tag);
      par.for_each(tasks, [&](int64_t t) {
        const int64_t r0 = t * rows_per_task, r1 = std::min(e.rows, r0 + rows_per_task);
        cm::with_best_isa([&] { epilogue_rows<decltype(op)::value, T>(e, b, r0, r1); });
      });
    });
  });
  if (!op_ok) return Status::Error("conv epilogue: unknown activation code");
  if (!dtype_ok) return Status::Error(std::string("conv epilogue: unsupported dtype ") +
                                      dtype_name(e.dtype));
  return Status::Ok();
}

}  // namespace jaxdnn::conv
