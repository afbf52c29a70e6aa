// CPU norm kernels: typed views of a call's buffers, the vectorisable inner loops every path
// shares, and the per-path entry points (cpu_row.cc, cpu_column.cc, cpu_segment.cc), driven by
// cpu_norm.cc.
//
// Vectorisation: elementwise loops and reductions run on 32-byte vector-extension values,
// inlined into per-task functions compiled for x86-64-v4 (AVX-512 F/BW/DQ/VL), x86-64-v3
// (AVX2, FMA) and baseline x86-64 (JAXDNN_CPU_CLONES), picked at load time.
// Stability: statistics of contiguous data are computed block by block (1024 values, an L1
// hit for the second look) with an exact two-pass mean / sum of squared deviations per block,
// and blocks, slices and columns are combined with Chan's parallel update in double. Column
// statistics use Welford's update, one lane per column.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cc/common/cpu_math.h"
#include "cc/common/dtype.h"
#include "cc/common/parallel.h"
#include "cc/norm/norm.h"

#define JAXDNN_ALWAYS_INLINE inline __attribute__((always_inline))
#define JAXDNN_INLINE_LAMBDA __attribute__((always_inline))  // [](...) JAXDNN_INLINE_LAMBDA {...}

// The vector helpers return 32-byte vectors by value (parameters go by reference). They are
// always inlined into code of one ISA, so no calling convention applies; silence GCC's note
// about the baseline ABI.
#pragma GCC diagnostic ignored "-Wpsabi"
#define JAXDNN_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace jaxdnn::norm::cpu {

// Whether the AVX-512 (x86-64-v4) clone of the JAXDNN_CPU_CLONES functions runs (cpu_math's
// ISA check, which asks for the same features as the clones' resolver): its 32 vector registers
// hold what the AVX2 clone's 16 spill, so the register paths of the column passes take wider
// blocks there (cpu_column.cc).
inline bool wide_register_file() { return cpu_math::best_isa() == cpu_math::Isa::kAvx512; }

template <typename T> using S = acc_t<T>;  // statistics / affine type: float, or double

// Rounds to the storage type. bfloat16 is written branch-free (round to nearest even, NaN kept
// quiet) so that output loops vectorise; float16 uses the shared scalar conversion.
template <typename T> JAXDNN_ALWAYS_INLINE T to_storage(S<T> v) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    const uint32_t u = float_to_bits(v);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
    return bf16_t{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded)};
  } else if constexpr (std::is_same_v<T, f16_t>) {
    return store_as_f<T>(v);
  } else {
    return v;
  }
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
  double* ws0;  // partial means
  double* ws1;  // partial sums of squared deviations
  const T* residual;  // the epilogue (norm.h Epilogue; column path): added before the ReLU
  bool relu;
};

template <typename T>
struct BwdView {
  Shape s;
  bool centered, training;
  S<T> eps;
  const T* dy;
  const S<T>* dmean;  // training: the statistics' cotangents (null: zero)
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
  // The epilogue's ReLU (norm.h Epilogue; column path): dy is masked where z <= 0, z from x,
  // the statistics, bias and the residual (null: none); dres (null: not wanted) gets the masked dy.
  bool relu;
  const S<T>* bias;
  const T* residual;
  T* dres;
};

// The epilogue's activation and its derivative's mask (norm.h Epilogue), on one value or a
// vector: max(z, 0) with NaN kept; d where z > 0, else 0.
template <typename Z> JAXDNN_ALWAYS_INLINE Z relu_of(Z z) { return z <= 0 ? Z{} : z; }
template <typename Z> JAXDNN_ALWAYS_INLINE Z relu_mask(Z z, Z d) { return z > 0 ? d : Z{}; }

// ---- Shared numerics ------------------------------------------------------------------------

constexpr int64_t kBlock = 1024;  // values per exact two-pass block

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

// Reductions run on GCC vector-extension registers of kVecBytes (8 floats or 4 doubles): one
// ymm under AVX2 and AVX-512, two xmm otherwise, with no reassociation of the per-lane sums
// (plain reduction loops would not vectorise without -ffast-math).
// Not 64 bytes: without AVX-512, GCC 12 keeps a 64-byte vector that is carried across loop
// iterations (an accumulator, the column path's register state) in memory, and every update
// goes through the stack and general registers (vmovq/vpinsrq) with store-forwarding stalls:
// the row moments ran at 3 ns per value instead of 0.4 on an AVX2 host (docs/perf/norm.md).
// Elementwise loops carry nothing and were not affected.
constexpr int kVecBytes = 32;
using VecF = float __attribute__((vector_size(kVecBytes)));
using VecD = double __attribute__((vector_size(kVecBytes)));
template <typename T> struct Lanes {
  using type = std::conditional_t<std::is_same_v<T, double>, VecD, VecF>;
  static constexpr int kN = int(kVecBytes / sizeof(S<T>));
};
template <typename T> using V = typename Lanes<T>::type;

// Lanes<T>::kN consecutive values as accumulators.
JAXDNN_ALWAYS_INLINE V<float> vload(const float* p) {
  V<float> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
JAXDNN_ALWAYS_INLINE V<double> vload(const double* p) {
  V<double> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// bfloat16 <-> float on 8 lanes, as halves of 16-bit lanes: a bfloat16 is the top half of a
// float. Written as shuffles: GCC 12 widens with __builtin_convertvector through two 128-bit
// halves (6 instructions per 8 values instead of 3), and narrows through shift, mask and pack.
static_assert(kVecBytes == 32, "the bfloat16 shuffles are written for 8 lanes");
using U16x8 = uint16_t __attribute__((vector_size(16)));
using U16x16 = uint16_t __attribute__((vector_size(32)));
using U32x8 = uint32_t __attribute__((vector_size(32)));
using U64x2 = uint64_t __attribute__((vector_size(16)));
using U64x4 = uint64_t __attribute__((vector_size(32)));

JAXDNN_ALWAYS_INLINE V<bf16_t> vload(const bf16_t* p) {
  U16x8 h;
  std::memcpy(&h, p, sizeof h);
  const U16x16 w = __builtin_shufflevector(U16x8{}, h, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13,
                                           6, 14, 7, 15);  // (0, h[i]) pairs
  V<bf16_t> v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}
JAXDNN_ALWAYS_INLINE V<f16_t> vload(const f16_t* p) {
  V<f16_t> v;
  for (int i = 0; i < Lanes<f16_t>::kN; ++i) v[i] = to_float(p[i]);
  return v;
}

// Stores Lanes<T>::kN accumulators rounded to the storage type (see to_storage).
JAXDNN_ALWAYS_INLINE void vstore(float* p, const V<float>& v) { std::memcpy(p, &v, sizeof v); }
JAXDNN_ALWAYS_INLINE void vstore(double* p, const V<double>& v) { std::memcpy(p, &v, sizeof v); }
JAXDNN_ALWAYS_INLINE void vstore(bf16_t* p, const V<bf16_t>& v) {
  U32x8 u;
  std::memcpy(&u, &v, sizeof u);
  // Round to nearest even in the top half; NaN kept, made quiet. `v != v` is one vcmpps on
  // 32-byte vectors (on 64-byte ones without AVX-512 it was compiled lane by lane: bfloat16
  // outputs at 0.35-0.42x XLA:CPU, docs/perf/norm.md).
  const U32x8 r = v != v ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
  U16x16 w;
  std::memcpy(&w, &r, sizeof w);
  // Top halves: gathered within each 128-bit lane, then the two lanes' low quadwords.
  w = __builtin_shufflevector(w, w, 1, 3, 5, 7, 1, 3, 5, 7, 9, 11, 13, 15, 9, 11, 13, 15);
  U64x4 q;
  std::memcpy(&q, &w, sizeof q);
  const U64x2 h = __builtin_shufflevector(q, q, 0, 2);
  std::memcpy(p, &h, sizeof h);
}
JAXDNN_ALWAYS_INLINE void vstore(f16_t* p, const V<f16_t>& v) {
  for (int i = 0; i < Lanes<f16_t>::kN; ++i) p[i] = store_as_f<f16_t>(v[i]);
}

// Elementwise loops: for_lanes(n, f) calls f(i, VecTag{}) on whole vectors, then
// f(i, OneTag{}) on the tail; at()/put() load and store a vector or one value per tag, so one
// generic lambda body serves both.
struct VecTag {};
struct OneTag {};
template <typename T> JAXDNN_ALWAYS_INLINE V<T> at(const T* p, int64_t i, VecTag) {
  return vload(p + i);
}
template <typename T> JAXDNN_ALWAYS_INLINE S<T> at(const T* p, int64_t i, OneTag) {
  return load_acc(p[i]);
}
template <typename T> JAXDNN_ALWAYS_INLINE void put(T* p, int64_t i, const V<T>& v, VecTag) {
  vstore(p + i, v);
}
template <typename T> JAXDNN_ALWAYS_INLINE void put(T* p, int64_t i, S<T> v, OneTag) {
  p[i] = to_storage<T>(v);
}
template <typename T, typename F>
JAXDNN_ALWAYS_INLINE void for_lanes(int64_t n, F f) {
  constexpr int N = Lanes<T>::kN;
  int64_t i = 0;
  for (; i + N <= n; i += N) f(i, VecTag{});
  for (; i < n; ++i) f(i, OneTag{});
}

template <typename T>
JAXDNN_ALWAYS_INLINE S<T> hsum(const V<T>& v) {
  S<T> s = 0;
  for (int i = 0; i < Lanes<T>::kN; ++i) s += v[i];
  return s;
}

// Each forward reduction keeps kChains independent accumulators (as many add chains to hide
// the add's latency) and combines them, and the scalar tail, in a fixed order. With two chains
// the channels-first statistics pass (contiguous_moments, two L1 passes per block) ran at 16-20
// GB/s on one core, bound by the chains; batch_norm 8x64x56x56 float32 training forward, one
// thread, Xeon (docs/perf/norm.md): 775-816 us with two, 716-723 with four (eight: 702-735).
constexpr int kChains = 4;

// Sum over x[0..n) of term(value) in the accumulator type; term takes a vector of values or
// one value (JAXDNN_INLINE_LAMBDA).
template <typename T, typename Term>
JAXDNN_ALWAYS_INLINE S<T> lane_reduce(const T* x, int64_t n, Term term) {
  constexpr int N = Lanes<T>::kN;
  V<T> acc[kChains] = {};
  int64_t i = 0;
  for (; i + kChains * N <= n; i += kChains * N) {
#pragma GCC unroll 4
    for (int c = 0; c < kChains; ++c) acc[c] += term(vload(x + i + c * N));
  }
  for (; i + N <= n; i += N) acc[0] += term(vload(x + i));
  static_assert(kChains == 4, "the chains combine pairwise");
  S<T> s = hsum<T>((acc[0] + acc[1]) + (acc[2] + acc[3]));
  for (; i < n; ++i) s += term(load_acc(x[i]));
  return s;
}

// Sum of (x - shift) over x[0..n).
template <typename T>
JAXDNN_ALWAYS_INLINE S<T> lane_sum(const T* x, int64_t n, S<T> shift) {
  return lane_reduce(x, n, [shift](auto v) JAXDNN_INLINE_LAMBDA { return v - shift; });
}

// Sum of (x - m)^2 over x[0..n).
template <typename T>
JAXDNN_ALWAYS_INLINE S<T> lane_sum_sq_dev(const T* x, int64_t n, S<T> m) {
  return lane_reduce(x, n, [m](auto v) JAXDNN_INLINE_LAMBDA {
    const auto d = v - m;
    return d * d;
  });
}

// Backward sums over n values: *s1 = sum g*dy, *s2 = sum g*dy*(x - m), with per-value
// weights g (kWeighted) or g = 1.
template <bool kWeighted, typename T>
JAXDNN_ALWAYS_INLINE void lane_grad_sums(const T* x, const T* dy, const S<T>* g, int64_t n,
                                         S<T> m, S<T>* s1, S<T>* s2) {
  constexpr int N = Lanes<T>::kN;
  V<T> a1 = {}, a2 = {}, b1 = {}, b2 = {};
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    V<T> d = vload(dy + i), e = vload(dy + i + N);
    if constexpr (kWeighted) {
      d *= vload(g + i);
      e *= vload(g + i + N);
    }
    a1 += d;
    b1 += e;
    a2 += d * (vload(x + i) - m);
    b2 += e * (vload(x + i + N) - m);
  }
  for (; i + N <= n; i += N) {
    V<T> d = vload(dy + i);
    if constexpr (kWeighted) d *= vload(g + i);
    a1 += d;
    a2 += d * (vload(x + i) - m);
  }
  S<T> r1 = hsum<T>(a1 + b1), r2 = hsum<T>(a2 + b2);
  for (; i < n; ++i) {
    S<T> d = load_acc(dy[i]);
    if constexpr (kWeighted) d *= g[i];
    r1 += d;
    r2 += d * (load_acc(x[i]) - m);
  }
  *s1 = r1;
  *s2 = r2;
}

// Moments of n contiguous values: exact two passes per L1-resident block (the mean summed as
// deviations from the block's first value, so a large common offset costs no precision),
// blocks merged with Chan's update. Not centred (RMS): the mean stays 0 and m2 is the sum of
// squares.
template <typename T>
JAXDNN_ALWAYS_INLINE Moments contiguous_moments(const T* x, int64_t n, bool centered) {
  Moments m;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t len = n - b < kBlock ? n - b : kBlock;
    const S<T> shift = load_acc(x[b]);
    const S<T> bm = centered ? shift + lane_sum(x + b, len, shift) / S<T>(len) : S<T>(0);
    m.merge(double(len), double(bm), double(lane_sum_sq_dev(x + b, len, bm)));
  }
  return m;
}

// Moments of group g = (p, c) straight from x, two passes in double without a shift (mean 0
// when not centred). For groups whose shifted statistics came out non-finite (finish_stats).
template <typename T>
Moments plain_group_moments(const FwdView<T>& v, int64_t g) {
  const Shape& s = v.s;
  const int64_t p = g / s.C, c = g % s.C, KT = s.K * s.T;
  auto pass = [&](auto term) {  // sum of term(x) over the group's A runs of K*T values
    double sum = 0;
    for (int64_t a = 0; a < s.A; ++a) {
      const T* x = v.x + ((p * s.A + a) * s.C + c) * KT;
      for (int64_t i = 0; i < KT; ++i) sum += term(double(load_acc(x[i])));
    }
    return sum;
  };
  Moments m;
  m.n = double(s.group_size());
  m.mean = v.centered ? pass([](double x) { return x; }) / m.n : 0.0;
  m.m2 = pass([&](double x) { return (x - m.mean) * (x - m.mean); });
  return m;
}

// Statistics outputs of group g from its moments m (NaN for an empty group, like a mean of
// nothing). Moments that came out non-finite are recomputed by plain_group_moments: the
// shifted sums turn inf - inf into NaN where jnp.mean's plain sum gives +-inf (an infinite
// shift, or an infinity merged with a finite partial). jnp.mean is then +-inf or NaN, jnp.var
// NaN, and RMS norm's mean square inf or NaN. Only groups holding inf or NaN take the pass.
template <typename T>
JAXDNN_ALWAYS_INLINE void finish_stats(const FwdView<T>& v, int64_t g, Moments m) {
  if (m.n == 0) {
    v.mean[g] = v.var[g] = std::numeric_limits<S<T>>::quiet_NaN();
    return;
  }
  if (!std::isfinite(m.mean) || !std::isfinite(m.m2)) m = plain_group_moments(v, g);
  v.mean[g] = S<T>(m.mean);
  v.var[g] = S<T>(m.m2 / m.n);
}

// Mean and variance of group g = (p, c) from its (slice, k) partials in ws0 / ws1, merged with
// Chan's update in a fixed order (slices, then k): the result depends only on the shape.
template <typename T>
JAXDNN_ALWAYS_INLINE void merge_group_stats(const FwdView<T>& v, int64_t g) {
  const Shape& s = v.s;
  const int64_t nsl = num_slices(s), rps = rows_per_slice(s), CK = s.CK();
  const int64_t p = g / s.C, c = g % s.C;
  Moments m;
  for (int64_t sl = 0; sl < nsl; ++sl) {
    const double n = double(std::min(rps, s.A - sl * rps) * s.T);
    for (int64_t k = 0; k < s.K; ++k) {
      const int64_t off = (p * nsl + sl) * CK + c * s.K + k;
      m.merge(n, double(v.ws0[off]), double(v.ws1[off]));
    }
  }
  finish_stats(v, g, m);
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
  const double dvar = v.dvar ? double(v.dvar[group]) : 0;  // (null: a zero cotangent)
  const double dmean = v.dmean ? double(v.dmean[group]) : 0;
  *c1 = S<T>((2.0 * dvar - r * r * sgx) / n);
  *c2 = v.centered ? S<T>((dmean - r * sg) / n) : S<T>(0);
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
