// CUDA norm kernels: device helpers shared by every path and the per-path launchers
// (cuda_row.cu, cuda_column.cu, cuda_segment.cu), driven by cuda_norm.cu.
//
// Element access is 16-byte vectors (cuda_vec.h) where a path's rows are vector-aligned, one
// value at a time otherwise. Statistics: each thread keeps Welford moments, updated once per
// batch of loaded values (fold_deviations), and threads' and blocks' moments are merged with
// Chan's update (parallel variance); all after subtracting a sample of the group (a "shift") so
// that a large common offset costs no precision (tests/test_norm.py::test_large_offset). Every
// reduction combines partials in an order that depends only on thread and block indices:
// results are bitwise reproducible.
//
// Training forward of the column and segment paths, single pass (column_fused, segment_fused;
// the segment path runs its split forward instead where that applies, cuda_segment.cu):
// one cooperative launch of as many blocks as the GPU holds at once (one per SM: each takes
// nearly all of the SM's shared memory), each owning a contiguous slice of the work.
//   1. The block reads its slice once, accumulating partial statistics into the workspace; the
//      slice's last `keep` values (~200 KB per SM) are copied into shared memory on the way
//      (cp.async, issued up front so that they are in flight while the rest streams).
//   grid barrier; 2. a team of warps per statistics group merges its partials -> mean, var;
//      barrier.
//   3. y for the stashed values straight from shared memory, then the rest re-read in reverse
//      order: the most recently read lines first, while they are still in the L2 (the column
//      path streams them through a per-thread ring of its freed stash slots).
// Traffic: read x once + write y once + re-read what neither shared memory (132 x ~200 KB =
// 26 MB on an H200) nor the L2 kept, against 2 reads + 1 write for the three-pass fallback.
// Fewer bytes are not less time in float32: on the H200 a one-wave loop like phase 3 moves reads
// plus writes at 3.5-3.7 TB/s, a flat grid of one pack per thread (XLA's elementwise shape) at
// 4.0 (dev/copy_probe.cu), and that costs about what the stash saves (docs/perf/norm.md).
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "cc/common/cuda_async.h"
#include "cc/common/cuda_pack.h"
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

// The unit a thread moves per access: a 16-byte vector (VEC values, converted two 16-bit
// values at a time, cuda_pack.h), or one value (VEC == 1).
template <typename D, int VEC> using PackOf = cuda::WordPack<D, (VEC > 1)>;

// VEC consecutive values at p as accumulators (VEC is Vec<D>::kN with p 16-byte aligned, or 1).
template <typename D, int VEC>
__device__ __forceinline__ void load_vals(const D* p, A<D> (&out)[VEC]) {
  static_assert(VEC == PackOf<D, VEC>::kN, "vector width");
  PackOf<D, VEC>::load(p).unpack(out);
}

template <typename D, int VEC>
__device__ __forceinline__ void store_vals(D* p, const A<D> (&in)[VEC]) {
  PackOf<D, VEC>::pack(in).store_stream(p);  // outputs are not read again by this kernel
}

// The epilogue (norm.h Epilogue) on the VEC values z of one pack: + the pack's residual r
// (unpacked; kResidual), then the ReLU with NaN kept.
template <typename Acc, int VEC>
__device__ __forceinline__ void finish_pack(const Acc (&r)[VEC], bool residual, bool relu,
                                            Acc (&z)[VEC]) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    if (residual) z[e] += r[e];
    if (relu) z[e] = z[e] <= Acc(0) ? Acc(0) : z[e];
  }
}

// dy masked by the epilogue's ReLU: d[e] = 0 where z = (x - mu)*gz + bz [+ r] <= 0, z in the
// forward apply's arithmetic (gz = scale*rstd as column_coefs forms it).
template <typename Acc, int VEC>
__device__ __forceinline__ void mask_pack(const Acc (&x)[VEC], const Acc (&r)[VEC], bool residual,
                                          const Acc (&mu)[VEC], const Acc (&gz)[VEC],
                                          const Acc (&bz)[VEC], Acc (&d)[VEC]) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    Acc z = (x[e] - mu[e]) * gz[e] + bz[e];
    if (residual) z += r[e];
    d[e] = z > Acc(0) ? d[e] : Acc(0);
  }
}

// VEC consecutive accumulator-type values (affine parameters, partial sums) from or to p: 16-byte
// accesses when VEC is a multiple of a vector (the callers' offsets are then multiples of VEC,
// hence aligned).
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

template <typename Acc, int VEC>
__device__ __forceinline__ void store_params(Acc* p, const Acc (&in)[VEC]) {
  constexpr int N = Vec<Acc>::kN;
  if constexpr (VEC % N == 0) {
#pragma unroll
    for (int i = 0; i < VEC / N; ++i) {
      Vec<Acc> v;
#pragma unroll
      for (int j = 0; j < N; ++j) v.v[j] = in[i * N + j];
      v.store(p + i * N);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = in[i];
  }
}

// Values [h * U, (h + 1) * U) of a register array, viewed as an array of U (for unit-wise loads
// and stores; h is a constant after unrolling, so the view stays in registers).
template <int U, typename Acc, int VEC>
__device__ __forceinline__ Acc (&part(Acc (&v)[VEC], int h))[U] {
  static_assert(VEC % U == 0, "whole units");
  return *reinterpret_cast<Acc(*)[U]>(v + h * U);
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

// Merges the moments of a warp's 32 lanes (shuffle tree, fixed order): lane 0 returns the
// merge. Every lane of the warp must call it.
template <typename Acc>
__device__ __forceinline__ Moments<Acc> warp_merge(Moments<Acc> m) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const Acc n = __shfl_down_sync(~0u, m.n, o), mean = __shfl_down_sync(~0u, m.mean, o),
              m2 = __shfl_down_sync(~0u, m.m2, o);
    if (lane < o) m.merge(n, mean, m2);
  }
  return m;
}

// Writes partial i of the forward workspace planes from the n-value moments (mean, m2) taken
// after subtracting `shift`. Not centred (RMS, shift 0): the mean is 0 and M2 the sum of squares.
template <typename Acc>
__device__ __forceinline__ void store_partial(double* ws0, double* ws1, int64_t i, Acc shift,
                                              Acc n, Acc mean, Acc m2, bool centered) {
  const double mu = double(shift) + double(mean);
  ws0[i] = centered ? mu : 0.0;
  ws1[i] = centered ? double(m2) : double(m2) + double(n) * mu * mu;
}

// Calls f(b, v, count) for each batch of U consecutive indices of [lo, hi) (ascending, or
// descending when kReverse), b the batch's offset and v[u] = load(its u-th index) for u < count
// (the rest unset): the loads of a batch are issued before f uses any, U accesses in flight per
// thread.
template <int U, bool kReverse, typename Load, typename F>
__device__ __forceinline__ void batched(int64_t lo, int64_t hi, Load load, F f) {
  using V = decltype(load(lo));
  for (int64_t b = 0; b < hi - lo; b += U) {
    const int count = hi - lo - b < U ? int(hi - lo - b) : U;
    V v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (u < count) v[u] = load(kReverse ? hi - 1 - b - u : lo + b + u);
    f(b, v, count);
  }
}

// Calls f(i, load(i)) for i in [lo, hi), ascending (descending when kReverse), in batches of U.
template <int U, bool kReverse, typename Load, typename F>
__device__ __forceinline__ void pipelined(int64_t lo, int64_t hi, Load load, F f) {
  batched<U, kReverse>(lo, hi, load, [&](int64_t b, const auto& v, int count) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (u < count) f(kReverse ? hi - 1 - b - u : lo + b + u, v[u]);
  });
}

// Batched Welford update: adds c samples to moments (n values, mean, m2) given the sums s1, s2
// of their deviations from the running mean, z = y - mean. With n' = n + c (r = 1/n', one
// reciprocal per batch, shared by every column of a thread):
//   mean' = mean + s1/n',  m2' = m2 + s2 - s1^2/n'
// (exact: the batch's own M2 is s2 - s1^2/c, and Chan's cross term with the batch mean
// mean + s1/c then gives the rest). The deviations are small wherever the running mean is
// near the data, so the subtraction loses nothing that Welford's per-row form keeps.
template <typename Acc>
__device__ __forceinline__ void fold_deviations(Acc& mean, Acc& m2, Acc s1, Acc s2, Acc r) {
  const Acc a = s1 * r;
  mean += a;
  m2 += s2 - s1 * a;
}

// The sums for fold_deviations, per vector lane e, over the packs v[0..count): s1[e] += z and
// s2[e] += z^2 with z = (x - shift[e]) - mean[e].
template <typename D, int VEC, int U>
__device__ __forceinline__ void sum_deviations(const PackOf<D, VEC> (&v)[U], int count,
                                               const A<D> (&shift)[VEC], const A<D> (&mean)[VEC],
                                               A<D> (&s1)[VEC], A<D> (&s2)[VEC]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u < count) {
      A<D> x[VEC];
      v[u].unpack(x);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A<D> z = (x[e] - shift[e]) - mean[e];
        s1[e] += z;
        s2[e] += z * z;
      }
    }
  }
}

// Backward per-group coefficients from sg = sum(scale*dy), sgx = sum(scale*dy*xhat) over n
// values (inv_n = 1/n): dx = scale*rstd*dy + (x - mean)*c1 + c2 (training), or the inference
// statistics' gradients with c1 = c2 = 0 (see BwdBuffers in norm.h).
template <typename Acc>
struct GradCoef {
  bool training, centered;
  const Acc* dmean;
  const Acc* dvar;
  Acc* dmean_out;
  Acc* dvar_out;

  // The cotangents of group g's statistics outputs (training), which the coefficients read:
  // a kernel walking groups can load the next group's ahead of its sums. Null pointers are
  // zero cotangents.
  struct Cotangents {
    Acc dmean, dvar;
  };
  __device__ __forceinline__ Cotangents cotangents(int64_t g) const {
    if (!training) return {0, 0};
    return {centered && dmean ? dmean[g] : Acc(0), dvar ? dvar[g] : Acc(0)};
  }

  // Coefficients of group g; `write` (one thread per group) stores the inference outputs.
  __device__ __forceinline__ void operator()(int64_t g, Cotangents ct, Acc inv_n, Acc r, Acc sg,
                                             Acc sgx, Acc* c1, Acc* c2, bool write) const {
    if (!training) {
      if (write) {
        dmean_out[g] = -r * sg;
        dvar_out[g] = Acc(-0.5) * r * r * sgx;
      }
      *c1 = *c2 = 0;
      return;
    }
    *c1 = (Acc(2) * ct.dvar - r * r * sgx) * inv_n;
    *c2 = centered ? (ct.dmean - r * sg) * inv_n : Acc(0);
  }
  __device__ __forceinline__ void operator()(int64_t g, Acc inv_n, Acc r, Acc sg, Acc sgx,
                                             Acc* c1, Acc* c2, bool write) const {
    (*this)(g, cotangents(g), inv_n, r, sg, sgx, c1, c2, write);
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
  A<D>* table;  // segment path, split forward: (segments, 4) coefficients (norm.h)
  const D* residual;  // the epilogue (norm.h Epilogue; column path): added before the ReLU
  bool relu;
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
  // The epilogue's ReLU (norm.h Epilogue; column path): dy is masked where z <= 0, z from x,
  // the statistics, bias and the residual (null: none); dres (null: not wanted) gets the
  // masked dy.
  bool relu;
  const A<D>* bias;
  const D* residual;
  D* dres;
};

// Whether every x-like buffer of a call starts 16-byte aligned (the vector kernels): a forward's
// x, y and residual, a backward's x, dy, dx, residual and d(residual) (null ones count as
// aligned).
template <typename D>
inline bool fwd_aligned(const Fwd<D>& f) {
  return cuda::vec_aligned(f.x) && cuda::vec_aligned(f.y) && cuda::vec_aligned(f.residual);
}
template <typename D>
inline bool bwd_aligned(const Bwd<D>& b) {
  return cuda::vec_aligned(b.x) && cuda::vec_aligned(b.dy) && cuda::vec_aligned(b.dx) &&
         cuda::vec_aligned(b.residual) && cuda::vec_aligned(b.dres);
}

// VEC accumulators at p (16-byte aligned; VEC*sizeof(Acc) a multiple of 16) in 16-byte words.
template <typename Acc, int VEC>
__device__ __forceinline__ void load_words(const Acc* p, Acc (&out)[VEC]) {
  static_assert(VEC * sizeof(Acc) % 16 == 0, "whole 16-byte words");
#pragma unroll
  for (int k = 0; k < int(VEC * sizeof(Acc) / 16); ++k) {
    const uint4 w = reinterpret_cast<const uint4*>(p)[k];
    memcpy(out + k * int(16 / sizeof(Acc)), &w, 16);
  }
}

// ---- Single-pass training forward (see the top of this file) --------------------------------

// One block per SM (its shared memory is nearly all stash), 16 warps with 8 loads of 16 bytes
// each in flight: 64 KB per SM. 256 threads with 16 loads each (the same bytes in flight) kept
// DRAM only 35-60% busy on the H200 (docs/perf/norm.md: warps, not unrolled loads, hide
// latency); 512 threads fit 128 registers each without spilling (106-128 used), 1024 would
// spill (64).
// Measured against 256/16 in one H200 run (docs/perf/norm.md): 1.03-1.34x on the batch_norm and
// group_norm training forwards.
constexpr int kFusedThreads = 512;
constexpr int kFusedInFlight = 8;

__device__ __forceinline__ void grid_sync() { cooperative_groups::this_grid().sync(); }

// Calls f(q, v) for q = 0, 1, ..., n - 1, v the 16-byte pack at src(q), copied first (cp.async)
// into this thread's shared-memory slot(q % kRing), with kRing - 1 copies in flight; src is
// called once per q, in order, kRing - 1 calls ahead of f. Batched register loads (pipelined)
// have nothing in flight while a thread uses a batch; the ring keeps kRing - 1 loads in flight
// at no register cost. No other thread may touch the slots meanwhile (no barrier here); the
// copies, waits and slot reads are all asm volatile, so the compiler keeps them in order, and
// the caller's earlier reads of the slots stay before the first copy (a compiler fence).
template <int kRing, typename Pk, typename Src, typename Slot, typename F>
__device__ __forceinline__ void ring_stream(int64_t n, Src src, Slot slot, F f) {
  static_assert(sizeof(Pk) == 16, "16-byte packs");
  asm volatile("" ::: "memory");
  auto issue = [&](int64_t q) {  // always commits, so that group q is the q-th committed
    if (q < n) cuda::cp_async16(slot(int(q % kRing)), src(q));
    cuda::cp_async_commit();
  };
  for (int q = 0; q < kRing - 1; ++q) issue(q);
  for (int64_t q = 0; q < n; ++q) {
    cuda::cp_async_wait<kRing - 2>();  // group q landed
    uint4 w;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
                 : "r"(cuda::smem_addr(slot(int(q % kRing)))));
    Pk v;
    memcpy(&v, &w, sizeof(w));
    f(q, v);
    issue(q + kRing - 1);  // into the slot read one iteration ago
  }
}

// Phase boundaries of the single-pass kernels (0 start, 1 statistics written, 2 merged, 3 end):
// empty here; dev/norm_fwd_bench.cu defines it to time the phases.
#ifndef JAXDNN_NORM_PHASE
#define JAXDNN_NORM_PHASE(k)
#endif

// A statistics group's partials summed about a common shift (the group's first partial's
// mean): n, s1 = sum n_i d_i and s2 = sum (M2_i + n_i d_i^2), d_i = mean_i - shift; then
// mean = shift + s1/n and M2 = s2 - s1^2/n. Additions only: Chan's update divides at every
// merge, and a merge is one latency chain of such steps (ncu: 14 cycles per issued
// instruction, ~1300 dependent instructions per warp). The subtraction costs at most
// log2(1 + n/n_0) bits of the double (n_0 the first partial's count: n_0 d^2 <= M2 for the
// overall mean), 12 of 53 for 4096 equal partials.
struct ShiftedSums {
  double n, s1, s2;
  __device__ __forceinline__ void add(double nb, double d, double m2_b) {
    n += nb;
    s1 += nb * d;
    s2 += m2_b + nb * d * d;
  }
  __device__ __forceinline__ ShiftedSums warp_sum() const {  // every lane gets the warp's sums
    const cuda::SumOp sum;
    return {cuda::warp_reduce(n, sum), cuda::warp_reduce(s1, sum), cuda::warp_reduce(s2, sum)};
  }
};

// Mean and variance of group g = (p, c) of x straight from its values, two passes in double
// without a shift (mean 0 when not centred), summed by the 32 lanes of one warp (every lane of
// it calls this and gets the result). For groups whose shifted statistics came out non-finite:
// the shift turns inf - inf into NaN where jnp.mean's plain sum gives +-inf (an infinite
// shift, or an infinity merged with finite partials). Only groups holding inf or NaN take it.
struct PlainStats {
  double mean, var;
};
template <typename D>
__device__ __forceinline__ PlainStats plain_group_stats(const D* __restrict__ x, Shape s,
                                                        bool centered, int64_t g) {
  const int lane = threadIdx.x % 32;
  const int64_t KT = s.K * s.T, n = s.group_size();
  // Member i of the group is (a, j) = (i / KT, i % KT), at x[((p*A + a)*C + c)*KT + j]; a lane
  // takes i = lane, lane + 32, ..., stepping (a, j) without dividing.
  const D* x0 = x + (g / s.C * s.A * s.C + g % s.C) * KT;  // (p, a = 0, c)
  const int64_t da = 32 / KT, dj = 32 % KT, row = s.C * KT;
  auto sum = [&](auto term) {
    double t = 0;
    int64_t a = lane / KT, j = lane % KT;
    for (int64_t i = lane; i < n; i += 32) {
      t += term(double(to_acc(x0[a * row + j])));
      a += da;
      j += dj;
      if (j >= KT) j -= KT, ++a;
    }
    return cuda::warp_reduce(t, cuda::SumOp{});
  };
  const double mean = centered ? sum([](double v) { return v; }) / double(n) : 0.0;
  return {mean, sum([&](double v) { return (v - mean) * (v - mean); }) / double(n)};
}

// merge_groups' partials of group (p, c) in (P, slices, C, K) workspace planes: partial i is
// column k = i % K of slice i / K, whose rps rows (the last slice's fewer) hold T values each.
// Div divides by K and C: cuda::FastDiv where the launcher has checked that slices*K and the
// group count are below 2^31, else cuda::PlainDiv (the merge is a latency chain, and a 64-bit
// division a ~100-instruction call).
template <typename Div>
struct SliceParts {
  Shape s;
  int64_t slices, rps;
  Div K, C;
  __host__ __device__ SliceParts(const Shape& s_, int64_t slices_, int64_t rps_)
      : s(s_), slices(slices_), rps(rps_), K(s_.K), C(s_.C) {}
  __device__ __forceinline__ double operator()(int64_t grp, int64_t i, int64_t* idx) const {
    const int64_t sl = K.div(i), k = i - sl * s.K, p = C.div(grp), c = grp - p * s.C;
    *idx = (p * slices + sl) * s.CK() + c * s.K + k;
    return double(min(rps, s.A - sl * rps) * s.T);
  }
};

// Phase 2: the statistics of every group from its `parts` partials, one team of `team` warps per
// group (groups strided over every team of the grid). part(g, i, &idx) returns the value count of
// partial i of group g and sets its workspace index; a team's threads take i = rank, rank +
// 32*team, ... in order, loading four partials before adding any (ShiftedSums), then sums per
// warp and across the team's warps, in a fixed order; every lane of the team's first warp then
// calls done(g, mean, var, lane) (by default lane 0 writes mean and var; every done writes
// them); statistics that come out non-finite are then recomputed from x by that warp
// (plain_group_stats), which calls done again. A team is as many warps
// (a power of two, at most a block) as still gives every group its own team (merge_launch sizes
// a grid for it): with one warp per group, 64 groups of 256 partials (batch_norm NCHW) kept 64 of
// the grid's 2112 warps busy through 8 dependent loads each, and the merge took ~12 us between
// the fused kernel's grid barriers.
// Every thread of the block calls it (it synchronises when a team spans several warps).
template <typename D, typename Part, typename Done>
__device__ __forceinline__ void merge_groups(const Fwd<D>& f, int64_t parts, Part part,
                                             Done done) {
  struct Partial {
    double n, mean, m2;
  };
  __shared__ ShiftedSums warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t groups = f.s.groups();
  int team = 1;
  while (team < warps && int64_t(gridDim.x) * (warps / (team * 2)) >= groups) team *= 2;
  const int per_block = warps / team, rank = warp % team * 32 + lane, stride = 32 * team;
  const int64_t teams = int64_t(gridDim.x) * per_block;
  // This thread's partials, rank + j*stride for j < mine (stride a power of two: a shift).
  const int64_t mine = parts > rank ? ((parts - rank - 1) >> (__ffs(stride) - 1)) + 1 : 0;
  for (int64_t g0 = 0; g0 < groups; g0 += teams) {  // the same rounds for every thread
    const int64_t g = g0 + int64_t(blockIdx.x) * per_block + warp / team;
    ShiftedSums m{0, 0, 0};
    double shift = 0;
    if (g < groups) {
      int64_t first;
      part(g, 0, &first);
      shift = f.ws0[first];
      batched<4, false>(
          0, mine,
          [&](int64_t j) {
            int64_t idx;
            const double n = part(g, rank + j * stride, &idx);
            return Partial{n, f.ws0[idx], f.ws1[idx]};
          },
          [&](int64_t, const Partial (&v)[4], int count) {
#pragma unroll
            for (int u = 0; u < 4; ++u)
              if (u < count) m.add(v[u].n, v[u].mean - shift, v[u].m2);
          });
    }
    m = m.warp_sum();
    if (team > 1) {
      if (lane == 0) warp_sums[warp] = m;
      __syncthreads();
      if (warp % team == 0) {
        m = lane < team ? warp_sums[warp + lane] : ShiftedSums{0, 0, 0};
        m = m.warp_sum();
      }
      __syncthreads();  // warp_sums is reused by the next round
    }
    if (warp % team == 0 && g < groups) {  // every lane of the team's first warp holds the sums
      const double mean = m.s1 / m.n;
      const double m2 = m.s2 - m.s1 * mean;  // (NaN stays NaN: no fmax)
      done(g, A<D>(shift + mean), A<D>((m2 < 0 ? 0.0 : m2) / m.n), lane);
    }
  }
  // Groups whose statistics came out non-finite (inf or NaN among their values) again, from x
  // (plain_group_stats), each by the warp that wrote them: a second loop, so that the merge
  // loop above keeps its registers (in the fused kernels it runs at their limit).
  if (warp % team != 0) return;
  __syncwarp();  // lane 0's mean and var, visible to the warp
  for (int64_t g = int64_t(blockIdx.x) * per_block + warp / team; g < groups; g += teams) {
    if (isfinite(f.mean[g]) && isfinite(f.var[g])) continue;
    const PlainStats st = plain_group_stats(f.x, f.s, f.centered, g);
    done(g, A<D>(st.mean), A<D>(st.var), lane);
  }
}
template <typename D, typename Part>
__device__ __forceinline__ void merge_groups(const Fwd<D>& f, int64_t parts, Part part) {
  merge_groups(f, parts, part, [&](int64_t g, A<D> mean, A<D> var, int lane) {
    if (lane == 0) {
      f.mean[g] = mean;
      f.var[g] = var;
    }
  });
}

// The launch of a merge kernel over `groups` groups of `parts` partials each: a block per team
// (so that the teams' latency chains run on as many SMs as there are groups), a team of as many
// warps as give each thread about two partials (a power of two, at most kFusedThreads threads).
// H200: group_norm NCHW's 16 partials per group in a team of 16 warps each took 21 us to merge,
// the block's latency chain for a handful of loads; batch_norm NCHW's 64 groups of 64 partials,
// a warp each, 6.6 us in 4 blocks of 16 warps and 3.3 in 64 blocks of one.
struct MergeLaunch {
  unsigned blocks;
  int threads;
};
inline MergeLaunch merge_launch(int64_t groups, int64_t parts) {
  int team = 1;
  while (team < kFusedThreads / 32 && 64 * team < parts) team *= 2;
  return {unsigned(std::min<int64_t>(groups, int64_t(1) << 20)), 32 * team};
}

// What the GPU holds of a fused kernel at once: co-resident blocks (0: no cooperative launch
// possible) with `stash_bytes` of dynamic shared memory each (all that is left after the
// kernel's static shared memory), which it sets as the kernel's limit. What depends only on the
// architecture (cooperative launch support, the stash size, blocks per SM) is queried once per
// kernel, as in cuda::resident_grid; the SM count and the kernel's limit on every call (both
// belong to the current device).
struct FusedCapacity {
  int64_t blocks = 0, stash_bytes = 0;
};

template <auto kKernel>
Status fused_capacity(FusedCapacity* cap) {
  struct Arch {
    cudaError_t error = cudaSuccess;
    int coop = 0, per_sm = 0;
    int64_t stash = 0;
  };
  static const Arch arch = [] {
    Arch a;
    int dev = 0, optin = 0;
    cudaFuncAttributes attr{};
    auto step = [&](cudaError_t e) {
      return a.error == cudaSuccess && (a.error = e) == cudaSuccess;
    };
    if (step(cudaGetDevice(&dev)) &&
        step(cudaDeviceGetAttribute(&a.coop, cudaDevAttrCooperativeLaunch, dev)) &&
        step(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) &&
        step(cudaFuncGetAttributes(&attr, kKernel)) && a.coop) {
      a.stash = std::max<int64_t>(0, (int64_t(optin) - int64_t(attr.sharedSizeBytes)) / 16 * 16);
      if (a.stash > 0 &&
          step(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(a.stash))))
        step(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&a.per_sm, kKernel, kFusedThreads,
                                                           size_t(a.stash)));
    }
    return a;
  }();
  const char* what = "norm fused forward: device query";
  if (Status st = cuda::check(arch.error, what); !st.ok() || arch.stash == 0 || arch.per_sm == 0)
    return st;
  Status st = cuda::check(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(arch.stash)),
      what);
  if (!st.ok()) return st;
  cap->blocks = int64_t(arch.per_sm) * cuda::sm_count();  // 0 SMs: no fused launch
  cap->stash_bytes = arch.stash;
  return st;
}

// Launches kernel<<<grid, kFusedThreads, smem, st>>>(args...) cooperatively (every block
// resident at once, so that grid_sync() is legal). Capturable in a CUDA graph.
template <typename... Params, typename... Args>
Status launch_cooperative(void (*kernel)(Params...), int64_t grid, int64_t smem, cudaStream_t st,
                          const char* name, Args... args) {
  cudaLaunchAttribute coop;
  coop.id = cudaLaunchAttributeCooperative;
  coop.val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(kFusedThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = st;
  cfg.attrs = &coop;
  cfg.numAttrs = 1;
  return cuda::check(cudaLaunchKernelEx(&cfg, kernel, args...), name);
}

// Single-pass training forwards (cooperative; x and y 16-byte aligned): whether the problem
// qualifies (rows / segments of 16-byte vectors, every group of rows on a resident block), and
// the launch.
template <typename D> Support column_fused_support(const Shape& s);
template <typename D> Status column_fused(const Fwd<D>& f, cudaStream_t st);
template <typename D> Support segment_fused_support(const Shape& s);
template <typename D> Status segment_fused(const Fwd<D>& f, cudaStream_t st);
// The segment path's split training forward (cuda_segment.cu): where it applies, its statistics
// half (mean, var and the table) and its apply half (y from the table), run in one XLA call or
// in two (the two-call algorithms, cuda_norm.cu).
template <typename D> Support segment_split_support(const Shape& s);
template <typename D> Status segment_split_stats(const Fwd<D>& f, cudaStream_t st);
template <typename D> Status segment_split_apply(const Fwd<D>& f, cudaStream_t st);

template <typename D> Status row_forward(const Fwd<D>& f, cudaStream_t st);
// *slices: the d(scale), d(bias) partial rows it wrote per affine row (<= row_bwd_max_slices).
template <typename D> Status row_backward(const Bwd<D>& b, int64_t* slices, cudaStream_t st);

// Rows per slice of column_stats's partials (and so of their merge), for vec-column threads.
int64_t column_stats_rows(const Shape& s, int vec);
template <typename D> Status column_stats(const Fwd<D>& f, cudaStream_t st);
template <typename D> Status column_apply(const Fwd<D>& f, cudaStream_t st);
// The column apply as a flat grid of 16-byte packs (4- and 8-byte types; x and y aligned).
template <typename D> Support column_flat_support(const Shape& s);
template <typename D> Status column_flat_apply(const Fwd<D>& f, cudaStream_t st);
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
#define JAXDNN_NORM_CUDA_INSTANTIATE_SUPPORT(fn)      \
  template Support fn<float>(const Shape&);           \
  template Support fn<double>(const Shape&);          \
  template Support fn<__half>(const Shape&);          \
  template Support fn<__nv_bfloat16>(const Shape&)

}  // namespace jaxdnn::norm::cuda_impl
