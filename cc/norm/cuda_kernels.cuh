// CUDA norm kernels: device helpers shared by every path and the per-path launchers
// (cuda_row.cu, cuda_column.cu, cuda_segment.cu), driven by cuda_norm.cu.
//
// Element access is 16-byte vectors (cuda_vec.h) where a path's rows are vector-aligned, one
// value at a time otherwise. Statistics use exact per-chunk moments merged with Chan's update
// (Welford / parallel variance), after subtracting a sample of the group (a "shift") so that a
// large common offset costs no precision. Every reduction combines partials in an order that
// depends only on thread and block indices: results are bitwise reproducible.
#pragma once

#include <cuda_runtime.h>

#include "cc/common/cuda_reduce.h"
#include "cc/common/cuda_util.h"
#include "cc/common/cuda_vec.h"
#include "cc/norm/norm.h"

namespace jaxdnn::norm::cuda_impl {

using jaxdnn::cuda::dev_acc_t;
using jaxdnn::cuda::device_t;
using jaxdnn::cuda::from_acc;
using jaxdnn::cuda::to_acc;
using jaxdnn::cuda::Vec;

// Device storage type D (float, double, __half, __nv_bfloat16); accumulator A<D>.
template <typename D> using A = dev_acc_t<D>;

template <typename D> __device__ __forceinline__ A<D> rstd_of(A<D> var, A<D> eps) {
  if constexpr (sizeof(A<D>) == 8) return rsqrt(var + eps);
  else return rsqrtf(var + eps);
}

// VEC consecutive values at p as accumulators (VEC is Vec<D>::kN with p 16-byte aligned, or 1).
template <typename D, int VEC>
__device__ __forceinline__ void load_vals(const D* p, A<D> (&out)[VEC]) {
  if constexpr (VEC == 1) {
    out[0] = to_acc(p[0]);
  } else {
    static_assert(VEC == Vec<D>::kN, "vector width");
    const Vec<D> v = Vec<D>::load(p);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_acc(v.v[i]);
  }
}

template <typename D, int VEC>
__device__ __forceinline__ void store_vals(D* p, const A<D> (&in)[VEC]) {
  if constexpr (VEC == 1) {
    p[0] = from_acc<D>(in[0]);
  } else {
    Vec<D> v;
#pragma unroll
    for (int i = 0; i < VEC; ++i) v.v[i] = from_acc<D>(in[i]);
    v.store_stream(p);  // outputs are not read again by this kernel
  }
}

// VEC consecutive accumulator-type values (affine parameters): 16-byte loads when VEC is a
// multiple of a vector (the callers' offsets are then multiples of VEC, hence aligned).
template <typename Acc, int VEC>
__device__ __forceinline__ void load_params(const Acc* p, Acc (&out)[VEC]) {
  constexpr int N = Vec<Acc>::kN;
  if constexpr (VEC % N == 0) {
#pragma unroll
    for (int i = 0; i < VEC / N; ++i) {
      const Vec<Acc> v = Vec<Acc>::load(p + i * N);
#pragma unroll
      for (int j = 0; j < N; ++j) out[i * N + j] = v.v[j];
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = p[i];
  }
}

// Moments (count, mean, sum of squared deviations) and Chan et al.'s parallel update.
template <typename Acc>
struct Moments {
  Acc n, mean, m2;

  __device__ __forceinline__ void merge(Acc nb, Acc mean_b, Acc m2_b) {
    const Acc nn = n + nb;
    if (nb == Acc(0)) return;
    const Acc d = mean_b - mean, f = nb / nn;
    mean += d * f;
    m2 += m2_b + d * d * n * f;
    n = nn;
  }
};

// Merges `nb` exact moments of VEC values v (already shifted) into m: the chunk's own mean
// and squared deviations, then one Chan update (one division per chunk, not per value).
template <typename Acc, int VEC>
__device__ __forceinline__ void add_chunk(Moments<Acc>& m, const Acc (&v)[VEC], int valid) {
  Acc s = 0;
#pragma unroll
  for (int i = 0; i < VEC; ++i) s += i < valid ? v[i] : Acc(0);
  const Acc mean = s / Acc(valid);
  Acc m2 = 0;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const Acc d = v[i] - mean;
    m2 += i < valid ? d * d : Acc(0);
  }
  m.merge(Acc(valid), mean, m2);
}

// Tree-merges the moments of `count` threads (a power of two) whose shared-memory slots are
// sm[base + lane*stride], lane in [0, count): afterwards every one of them reads the merge.
// Every thread of the block must call it (it synchronises). Fixed order: deterministic.
template <typename Acc>
__device__ __forceinline__ Moments<Acc> merge_group(Moments<Acc> m, Moments<Acc>* sm, int base,
                                                    int lane, int count, int stride) {
  sm[base + lane * stride] = m;
  __syncthreads();
  for (int half = count / 2; half > 0; half /= 2) {
    if (lane < half) {
      const Moments<Acc> o = sm[base + (lane + half) * stride];
      m.merge(o.n, o.mean, o.m2);
      sm[base + lane * stride] = m;
    }
    __syncthreads();
  }
  return sm[base];
}

// Backward per-group coefficients from sg = sum(scale*dy), sgx = sum(scale*dy*xhat) over n
// values: dx = scale*rstd*dy + (x - mean)*c1 + c2 (training), or the inference statistics'
// gradients with c1 = c2 = 0 (see BwdBuffers in norm.h).
template <typename Acc>
struct GradCoef {
  bool training, centered;
  const Acc* dmean;
  const Acc* dvar;
  Acc* dmean_out;
  Acc* dvar_out;

  // Coefficients of group g; `write` (one thread per group) stores the inference outputs.
  __device__ __forceinline__ void operator()(int64_t g, Acc n, Acc r, Acc sg, Acc sgx, Acc* c1,
                                             Acc* c2, bool write) const {
    if (!training) {
      if (write) {
        dmean_out[g] = -r * sg;
        dvar_out[g] = Acc(-0.5) * r * r * sgx;
      }
      *c1 = *c2 = 0;
      return;
    }
    *c1 = (Acc(2) * dvar[g] - r * r * sgx) / n;
    *c2 = centered ? (dmean[g] - r * sg) / n : Acc(0);
  }
};

// ---- Launchers (each returns the launch status, naming the kernel) --------------------------

// Typed buffers of one call; Acc is the statistics type.
template <typename D>
struct Fwd {
  Shape s;
  bool centered, training;
  A<D> eps;
  const D* x;
  const A<D>* scale;
  const A<D>* bias;
  D* y;
  A<D>* mean;
  A<D>* var;
  double* ws0;  // partial means (column and segment paths)
  double* ws1;  // partial M2
};

template <typename D>
struct Bwd {
  Shape s;
  bool centered;
  A<D> eps;
  const D* dy;
  const D* x;
  const A<D>* scale;
  const A<D>* mean;
  const A<D>* var;
  D* dx;
  GradCoef<A<D>> coef_fn;
  A<D>* ws0;   // partial sums of dy*xhat
  A<D>* ws1;   // partial sums of dy
  A<D>* coef;  // (P, C, 2)
};

template <typename D> Status row_forward(const Fwd<D>& f, cudaStream_t st);
template <typename D> Status row_backward(const Bwd<D>& b, int64_t slices, cudaStream_t st);
inline int64_t row_bwd_slices(const Shape& s) { return row_bwd_max_slices(s); }

template <typename D> Status column_stats(const Fwd<D>& f, cudaStream_t st);
template <typename D> Status column_apply(const Fwd<D>& f, cudaStream_t st);
template <typename D> Status column_grads(const Bwd<D>& b, cudaStream_t st);
template <typename D> Status column_dx(const Bwd<D>& b, cudaStream_t st);

template <typename D> Status segment_stats(const Fwd<D>& f, cudaStream_t st);
template <typename D> Status segment_apply(const Fwd<D>& f, cudaStream_t st);
template <typename D> Status segment_grads(const Bwd<D>& b, cudaStream_t st);
template <typename D> Status segment_dx(const Bwd<D>& b, cudaStream_t st);

#define JAXDNN_NORM_CUDA_INSTANTIATE(fn, View)                                \
  template Status fn<float>(const View<float>&, cudaStream_t);                \
  template Status fn<double>(const View<double>&, cudaStream_t);              \
  template Status fn<__half>(const View<__half>&, cudaStream_t);              \
  template Status fn<__nv_bfloat16>(const View<__nv_bfloat16>&, cudaStream_t)

}  // namespace jaxdnn::norm::cuda_impl
