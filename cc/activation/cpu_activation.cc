// CPU activation kernels: one elementwise loop per direction, instantiated per (op, dtype).
//
// The array is cut into chunks of kChunk elements, one parallel task each; a task runs its
// loop compiled for the CPU's widest vector ISA (cpu_math::with_best_isa). The formulas use
// cpu_math's branch-free exp/expm1/log1p/tanh (and activation_math.h's normal CDF), so the
// loops vectorise; bfloat16 loads and stores convert in-register. Traffic: forward reads n +
// writes n elements, backward reads 2n + writes n, each once.

#include <algorithm>
#include <cmath>

#include "cc/activation/activation.h"
#include "cc/activation/activation_math.h"
#include "cc/activation/cpu_math_policy.h"
#include "cc/common/cpu_math.h"

namespace jaxdnn::activation {
namespace {

namespace cm = cpu_math;

// 64K elements (256 KiB of float32 per operand) per task: large enough to amortise the task
// hand-out, small enough to balance two to dozens of threads.
constexpr int64_t kChunk = 65536;

template <typename Body>
void for_each_chunk(int64_t n, const Parallel& par, const Body& body) {
  par.for_each((n + kChunk - 1) / kChunk, [&](int64_t task) {
    const int64_t begin = task * kChunk, len = std::min(kChunk, n - begin);
    cm::with_best_isa([&] { body(begin, len); });
  });
}

template <Op kOp, typename T>
JAXDNN_INLINE void forward_loop(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                acc_t<T> alpha) {
  for (int64_t i = 0; i < n; ++i) y[i] = cm::store<T>(forward<kOp, CpuMath>(cm::load(x[i]), alpha));
}

template <Op kOp, typename T>
JAXDNN_INLINE void backward_loop(const T* __restrict__ x, const T* __restrict__ dy,
                                 T* __restrict__ dx, int64_t n, acc_t<T> alpha) {
  for (int64_t i = 0; i < n; ++i)
    dx[i] = cm::store<T>(backward<kOp, CpuMath>(cm::load(x[i]), cm::load(dy[i]), alpha));
}

}  // namespace

Status cpu_forward(const Problem& p, const void* x, void* y, const Parallel& par) {
  bool dtype_ok = false;
  const bool op_ok = dispatch_op(p.op, [&](auto op) {
    dtype_ok = dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
      using T = decltype(tag);
      const T* xt = static_cast<const T*>(x);
      T* yt = static_cast<T*>(y);
      const acc_t<T> alpha = acc_t<T>(p.alpha);
      for_each_chunk(p.n, par, [&](int64_t begin, int64_t len) {
        forward_loop<decltype(op)::value>(xt + begin, yt + begin, len, alpha);
      });
    });
  });
  return op_ok && dtype_ok ? Status::Ok()
                           : Status::Error("jaxdnn activation: unknown op code or dtype");
}

Status cpu_backward(const Problem& p, const void* x, const void* dy, void* dx,
                    const Parallel& par) {
  bool dtype_ok = false;
  const bool op_ok = dispatch_op(p.op, [&](auto op) {
    dtype_ok = dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
      using T = decltype(tag);
      const T* xt = static_cast<const T*>(x);
      const T* dyt = static_cast<const T*>(dy);
      T* dxt = static_cast<T*>(dx);
      const acc_t<T> alpha = acc_t<T>(p.alpha);
      for_each_chunk(p.n, par, [&](int64_t begin, int64_t len) {
        backward_loop<decltype(op)::value>(xt + begin, dyt + begin, dxt + begin, len, alpha);
      });
    });
  });
  return op_ok && dtype_ok ? Status::Ok()
                           : Status::Error("jaxdnn activation: unknown op code or dtype");
}

}  // namespace jaxdnn::activation
