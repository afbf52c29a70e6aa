// CUDA segment path (T > 1; batch and group norm, channels-first): x is a sequence of
// P*A*C*K contiguous segments of T values; segment r = ((p*A + a)*C + c)*K + k belongs to
// group (p, c), uses affine entry (q, c, k), and owns index r of the (P, S = A, C, K)
// workspace planes.
//
// Block of 256 threads: RT = 32 threads per segment (8 segments per block) for short segments,
// or RT = 256 (one segment per block); each thread strides through its segment in VEC-value
// chunks (16-byte vectors when T keeps every segment aligned), a warp reading 512 contiguous
// bytes per step. Blocks loop over segment groups (grid-stride).
//   stats  exact chunk moments of x - shift (shift = the segment's first value), merged per
//          thread and then across the RT lanes with Chan's update; (mean, M2) in double.
//          Traffic: read x.
//   apply  y = (x - mean)*(rstd*scale) + bias; segments in reverse order for L2 reuse.
//          Traffic: read x, write y.
//   grads  sums of dy and dy*(x - mean) per segment.        Traffic: read x, dy.
//   dx     dx = scale*rstd*dy + (x - mean)*c1 + c2, reverse order.
//          Traffic: read x, dy, write dx.

#include "cc/norm/cuda_kernels.cuh"

namespace jaxdnn::norm::cuda_impl {
namespace {

constexpr int kThreads = 256;

struct SegmentGrid {
  int rt, per_block;  // threads per segment, segments per block
  int64_t segs, groups;  // segments, segment groups (of per_block)
};

// Group (p*C + c) and affine index ((q*C + c)*K + k) of segment r.
struct SegmentPlace {
  int64_t group, affine;
  __device__ SegmentPlace(const Shape& s, int64_t r) {
    const int64_t k = r % s.K, c = r / s.K % s.C, p = r / (s.K * s.C * s.A);
    group = p * s.C + c;
    affine = (p / s.Pq() * s.C + c) * s.K + k;
  }
};

// Calls f(r) for this thread's segment of each segment group, every thread of the block
// taking part in every iteration (the segment may be past the end: r >= segs).
template <typename F>
__device__ __forceinline__ void for_segment_groups(const SegmentGrid& g, bool reverse, F f) {
  for (int64_t it = blockIdx.x; it < g.groups; it += gridDim.x) {
    const int64_t grp = reverse ? g.groups - 1 - it : it;
    f(grp * g.per_block + int64_t(threadIdx.x) / g.rt);
  }
}

// Sum over the RT lanes of a segment (a warp, or the block); every thread must call it.
template <typename Acc>
__device__ __forceinline__ Acc lane_sum(Acc v, Acc* scratch, int rt) {
  if (rt == 32) return cuda::warp_reduce(v, cuda::SumOp{});
  return cuda::block_reduce(v, cuda::SumOp{}, Acc(0), scratch);
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) segment_stats_kernel(Fwd<D> f, SegmentGrid g) {
  using Acc = A<D>;
  __shared__ Moments<Acc> sm[kThreads];
  const int64_t T = f.s.T;
  const int lane = int(threadIdx.x) % g.rt, base = int(threadIdx.x) - lane;
  for_segment_groups(g, false, [&](int64_t r) {
    Moments<Acc> m{0, 0, 0};
    Acc shift = 0;
    if (r < g.segs) {
      const D* x = f.x + r * T;
      if (f.centered) shift = to_acc(x[0]);
#pragma unroll 4
      for (int64_t i = int64_t(lane) * VEC; i < T; i += int64_t(g.rt) * VEC) {
        Acc v[VEC];
        load_vals<D, VEC>(x + i, v);
        if (f.centered) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) v[e] -= shift;
          add_chunk<Acc, VEC>(m, v, VEC);
        } else {
          Acc q = 0;
#pragma unroll
          for (int e = 0; e < VEC; ++e) q += v[e] * v[e];
          m.merge(Acc(VEC), 0, q);
        }
      }
    }
    m = merge_group(m, sm, base, lane, g.rt, 1);
    if (r < g.segs && lane == 0) {
      f.ws0[r] = double(shift) + double(m.mean);
      f.ws1[r] = double(m.m2);
    }
    __syncthreads();  // sm is reused by the next group
  });
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) segment_apply_kernel(Fwd<D> f, SegmentGrid g) {
  using Acc = A<D>;
  const int64_t T = f.s.T;
  const int lane = int(threadIdx.x) % g.rt;
  for_segment_groups(g, true, [&](int64_t r) {
    if (r >= g.segs) return;
    const SegmentPlace pl(f.s, r);
    const Acc mu = f.mean[pl.group], b = f.bias[pl.affine];
    const Acc gg = rstd_of<D>(f.var[pl.group], f.eps) * f.scale[pl.affine];
    for (int64_t i = int64_t(lane) * VEC; i < T; i += int64_t(g.rt) * VEC) {
      Acc v[VEC];
      load_vals<D, VEC>(f.x + r * T + i, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = (v[e] - mu) * gg + b;
      store_vals<D, VEC>(f.y + r * T + i, v);
    }
  });
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) segment_grads_kernel(Bwd<D> b, SegmentGrid g) {
  using Acc = A<D>;
  __shared__ Acc scratch[32];
  const int64_t T = b.s.T;
  const int lane = int(threadIdx.x) % g.rt;
  for_segment_groups(g, false, [&](int64_t r) {
    Acc sdy = 0, sdyx = 0, rs = 0;
    if (r < g.segs) {
      const SegmentPlace pl(b.s, r);
      const Acc mu = b.mean[pl.group];
      rs = rstd_of<D>(b.var[pl.group], b.eps);
#pragma unroll 4
      for (int64_t i = int64_t(lane) * VEC; i < T; i += int64_t(g.rt) * VEC) {
        Acc x[VEC], d[VEC];
        load_vals<D, VEC>(b.x + r * T + i, x);
        load_vals<D, VEC>(b.dy + r * T + i, d);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          sdy += d[e];
          sdyx += d[e] * (x[e] - mu);
        }
      }
    }
    sdy = lane_sum(sdy, scratch, g.rt);
    sdyx = lane_sum(sdyx, scratch, g.rt);
    if (r < g.segs && lane == 0) {
      b.ws0[r] = sdyx * rs;
      b.ws1[r] = sdy;
    }
  });
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) segment_dx_kernel(Bwd<D> b, SegmentGrid g) {
  using Acc = A<D>;
  const int64_t T = b.s.T;
  const int lane = int(threadIdx.x) % g.rt;
  for_segment_groups(g, true, [&](int64_t r) {
    if (r >= g.segs) return;
    const SegmentPlace pl(b.s, r);
    const Acc mu = b.mean[pl.group], c1 = b.coef[2 * pl.group], c2 = b.coef[2 * pl.group + 1];
    const Acc gr = rstd_of<D>(b.var[pl.group], b.eps) * b.scale[pl.affine];
    for (int64_t i = int64_t(lane) * VEC; i < T; i += int64_t(g.rt) * VEC) {
      Acc x[VEC], d[VEC];
      load_vals<D, VEC>(b.x + r * T + i, x);
      load_vals<D, VEC>(b.dy + r * T + i, d);
#pragma unroll
      for (int e = 0; e < VEC; ++e) d[e] = gr * d[e] + (x[e] - mu) * c1 + c2;
      store_vals<D, VEC>(b.dx + r * T + i, d);
    }
  });
}

SegmentGrid segment_grid(const Shape& s, int vec) {
  SegmentGrid g;
  g.rt = (s.T + vec - 1) / vec <= 64 ? 32 : kThreads;
  g.per_block = kThreads / g.rt;
  g.segs = s.P * s.A * s.C * s.K;
  g.groups = (g.segs + g.per_block - 1) / g.per_block;
  return g;
}

template <typename D, template <typename, int> class Launch, typename View>
Status launch_segments(const View& v, bool aligned, const char* name, cudaStream_t st) {
  const bool vec = aligned && v.s.T % Vec<D>::kN == 0;
  const SegmentGrid g = segment_grid(v.s, vec ? Vec<D>::kN : 1);
  const unsigned grid = unsigned(std::min<int64_t>(g.groups, 132 * 64));
  if (vec) Launch<D, Vec<D>::kN>::run(v, g, grid, st);
  else Launch<D, 1>::run(v, g, grid, st);
  return cuda::check_launch(name);
}

#define JAXDNN_SEGMENT_LAUNCH(Name, kernel, View)                                            \
  template <typename D, int VEC>                                                             \
  struct Name {                                                                              \
    static void run(const View<D>& v, const SegmentGrid& g, unsigned grid, cudaStream_t st) { \
      kernel<D, VEC><<<grid, kThreads, 0, st>>>(v, g);                                       \
    }                                                                                        \
  };
JAXDNN_SEGMENT_LAUNCH(StatsLaunch, segment_stats_kernel, Fwd)
JAXDNN_SEGMENT_LAUNCH(ApplyLaunch, segment_apply_kernel, Fwd)
JAXDNN_SEGMENT_LAUNCH(GradsLaunch, segment_grads_kernel, Bwd)
JAXDNN_SEGMENT_LAUNCH(DxLaunch, segment_dx_kernel, Bwd)
#undef JAXDNN_SEGMENT_LAUNCH

}  // namespace

template <typename D>
Status segment_stats(const Fwd<D>& f, cudaStream_t st) {
  return launch_segments<D, StatsLaunch>(f, cuda::vec_aligned(f.x), "norm segment_stats_kernel",
                                         st);
}

template <typename D>
Status segment_apply(const Fwd<D>& f, cudaStream_t st) {
  return launch_segments<D, ApplyLaunch>(f, cuda::vec_aligned(f.x) && cuda::vec_aligned(f.y),
                                         "norm segment_apply_kernel", st);
}

template <typename D>
Status segment_grads(const Bwd<D>& b, cudaStream_t st) {
  return launch_segments<D, GradsLaunch>(b, cuda::vec_aligned(b.x) && cuda::vec_aligned(b.dy),
                                         "norm segment_grads_kernel", st);
}

template <typename D>
Status segment_dx(const Bwd<D>& b, cudaStream_t st) {
  return launch_segments<D, DxLaunch>(
      b, cuda::vec_aligned(b.x) && cuda::vec_aligned(b.dy) && cuda::vec_aligned(b.dx),
      "norm segment_dx_kernel", st);
}

JAXDNN_NORM_CUDA_INSTANTIATE(segment_stats, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(segment_apply, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(segment_grads, Bwd);
JAXDNN_NORM_CUDA_INSTANTIATE(segment_dx, Bwd);

}  // namespace jaxdnn::norm::cuda_impl
