// CPU softmax kernels: rows split into parallel tasks of about kTaskElems elements; each row
// is processed in passes that stay in L1/L2 (a 4096-float row is 16 KiB), so memory sees one
// read of each input and one write of the output.
//
//   forward:  [16-bit only: convert the row to float]  max  ->  e = exp(x - max)  ->  sum(e)
//             -> y = e / sum (softmax) or (x - max) - log(sum) (log_softmax)
//   backward: [convert]  t = summand(y, c)  ->  r = sum(t)  ->  output(y, c, r)  (softmax_math.h)
//
// Every pass is a simple loop that vectorises (cpu_math's exp, reductions into per-lane partial
// results, which keeps them deterministic and reassociation-free) compiled for the CPU's widest
// vector ISA.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cc/common/cpu_math.h"
#include "cc/softmax/softmax.h"
#include "cc/softmax/softmax_math.h"

namespace jaxdnn::softmax {
namespace {

namespace cm = cpu_math;

constexpr int64_t kTaskElems = 32768;  // elements per parallel task (whole rows, at least one)

// Partial results of a row reduction: two 512-bit vectors' worth, so two independent chains.
template <typename A> constexpr int kLanes = 2 * 64 / int(sizeof(A));

template <typename A>
JAXDNN_INLINE A row_max(const A* __restrict__ v, int64_t n) {
  A acc[kLanes<A>];
  for (int l = 0; l < kLanes<A>; ++l) acc[l] = -std::numeric_limits<A>::infinity();
  int64_t i = 0;
  for (; i + kLanes<A> <= n; i += kLanes<A>)
    for (int l = 0; l < kLanes<A>; ++l) acc[l] = cm::select(v[i + l] > acc[l], v[i + l], acc[l]);
  for (; i < n; ++i) acc[0] = cm::select(v[i] > acc[0], v[i], acc[0]);
  A m = acc[0];
  for (int l = 1; l < kLanes<A>; ++l) m = cm::select(acc[l] > m, acc[l], m);
  return m;
}

template <typename A>
JAXDNN_INLINE A row_sum(const A* __restrict__ v, int64_t n) {
  A acc[kLanes<A>] = {};
  int64_t i = 0;
  for (; i + kLanes<A> <= n; i += kLanes<A>)
    for (int l = 0; l < kLanes<A>; ++l) acc[l] += v[i + l];
  for (; i < n; ++i) acc[0] += v[i];
  A s = 0;
  for (int l = 0; l < kLanes<A>; ++l) s += acc[l];
  return s;
}

// The row as compute-type values: the input itself for float/double, else converted into buf.
template <typename T, typename A = acc_t<T>>
JAXDNN_INLINE const A* row_values(const T* __restrict__ x, int64_t n, A* __restrict__ buf) {
  if constexpr (std::is_same_v<T, A>) {
    return x;
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = cm::load(x[i]);
    return buf;
  }
}

// buf: 2n values of scratch.
template <bool kLog, typename T, typename A = acc_t<T>>
JAXDNN_INLINE void forward_row(const T* __restrict__ x, T* __restrict__ y, int64_t n, A* buf) {
  const A* __restrict__ v = row_values(x, n, buf + n);
  A* __restrict__ e = buf;
  const A m = row_max(v, n);
  for (int64_t i = 0; i < n; ++i) e[i] = cm::exp(v[i] - m);
  const A s = row_sum(e, n);
  if constexpr (kLog) {
    const A log_s = std::log(s);
    for (int64_t i = 0; i < n; ++i) y[i] = cm::store<T>((v[i] - m) - log_s);
  } else {
    const A inv = A(1) / s;
    for (int64_t i = 0; i < n; ++i) y[i] = cm::store<T>(e[i] * inv);
  }
}

struct CpuMath {
  template <typename A> static JAXDNN_INLINE A exp(A x) { return cm::exp(x); }
};

// buf: 3n values of scratch.
template <Linear kKind, typename T, typename A = acc_t<T>>
JAXDNN_INLINE void backward_row(const T* __restrict__ y, const T* __restrict__ c,
                                T* __restrict__ out, int64_t n, A* buf) {
  const A* __restrict__ vy = row_values(y, n, buf + n);
  const A* __restrict__ vc = row_values(c, n, buf + 2 * n);
  A* __restrict__ t = buf;
  for (int64_t i = 0; i < n; ++i) t[i] = summand<kKind, CpuMath>(vy[i], vc[i]);
  const A r = row_sum(t, n);
  for (int64_t i = 0; i < n; ++i) out[i] = cm::store<T>(output<kKind, CpuMath>(vy[i], vc[i], r));
}

// Runs row_fn(row, scratch) for every row, whole rows per task.
template <typename A, typename RowFn>
void for_each_row(const Problem& p, int scratch_rows, const Parallel& par, const RowFn& row_fn) {
  const int64_t rows_per_task = std::max<int64_t>(1, kTaskElems / std::max<int64_t>(p.cols, 1));
  par.for_each((p.rows + rows_per_task - 1) / rows_per_task, [&](int64_t task) {
    const int64_t begin = task * rows_per_task, end = std::min(p.rows, begin + rows_per_task);
    A* buf = thread_scratch<A>(scratch_rows * p.cols);
    cm::with_best_isa([&] {
      for (int64_t r = begin; r < end; ++r) row_fn(r * p.cols, buf);
    });
  });
}

}  // namespace

Status cpu_forward(const Problem& p, bool log, const void* x, void* y, const Parallel& par) {
  const bool known = dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    const int64_t n = p.cols;
    if (log)
      for_each_row<A>(p, 2, par, [&](int64_t o, A* buf) { forward_row<true>(xt + o, yt + o, n, buf); });
    else
      for_each_row<A>(p, 2, par, [&](int64_t o, A* buf) { forward_row<false>(xt + o, yt + o, n, buf); });
  });
  return known ? Status::Ok() : Status::Error("jaxdnn softmax: unsupported dtype");
}

Status cpu_backward(const Problem& p, Linear kind, const void* y, const void* c, void* out,
                  const Parallel& par) {
  const bool known = dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* yt = static_cast<const T*>(y);
    const T* ct = static_cast<const T*>(c);
    T* ot = static_cast<T*>(out);
    const int64_t n = p.cols;
    auto run = [&](auto kind_tag) {
      constexpr Linear kKind = decltype(kind_tag)::value;
      for_each_row<A>(p, 3, par, [&](int64_t o, A* buf) {
        backward_row<kKind>(yt + o, ct + o, ot + o, n, buf);
      });
    };
    switch (kind) {
      case Linear::kSoftmax: run(std::integral_constant<Linear, Linear::kSoftmax>{}); break;
      case Linear::kLogSoftmaxVjp: run(std::integral_constant<Linear, Linear::kLogSoftmaxVjp>{}); break;
      case Linear::kLogSoftmaxJvp: run(std::integral_constant<Linear, Linear::kLogSoftmaxJvp>{}); break;
    }
  });
  return known ? Status::Ok() : Status::Error("jaxdnn softmax: unsupported dtype");
}

}  // namespace jaxdnn::softmax
