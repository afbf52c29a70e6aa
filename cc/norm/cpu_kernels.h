// CPU norm kernels: typed views of a call's buffers, the vectorisable inner loops every path
// shares, and the per-path entry points (cpu_row.cc, cpu_column.cc, cpu_segment.cc), driven by
// cpu_norm.cc.
//
// Vectorisation: inner loops are plain loops over independent lanes (no floating-point
// reassociation needed), inlined into per-task functions that are compiled for AVX-512, AVX2
// and baseline x86-64 (JAXDNN_CPU_CLONES) and picked at load time.
// Stability: statistics of contiguous data are computed block by block (1024 values, an L1
// hit for the second look) with an exact two-pass mean / sum of squared deviations per block,
// and blocks, slices and columns are combined with Chan's parallel update in double. Column
// statistics use Welford's update, one lane per column.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cc/common/dtype.h"
#include "cc/common/parallel.h"
#include "cc/norm/norm.h"

#define JAXDNN_ALWAYS_INLINE inline __attribute__((always_inline))
#define JAXDNN_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace jaxdnn::norm::cpu {

template <typename T> using S = acc_t<T>;  // statistics / affine type: float, or double

template <typename T> JAXDNN_ALWAYS_INLINE T to_storage(S<T> v) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) return v;
  else return store_as_f<T>(v);
}

template <typename T> JAXDNN_ALWAYS_INLINE S<T> rstd_of(S<T> var, S<T> eps) {
  return S<T>(1) / std::sqrt(var + eps);
}

// Typed views of one call. ws0/ws1 are the two partial planes of the workspace (see norm.h),
// coef the backward per-group coefficients (c1, c2) after them.
template <typename T>
struct FwdView {
  Shape s;
  bool centered;
  S<T> eps;
  const T* x;
  const S<T>* scale;
  const S<T>* bias;
  T* y;
  S<T>* mean;  // written in training, read in inference
  S<T>* var;
  S<T>* ws0;
  S<T>* ws1;
};

template <typename T>
struct BwdView {
  Shape s;
  bool centered, training;
  S<T> eps;
  const T* dy;
  const S<T>* dmean;
  const S<T>* dvar;
  const T* x;
  const S<T>* scale;
  const S<T>* mean;
  const S<T>* var;
  T* dx;
  S<T>* dscale;
  S<T>* dbias;
  S<T>* dmean_out;
  S<T>* dvar_out;
  S<T>* ws0;  // sum dy*xhat partials
  S<T>* ws1;  // sum dy partials
  S<T>* coef;  // (P, C, 2): dx = scale*rstd*dy + (x - mean)*c1 + c2
};

// ---- Shared numerics ------------------------------------------------------------------------

constexpr int kLanes = 16;
constexpr int64_t kBlock = 1024;  // values per exact two-pass block (multiple of kLanes)

struct Moments {
  double n = 0, mean = 0, m2 = 0;  // count, mean, sum of squared deviations

  // Chan et al.'s parallel update: merge another set of moments into this one.
  void merge(double nb, double mean_b, double m2_b) {
    if (nb == 0) return;
    const double nn = n + nb, d = mean_b - mean;
    mean += d * (nb / nn);
    m2 += m2_b + d * d * (n * nb / nn);
    n = nn;
  }
};

// Sum of x[0..n) in the accumulator type, kLanes independent lanes.
template <typename T>
JAXDNN_ALWAYS_INLINE S<T> lane_sum(const T* x, int64_t n) {
  S<T> acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += load_acc(x[i + l]);
  S<T> s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += load_acc(x[i]);
  return s;
}

// Sum of (x - m)^2 over x[0..n).
template <typename T>
JAXDNN_ALWAYS_INLINE S<T> lane_sum_sq_dev(const T* x, int64_t n, S<T> m) {
  S<T> acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const S<T> d = load_acc(x[i + l]) - m;
      acc[l] += d * d;
    }
  S<T> s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) {
    const S<T> d = load_acc(x[i]) - m;
    s += d * d;
  }
  return s;
}

// Moments of n contiguous values: exact two passes per L1-resident block, blocks merged with
// Chan's update. Not centred (RMS): the mean stays 0 and m2 is the sum of squares.
template <typename T>
JAXDNN_ALWAYS_INLINE Moments contiguous_moments(const T* x, int64_t n, bool centered) {
  Moments m;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t len = n - b < kBlock ? n - b : kBlock;
    const S<T> bm = centered ? lane_sum(x + b, len) / S<T>(len) : S<T>(0);
    m.merge(double(len), double(bm), double(lane_sum_sq_dev(x + b, len, bm)));
  }
  return m;
}

// Statistics outputs of a group of n values (NaN for an empty group, like a mean of nothing).
template <typename T>
JAXDNN_ALWAYS_INLINE void finish_stats(const Moments& m, S<T>* mean, S<T>* var) {
  if (m.n == 0) {
    *mean = *var = std::numeric_limits<S<T>>::quiet_NaN();
    return;
  }
  *mean = S<T>(m.mean);
  *var = S<T>(m.m2 / m.n);
}

// Backward per-group coefficients from the group sums sg = sum(scale*dy) and
// sgx = sum(scale*dy*xhat) over n values (see BwdBuffers in norm.h). Inference writes the
// statistics' gradients instead and leaves dx = scale*rstd*dy (c1 = c2 = 0).
template <typename T>
JAXDNN_ALWAYS_INLINE void group_coefficients(const BwdView<T>& v, int64_t group, double n,
                                             double sg, double sgx, S<T>* c1, S<T>* c2) {
  const double r = double(rstd_of<T>(v.var[group], v.eps));
  if (!v.training) {
    v.dmean_out[group] = S<T>(-r * sg);
    v.dvar_out[group] = S<T>(-0.5 * r * r * sgx);
    *c1 = *c2 = 0;
    return;
  }
  *c1 = S<T>((2.0 * double(v.dvar[group]) - r * r * sgx) / n);
  *c2 = v.centered ? S<T>((double(v.dmean[group]) - r * sg) / n) : S<T>(0);
}

// ---- Paths (explicitly instantiated for float, double, f16_t, bf16_t) ------------------------

// Row path (cpu_row.cc). Training computes the statistics; inference reads them.
template <typename T> void row_forward(const FwdView<T>& v, bool training, const Parallel& par);
template <typename T> void row_backward(const BwdView<T>& v, const Parallel& par);
// Backward row slices per affine row on the CPU (<= row_bwd_max_slices).
inline int64_t row_bwd_slices(const Shape& s) {
  return std::min<int64_t>(row_bwd_max_slices(s), 32);
}

// Column path (cpu_column.cc): partial statistics / gradient sums into ws0, ws1; elementwise
// output passes reading the merged statistics / coefficients.
template <typename T> void column_stats(const FwdView<T>& v, const Parallel& par);
template <typename T> void column_apply(const FwdView<T>& v, const Parallel& par);
template <typename T> void column_grads(const BwdView<T>& v, const Parallel& par);
template <typename T> void column_dx(const BwdView<T>& v, const Parallel& par);

// Segment path (cpu_segment.cc), same roles.
template <typename T> void segment_stats(const FwdView<T>& v, const Parallel& par);
template <typename T> void segment_apply(const FwdView<T>& v, const Parallel& par);
template <typename T> void segment_grads(const BwdView<T>& v, const Parallel& par);
template <typename T> void segment_dx(const BwdView<T>& v, const Parallel& par);

#define JAXDNN_NORM_CPU_INSTANTIATE(fn, View)                                 \
  template void fn<float>(const View<float>&, const Parallel&);               \
  template void fn<double>(const View<double>&, const Parallel&);             \
  template void fn<f16_t>(const View<f16_t>&, const Parallel&);               \
  template void fn<bf16_t>(const View<bf16_t>&, const Parallel&)

}  // namespace jaxdnn::norm::cpu
