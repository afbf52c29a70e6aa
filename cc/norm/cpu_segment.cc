// CPU segment path (T > 1; batch and group norm, channels-first): x is a sequence of
// P*A*C*K contiguous segments of T values; segment r = ((p*A + a)*C + c)*K + k belongs to
// group (p, c) and uses affine entry (q, c, k). Its partials sit at index r of the
// (P, S = A, C, K) workspace planes.
//   stats  moments of each segment (contiguous_moments).     Traffic: read x.
//   apply  y = (x - mean)*(rstd*scale) + bias.                Traffic: read x, write y.
//   grads  sums of dy*xhat and dy per segment.                Traffic: read x, dy.
//   dx     dx = scale*rstd*dy + (x - mean)*c1 + c2.           Traffic: read x, dy, write dx.
// The fused epilogue (norm.h Epilogue): apply adds the residual and applies the ReLU (+ read
// residual); grads and dx mask dy where the recomputed z <= 0 (+ read residual), dx writing the
// masked dy as d(residual).
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
    const T* res = v.residual ? v.residual + r * T_ : nullptr;
    T* y = v.y + r * T_;
    if (!res && !v.relu) {
      for_lanes<T>(T_, [&](int64_t t, auto tag) { put(y, t, (at(x, t, tag) - mu) * g + b, tag); });
      continue;
    }
    for_lanes<T>(T_, [&](int64_t t, auto tag) {
      auto z = (at(x, t, tag) - mu) * g + b;
      if (res) z += at(res, t, tag);
      put(y, t, v.relu ? relu_of(z) : z, tag);
    });
  }
}

// The segment's dy at t, masked by the epilogue's ReLU where z = (x - mu)*g + b [+ res] <= 0
// (the forward's arithmetic: g = rstd*scale).
template <typename T, typename Tag>
JAXDNN_ALWAYS_INLINE auto segment_masked_dy(const T* x, const T* dy, const T* res, S<T> mu,
                                            S<T> g, S<T> b, int64_t t, Tag tag) {
  auto z = (at(x, t, tag) - mu) * g + b;
  if (res) z += at(res, t, tag);
  return relu_mask(z, at(dy, t, tag));
}

template <typename T>
JAXDNN_ALWAYS_INLINE void segment_grads_range(const BwdView<T>& v, int64_t r0, int64_t r1) {
  const int64_t T_ = v.s.T;
  for (int64_t r = r0; r < r1; ++r) {
    const segment::Segment sg = locate(v.s, r);
    const S<T> mu = v.mean[sg.group];
    const T* x = v.x + r * T_;
    const T* dy = v.dy + r * T_;
    const S<T> rs = rstd_of<T>(v.var[sg.group], v.eps);
    S<T> sdy = 0, sdyxc = 0;
    if (!v.relu) {
      lane_grad_sums<false, T>(x, dy, nullptr, T_, mu, &sdy, &sdyxc);
    } else {  // the masked dy's sums, per lane and then across lanes
      const S<T> g = rs * v.scale[sg.affine], b = v.bias[sg.affine];
      const T* res = v.residual ? v.residual + r * T_ : nullptr;
      V<T> a1 = {}, a2 = {};
      for_lanes<T>(T_, [&](int64_t t, auto tag) {
        const auto d = segment_masked_dy(x, dy, res, mu, g, b, t, tag);
        const auto xc = at(x, t, tag) - mu;
        if constexpr (std::is_same_v<decltype(tag), VecTag>) {
          a1 += d;
          a2 += d * xc;
        } else {
          sdy += d;
          sdyxc += d * xc;
        }
      });
      sdy += hsum<T>(a1);
      sdyxc += hsum<T>(a2);
    }
    v.ws0[r] = sdyxc * rs;
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
    if (!v.relu) {
      for_lanes<T>(T_, [&](int64_t t, auto tag) {
        put(dx, t, gr * at(dy, t, tag) + (at(x, t, tag) - mu) * c1 + c2, tag);
      });
      continue;
    }
    const S<T> b = v.bias[sg.affine];
    const T* res = v.residual ? v.residual + r * T_ : nullptr;
    T* dres = v.dres ? v.dres + r * T_ : nullptr;
    for_lanes<T>(T_, [&](int64_t t, auto tag) {
      const auto d = segment_masked_dy(x, dy, res, mu, gr, b, t, tag);
      put(dx, t, gr * d + (at(x, t, tag) - mu) * c1 + c2, tag);
      if (dres) put(dres, t, d, tag);
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
