// CPU segment path (T > 1; batch and group norm, channels-first): x is a sequence of
// P*A*C*K contiguous segments of T values; segment r = ((p*A + a)*C + c)*K + k belongs to
// group (p, c) and uses affine entry (q, c, k). Its partials sit at index r of the
// (P, S = A, C, K) workspace planes.
//   stats  moments of each segment (contiguous_moments).     Traffic: read x.
//   apply  y = (x - mean)*(rstd*scale) + bias.                Traffic: read x, write y.
//   grads  sums of dy*xhat and dy per segment.                Traffic: read x, dy.
//   dx     dx = scale*rstd*dy + (x - mean)*c1 + c2.           Traffic: read x, dy, write dx.
// Tasks take whole segments, about 32K values each, in memory order. A training forward that
// took whole groups per task through stats, merge and apply (apply re-reading x from L2, one
// pass fewer from memory) lost to these passes on a 2-core EPYC with a 32 MB L3, in batch norm
// (a group strided over the batch) and group norm (contiguous groups) alike: batch_norm
// 8x64x56x56 float32 409 us median against 586, group_norm 8x128x28x28 (32 groups) 305 against
// 355, 8x256x56x56 2236 against 3117, bfloat16 430 / 624 and 343 / 417 (docs/perf/norm.md).
// The passes walk long contiguous runs, which the hardware prefetchers follow.

#include "cc/norm/cpu_kernels.h"

namespace jaxdnn::norm::cpu {
namespace segment {

struct Segment {
  int64_t group, affine;  // (p*C + c), ((q*C + c)*K + k)
};

inline Segment locate(const Shape& s, int64_t r) {
  const int64_t k = r % s.K, c = r / s.K % s.C, p = r / (s.K * s.C * s.A);
  return {p * s.C + c, (p / s.Pq() * s.C + c) * s.K + k};
}

inline int64_t per_task(const Shape& s) { return std::max<int64_t>(1, 32768 / s.T); }

}  // namespace segment

using segment::locate;

template <typename T>
JAXDNN_ALWAYS_INLINE void segment_stats_range(const FwdView<T>& v, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const Moments m = contiguous_moments(v.x + r * v.s.T, v.s.T, v.centered);
    v.ws0[r] = m.mean;
    v.ws1[r] = m.m2;
  }
}

template <typename T>
JAXDNN_ALWAYS_INLINE void segment_apply_range(const FwdView<T>& v, int64_t r0, int64_t r1) {
  const int64_t T_ = v.s.T;
  for (int64_t r = r0; r < r1; ++r) {
    const segment::Segment sg = locate(v.s, r);
    const S<T> mu = v.mean[sg.group];
    const S<T> g = rstd_of<T>(v.var[sg.group], v.eps) * v.scale[sg.affine], b = v.bias[sg.affine];
    const T* x = v.x + r * T_;
    T* y = v.y + r * T_;
    for_lanes<T>(T_, [&](int64_t t, auto tag) { put(y, t, (at(x, t, tag) - mu) * g + b, tag); });
  }
}

template <typename T>
JAXDNN_ALWAYS_INLINE void segment_grads_range(const BwdView<T>& v, int64_t r0, int64_t r1) {
  const int64_t T_ = v.s.T;
  for (int64_t r = r0; r < r1; ++r) {
    const segment::Segment sg = locate(v.s, r);
    const S<T> mu = v.mean[sg.group];
    const T* x = v.x + r * T_;
    const T* dy = v.dy + r * T_;
    S<T> sdy, sdyxc;
    lane_grad_sums<false, T>(x, dy, nullptr, T_, mu, &sdy, &sdyxc);
    v.ws0[r] = sdyxc * rstd_of<T>(v.var[sg.group], v.eps);
    v.ws1[r] = sdy;
  }
}

template <typename T>
JAXDNN_ALWAYS_INLINE void segment_dx_range(const BwdView<T>& v, int64_t r0, int64_t r1) {
  const int64_t T_ = v.s.T;
  for (int64_t r = r0; r < r1; ++r) {
    const segment::Segment sg = locate(v.s, r);
    const S<T> mu = v.mean[sg.group], gr = rstd_of<T>(v.var[sg.group], v.eps) * v.scale[sg.affine];
    const S<T> c1 = v.coef[2 * sg.group], c2 = v.coef[2 * sg.group + 1];
    const T* x = v.x + r * T_;
    const T* dy = v.dy + r * T_;
    T* dx = v.dx + r * T_;
    for_lanes<T>(T_, [&](int64_t t, auto tag) {
      put(dx, t, gr * at(dy, t, tag) + (at(x, t, tag) - mu) * c1 + c2, tag);
    });
  }
}

#define JAXDNN_SEGMENT_TASKS(T)                                                               \
  JAXDNN_CPU_CLONES void segment_stats_task(const FwdView<T>& v, int64_t r0, int64_t r1) {    \
    segment_stats_range<T>(v, r0, r1);                                                        \
  }                                                                                           \
  JAXDNN_CPU_CLONES void segment_apply_task(const FwdView<T>& v, int64_t r0, int64_t r1) {    \
    segment_apply_range<T>(v, r0, r1);                                                        \
  }                                                                                           \
  JAXDNN_CPU_CLONES void segment_grads_task(const BwdView<T>& v, int64_t r0, int64_t r1) {    \
    segment_grads_range<T>(v, r0, r1);                                                        \
  }                                                                                           \
  JAXDNN_CPU_CLONES void segment_dx_task(const BwdView<T>& v, int64_t r0, int64_t r1) {       \
    segment_dx_range<T>(v, r0, r1);                                                           \
  }
JAXDNN_SEGMENT_TASKS(float)
JAXDNN_SEGMENT_TASKS(double)
JAXDNN_SEGMENT_TASKS(f16_t)
JAXDNN_SEGMENT_TASKS(bf16_t)
#undef JAXDNN_SEGMENT_TASKS

// Runs task(view, r0, r1) over all segments in chunks of segment::per_task.
template <typename View, typename Task>
void for_segments(const View& v, const Parallel& par, Task task) {
  const int64_t n = v.s.P * v.s.A * v.s.C * v.s.K, per = segment::per_task(v.s);
  par.for_each((n + per - 1) / per,
               [&](int64_t i) { task(v, i * per, std::min(n, (i + 1) * per)); });
}

template <typename T>
void segment_stats(const FwdView<T>& v, const Parallel& par) {
  for_segments(v, par,
               [](const FwdView<T>& w, int64_t a, int64_t b) { segment_stats_task(w, a, b); });
}

template <typename T>
void segment_apply(const FwdView<T>& v, const Parallel& par) {
  for_segments(v, par,
               [](const FwdView<T>& w, int64_t a, int64_t b) { segment_apply_task(w, a, b); });
}

template <typename T>
void segment_grads(const BwdView<T>& v, const Parallel& par) {
  for_segments(v, par,
               [](const BwdView<T>& w, int64_t a, int64_t b) { segment_grads_task(w, a, b); });
}

template <typename T>
void segment_dx(const BwdView<T>& v, const Parallel& par) {
  for_segments(v, par,
               [](const BwdView<T>& w, int64_t a, int64_t b) { segment_dx_task(w, a, b); });
}

JAXDNN_NORM_CPU_INSTANTIATE(segment_stats, FwdView);
JAXDNN_NORM_CPU_INSTANTIATE(segment_apply, FwdView);
JAXDNN_NORM_CPU_INSTANTIATE(segment_grads, BwdView);
JAXDNN_NORM_CPU_INSTANTIATE(segment_dx, BwdView);

}  // namespace jaxdnn::norm::cpu
