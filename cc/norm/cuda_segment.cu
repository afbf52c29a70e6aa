// CUDA segment path (T > 1; batch and group norm, channels-first): x is a sequence of
// P*A*C*K contiguous segments of T values; segment r = ((p*A + a)*C + c)*K + k belongs to
// group (p, c), uses affine entry (q, c, k), and owns index r of the (P, S = A, C, K)
// workspace planes.
//
// Block of 256 threads: RT = 32 threads per segment (8 segments per block) for short segments,
// or RT = 256 (one segment per block); each thread strides through its segment in VEC-value
// chunks (16-byte vectors when T keeps every segment aligned), a warp reading 512 contiguous
// bytes per step, several steps of loads in flight (pipelined, cuda_kernels.cuh). Blocks loop
// over segment groups (grid-stride).
//   stats  batched Welford moments of x - shift (shift = the segment's first value) per thread,
//          merged across the RT lanes with Chan's update; (mean, M2) in double.
//          Traffic: read x.
//   apply  y = (x - mean)*(rstd*scale) + bias; segments in reverse order for L2 reuse.
//          Traffic: read x, write y.
//   grads  sums of dy and dy*(x - mean) per segment; in inference dx = scale*rstd*dy on the way.
//          Traffic: read x, dy (and write dx in inference).
//   dx     training: dx = scale*rstd*dy + (x - mean)*c1 + c2, reverse order.
//          Traffic: read x, dy, write dx.
//   split  the training forward where segments have >= kSplitMinSegment values (norm.h), three
//          launches: per-unit statistics (a warp per unit: a whole segment, or an equal piece of
//          one when there are fewer segments than warps in a wave), a merge that writes each
//          segment's (mean, rstd*scale, bias) row of a workspace table, and a flat apply (one
//          16-byte pack per thread, blocks in reverse). Traffic: read x twice, write y once,
//          against the fused kernel's once + once + what it re-reads; but the apply is a flat
//          grid, at 4.2 TB/s where the fused kernel's one-wave phase 3 is not (H200, batch_norm
//          NCHW 64x64x112x112 float32: 171 us a call against 179 for the fused kernel,
//          docs/perf/norm.md). The statistics kernel alone reads at 4.0 TB/s, but
//          right after a kernel that wrote ~200 MB (the L2 full of dirty lines to write back)
//          at 3.5, as any reader does (a flat read 4.4 -> 3.6). On the GPU the
//          lowering therefore issues the two halves (segment_split_stats: statistics and
//          merge; segment_split_apply) as separate XLA calls, which XLA schedules as it does
//          its own reductions and elementwise passes (jaxdnn/ops/norm.py).
//   epilogue (norm.h Epilogue) in apply, the table apply and the fused kernel: + residual, ReLU
//          (traffic + read residual); in grads and dx: dy masked where the recomputed z <= 0
//          (+ read residual), dx writing the masked dy as d(residual) (+ write).
//   fused  the single-pass training forward (cuda_kernels.cuh) over units: piece q of segment r
//          (segment_piece_len(s) values, norm.h), unit u = r*pieces + q, its partial at index u.
//          Block b owns a contiguous run of units (so a contiguous slice of x, whose tail is
//          stashed); its warps take the units in turn, a lane every 32nd vector, partials
//          merged per warp by shuffles (no block barrier per unit). Pieces keep every warp busy
//          when segments are few and long (a small batch of large images).
//          Traffic: read x, write y, re-read what was neither stashed nor L2-resident.

#include "cc/norm/cuda_kernels.cuh"

namespace jaxdnn::norm::cuda_impl {
namespace {

constexpr int kThreads = 256;
constexpr int kLoadsInFlight = 4;  // 16-byte loads each thread issues before using them

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

// This lane's VEC-value chunks of a T-value segment: chunks lane, lane + rt, ...; the m-th of
// them starts at value at(m).
template <int VEC>
struct LaneChunks {
  int64_t count;
  int lane, rt;
  __device__ __forceinline__ LaneChunks(int64_t T, int lane_, int rt_) : lane(lane_), rt(rt_) {
    const int64_t chunks = T / VEC;
    count = chunks > lane ? (chunks - lane + rt - 1) / rt : 0;
  }
  __device__ __forceinline__ int64_t at(int64_t m) const { return (lane + m * rt) * VEC; }
};

// Calls f(offset, x values, dy values, residual values) for the lane's chunks of the segment
// at x (and dy, and res: the epilogue's residual, when not null; its values are zeros
// without one), a few chunks of loads in flight; kInputs == 1 reads x alone.
template <typename D, int VEC, int kInputs, typename F>
__device__ __forceinline__ void for_chunks(const D* x, const D* dy, const D* res, int64_t T,
                                           int lane, int rt, F f) {
  using Pk = PackOf<D, VEC>;
  struct Chunks {
    Pk x, dy, res;
  };
  const LaneChunks<VEC> lc(T, lane, rt);
  pipelined<kLoadsInFlight / kInputs, false>(
      0, lc.count,
      [&](int64_t m) {
        Chunks c{};
        c.x = Pk::load_ro(x + lc.at(m));
        if constexpr (kInputs == 2) c.dy = Pk::load_ro(dy + lc.at(m));
        if (res) c.res = Pk::load_ro(res + lc.at(m));
        return c;
      },
      [&](int64_t m, const Chunks& c) {
        A<D> xv[VEC], dv[VEC], rv[VEC] = {};
        c.x.unpack(xv);
        if constexpr (kInputs == 2) c.dy.unpack(dv);
        if (res) c.res.unpack(rv);
        f(lc.at(m), xv, dv, rv);
      });
}

// A segment's per-value coefficients as VEC-wide rows (mask_pack's and finish_pack's form).
template <typename Acc, int VEC>
struct SegmentCoefs {
  Acc mu[VEC], gg[VEC], bb[VEC];
  __device__ __forceinline__ SegmentCoefs(Acc m, Acc g, Acc b) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      mu[e] = m;
      gg[e] = g;
      bb[e] = b;
    }
  }
};

// Sum over the RT lanes of a segment (a warp, or the block); every thread must call it.
template <typename Acc>
__device__ __forceinline__ Acc lane_sum(Acc v, Acc* scratch, int rt) {
  if (rt == 32) return cuda::warp_reduce(v, cuda::SumOp{});
  return cuda::block_reduce(v, cuda::SumOp{}, Acc(0), scratch);
}

// Adds `count` packs of one group's values (v[0..count)) to its moments of x - shift: a
// batched Welford update (fold_deviations), the deviations summed per vector lane e.
template <typename D, int VEC, int U>
__device__ __forceinline__ void add_values(Moments<A<D>>& m, const PackOf<D, VEC> (&v)[U],
                                           int count, A<D> shift) {
  using Acc = A<D>;
  Acc shifts[VEC], means[VEC], s1[VEC] = {}, s2[VEC] = {};
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    shifts[e] = shift;
    means[e] = m.mean;
  }
  sum_deviations<D, VEC, U>(v, count, shifts, means, s1, s2);
#pragma unroll
  for (int e = 1; e < VEC; ++e) {
    s1[0] += s1[e];
    s2[0] += s2[e];
  }
  m.n += Acc(count * VEC);
  fold_deviations(m.mean, m.m2, s1[0], s2[0], Acc(1) / m.n);
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) segment_stats_kernel(Fwd<D> f, SegmentGrid g) {
  using Acc = A<D>;
  __shared__ Moments<Acc> sm[kThreads];
  cuda::await_prior_grids();
  const int64_t T = f.s.T;
  const int lane = int(threadIdx.x) % g.rt, base = int(threadIdx.x) - lane;
  for_segment_groups(g, false, [&](int64_t r) {
    Moments<Acc> m{0, 0, 0};
    Acc shift = 0;
    if (r < g.segs) {
      const D* x = f.x + r * T;
      if (f.centered) shift = to_acc(x[0]);
      const LaneChunks<VEC> lc(T, lane, g.rt);
      batched<kLoadsInFlight, false>(
          0, lc.count, [&](int64_t i) { return PackOf<D, VEC>::load_ro(x + lc.at(i)); },
          [&](int64_t, const auto& v, int count) {
            add_values<D, VEC, kLoadsInFlight>(m, v, count, shift);
          });
    }
    m = merge_group(m, sm, base, lane, g.rt, 1);
    if (r < g.segs && lane == 0)
      store_partial(f.ws0, f.ws1, r, shift, m.n, m.mean, m.m2, f.centered);
    __syncthreads();  // sm is reused by the next group
  });
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) segment_apply_kernel(Fwd<D> f, SegmentGrid g) {
  using Acc = A<D>;
  cuda::await_prior_grids();
  const int64_t T = f.s.T;
  const int lane = int(threadIdx.x) % g.rt;
  for_segment_groups(g, true, [&](int64_t r) {
    if (r >= g.segs) return;
    const SegmentPlace pl(f.s, r);
    const Acc mu = f.mean[pl.group], b = f.bias[pl.affine];
    const Acc gg = rstd_of<D>(f.var[pl.group], f.eps) * f.scale[pl.affine];
    const D* const res = f.residual ? f.residual + r * T : nullptr;
    for_chunks<D, VEC, 1>(f.x + r * T, nullptr, res, T, lane, g.rt,
                          [&](int64_t i, const Acc(&v)[VEC], const Acc(&)[VEC],
                              const Acc(&rv)[VEC]) {
                            Acc out[VEC];
#pragma unroll
                            for (int e = 0; e < VEC; ++e) out[e] = (v[e] - mu) * gg + b;
                            finish_pack<Acc, VEC>(rv, res != nullptr, f.relu, out);
                            store_vals<D, VEC>(f.y + r * T + i, out);
                          });
  });
}

// for_chunks over a backward's x and dy (and the epilogue's residual) of segment r, calling
// f(offset, x values, dy values masked by the epilogue's ReLU; z: the segment's coefficients).
template <typename D, int VEC, typename F>
__device__ __forceinline__ void for_masked_chunks(const Bwd<D>& b, int64_t r, int lane, int rt,
                                                  const SegmentCoefs<A<D>, VEC>& z, F f) {
  using Acc = A<D>;
  const int64_t T = b.s.T;
  const D* const res = b.residual ? b.residual + r * T : nullptr;
  for_chunks<D, VEC, 2>(b.x + r * T, b.dy + r * T, res, T, lane, rt,
                        [&](int64_t i, const Acc(&x)[VEC], const Acc(&dy)[VEC],
                            const Acc(&rv)[VEC]) {
                          Acc d[VEC];
#pragma unroll
                          for (int e = 0; e < VEC; ++e) d[e] = dy[e];
                          if (b.relu) mask_pack<Acc, VEC>(x, rv, res, z.mu, z.gg, z.bb, d);
                          f(i, x, d);
                        });
}

template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads) segment_grads_kernel(Bwd<D> b, SegmentGrid g) {
  using Acc = A<D>;
  __shared__ Acc scratch[32];
  cuda::await_prior_grids();
  const int64_t T = b.s.T;
  const int lane = int(threadIdx.x) % g.rt;
  for_segment_groups(g, false, [&](int64_t r) {
    Acc sdy = 0, sdyx = 0, rs = 0;
    if (r < g.segs) {
      const SegmentPlace pl(b.s, r);
      const Acc mu = b.mean[pl.group];
      rs = rstd_of<D>(b.var[pl.group], b.eps);
      const Acc gz = rs * b.scale[pl.affine];
      const Acc gr = b.coef_fn.training ? Acc(0) : gz;
      const SegmentCoefs<Acc, VEC> z(mu, gz, b.relu ? b.bias[pl.affine] : Acc(0));
      for_masked_chunks<D, VEC>(b, r, lane, g.rt, z,
                                [&](int64_t i, const Acc(&x)[VEC], const Acc(&d)[VEC]) {
                                  Acc dx[VEC];
#pragma unroll
                                  for (int e = 0; e < VEC; ++e) {
                                    sdy += d[e];
                                    sdyx += d[e] * (x[e] - mu);
                                    dx[e] = gr * d[e];
                                  }
                                  if (!b.coef_fn.training) {  // inference: dx, d(residual)
                                    store_vals<D, VEC>(b.dx + r * T + i, dx);
                                    if (b.dres) store_vals<D, VEC>(b.dres + r * T + i, d);
                                  }
                                });
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
  cuda::await_prior_grids();
  const int64_t T = b.s.T;
  const int lane = int(threadIdx.x) % g.rt;
  for_segment_groups(g, true, [&](int64_t r) {
    if (r >= g.segs) return;
    const SegmentPlace pl(b.s, r);
    const Acc mu = b.mean[pl.group], c1 = b.coef[2 * pl.group], c2 = b.coef[2 * pl.group + 1];
    const Acc gr = rstd_of<D>(b.var[pl.group], b.eps) * b.scale[pl.affine];
    const SegmentCoefs<Acc, VEC> z(mu, gr, b.relu ? b.bias[pl.affine] : Acc(0));
    for_masked_chunks<D, VEC>(b, r, lane, g.rt, z,
                              [&](int64_t i, const Acc(&x)[VEC], const Acc(&d)[VEC]) {
                                Acc out[VEC];
#pragma unroll
                                for (int e = 0; e < VEC; ++e)
                                  out[e] = gr * d[e] + (x[e] - mu) * c1 + c2;
                                store_vals<D, VEC>(b.dx + r * T + i, out);
                                if (b.dres) store_vals<D, VEC>(b.dres + r * T + i, d);
                              });
  });
}

// Units of the fused forward: unit u = piece u % pieces of segment u / pieces, values
// [q*len, min(T, (q + 1)*len)) of it; consecutive units are contiguous in x.
struct SegmentUnits {
  int64_t T, len, pieces, units;
  __device__ __forceinline__ int64_t begin(int64_t u) const {
    return u / pieces * T + u % pieces * len;
  }
  __device__ __forceinline__ int64_t piece_size(int64_t q) const {
    return min(T, (q + 1) * len) - q * len;
  }
  __device__ __forceinline__ int64_t size(int64_t u) const { return piece_size(u % pieces); }
};

// merge_groups' partials of group (p, c): the units of its A*K segments; partial i is piece
// q = i % pieces of segment k = i / pieces % K of sample row a = i / (pieces*K). Div divides
// by pieces, K and C: cuda::FastDiv where the launcher has checked that A*K*pieces and the
// group count are below 2^31, else cuda::PlainDiv (the split forward's merge is a latency
// chain: with 32-bit divisions it took 7.3 us for batch_norm NCHW's 64 groups of 64 partials).
template <typename Div>
struct UnitParts {
  Shape s;
  SegmentUnits su;
  Div pieces, K, C;
  __host__ __device__ UnitParts(const Shape& s_, const SegmentUnits& su_)
      : s(s_), su(su_), pieces(su_.pieces), K(s_.K), C(s_.C) {}
  __device__ __forceinline__ double operator()(int64_t grp, int64_t i, int64_t* idx) const {
    const int64_t t = pieces.div(i), q = i - t * su.pieces, a = K.div(t), k = t - a * s.K;
    const int64_t p = C.div(grp), c = grp - p * s.C;
    *idx = (((p * s.A + a) * s.C + c) * s.K + k) * su.pieces + q;
    return double(su.piece_size(q));
  }
};

// Partial u from the lanes' moments m of x - shift: warp-merged, lane 0 writes it. Every lane
// of the warp calls it.
template <typename D>
__device__ __forceinline__ void store_unit(const Fwd<D>& f, int64_t u, A<D> shift,
                                           Moments<A<D>> m, int lane) {
  m = warp_merge(m);
  if (lane == 0) store_partial(f.ws0, f.ws1, u, shift, m.n, m.mean, m.m2, f.centered);
}

// Phase 3's streamed chunks in flight per lane (+ 1): a 16-bit type's unit of the benchmark's
// batch_norm gives each lane only 12 chunks.
template <typename D>
constexpr int kSegmentRing = sizeof(D) == 2 ? 8 : 16;

template <typename D, int VEC>
__global__ void __launch_bounds__(kFusedThreads, 1)
    segment_fused_kernel(Fwd<D> f, SegmentUnits su, int64_t keep) {
  using Acc = A<D>;
  using Pk = PackOf<D, VEC>;
  extern __shared__ uint4 stash_words[];
  D* const stash = reinterpret_cast<D*>(stash_words);
  const Shape& s = f.s;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = kFusedThreads / 32;
  // Units [u0, u1): x[e0, e1), of which [kept, e1) stays in shared memory.
  const int64_t u0 = su.units * blockIdx.x / gridDim.x,
                u1 = su.units * (blockIdx.x + 1) / gridDim.x;
  const int64_t e0 = su.begin(u0), e1 = su.begin(u1 - 1) + su.size(u1 - 1);
  const int64_t kept = e1 - min(e1 - e0, keep);
  JAXDNN_NORM_PHASE(0);
  // The lane's chunks of unit u (its LaneChunks over the warp), at values at(m) of x, m in
  // [0, count); those from split on are stashed (at stash + at(m) - kept).
  struct Chunks : LaneChunks<VEC> {
    int64_t begin, split;
    __device__ Chunks(int64_t begin_, int64_t size, int lane)
        : LaneChunks<VEC>(size, lane, 32), begin(begin_) {}
    __device__ int64_t at(int64_t m) const { return begin + LaneChunks<VEC>::at(m); }
  };
  auto chunks_of = [&](int64_t u) {
    Chunks c(su.begin(u), su.size(u), lane);
    const int64_t stashed = kept - c.begin;  // first stashed value of the unit, relative
    const int64_t ahead = (stashed > 0 ? (stashed + VEC - 1) / VEC : 0) - lane;
    c.split = ahead <= 0 ? 0 : min(c.count, (ahead + 31) / 32);
    return c;
  };
  for (int64_t u = u0 + warp; u < u1; u += warps) {
    const Chunks c = chunks_of(u);
    for (int64_t m = c.split; m < c.count; ++m)
      cuda::cp_async16(stash + (c.at(m) - kept), f.x + c.at(m));
  }

  // Phase 1: per unit, the lanes' chunk moments (streamed chunks, then stashed), warp-merged.
  for (int64_t u = u0 + warp; u < u1; u += warps) {
    const Chunks c = chunks_of(u);
    const Acc shift = f.centered ? to_acc(f.x[su.begin(u)]) : Acc(0);
    Moments<Acc> m{0, 0, 0};
    auto add = [&](int64_t, const auto& v, int count) {
      add_values<D, VEC, kFusedInFlight>(m, v, count, shift);
    };
    batched<kFusedInFlight, false>(
        0, c.split, [&](int64_t i) { return Pk::load_ro(f.x + c.at(i)); }, add);
    if (c.split < c.count) cuda::cp_async_wait_all();
    batched<kFusedInFlight, false>(
        c.split, c.count, [&](int64_t i) { return Pk::load(stash + (c.at(i) - kept)); }, add);
    store_unit(f, u, shift, m, lane);
  }
  JAXDNN_NORM_PHASE(1);
  grid_sync();

  // Phase 2: group (p, c) merges the units of its A*K segments.
  merge_groups(f, s.A * s.K * su.pieces, UnitParts<cuda::PlainDiv>(s, su));
  grid_sync();
  JAXDNN_NORM_PHASE(2);

  // Phase 3: units in reverse, each from the stash and then from the streamed chunks. The
  // streamed ones go through a ring of the lane's stash slots in the warp's last unit (the first
  // one done) when every lane has kSegmentRing of them.
  const int64_t mine = u1 - u0 > warp ? (u1 - u0 - warp + warps - 1) / warps : 0;
  const Chunks last = chunks_of(u0 + warp + max(mine - 1, int64_t(0)) * warps);
  const bool ring = __all_sync(~0u, mine > 0 && last.count - last.split >= kSegmentRing<D>);
  for (int64_t k = mine - 1; k >= 0; --k) {
    const int64_t u = u0 + warp + k * warps;
    const SegmentPlace pl(s, u / su.pieces);
    const Acc mu = f.mean[pl.group], b = f.bias[pl.affine];
    const Acc gg = rstd_of<D>(f.var[pl.group], f.eps) * f.scale[pl.affine];
    const Chunks c = chunks_of(u);
    auto apply = [&](int64_t i, const Pk& v) {
      Acc out[VEC], rv[VEC] = {};
      v.unpack(out);
      if (f.residual) Pk::load_ro(f.residual + c.at(i)).unpack(rv);  // (the epilogue's)
#pragma unroll
      for (int e = 0; e < VEC; ++e) out[e] = (out[e] - mu) * gg + b;
      finish_pack<Acc, VEC>(rv, f.residual != nullptr, f.relu, out);
      store_vals<D, VEC>(f.y + c.at(i), out);
    };
    pipelined<kFusedInFlight, true>(
        c.split, c.count, [&](int64_t i) { return Pk::load(stash + (c.at(i) - kept)); }, apply);
    if (ring) {
      ring_stream<kSegmentRing<D>, Pk>(
          c.split, [&](int64_t q) { return f.x + c.at(c.split - 1 - q); },
          [&](int j) { return stash + (last.at(last.split + j) - kept); },
          [&](int64_t q, const Pk& v) { apply(c.split - 1 - q, v); });
    } else {
      pipelined<kFusedInFlight, true>(
          0, c.split, [&](int64_t i) { return Pk::load_stream(f.x + c.at(i)); }, apply);
    }
  }
  JAXDNN_NORM_PHASE(3);
}

// Split training forward (three regular launches; segment_split):
// 1. segment_unit_stats: warp w of block b takes unit u = b*8 + w (the fused kernel's phase 1
//    without the stash): its lanes' batched Welford moments over the unit's chunks,
//    kFusedInFlight 16-byte loads in flight per lane, warp-merged into partial u. No block
//    barrier: the three-pass stats kernel, one segment per block reduced across the block by an
//    8-level tree, read group_norm NCHW 32x256x56x56 at 1.9 TB/s, this one at 3.0.
template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads, 4)
    segment_unit_stats_kernel(Fwd<D> f, SegmentUnits su) {
  using Acc = A<D>;
  using Pk = PackOf<D, VEC>;
  cuda::await_prior_grids();
  const int lane = threadIdx.x % 32;
  const int64_t u = blockIdx.x * int64_t(kThreads / 32) + threadIdx.x / 32;
  if (u >= su.units) return;  // the warp's lanes alike
  const D* const x = f.x + su.begin(u);
  const Acc shift = f.centered ? to_acc(x[0]) : Acc(0);
  const LaneChunks<VEC> lc(su.size(u), lane, 32);
  Moments<Acc> m{0, 0, 0};
  batched<kFusedInFlight, false>(
      0, lc.count, [&](int64_t i) { return Pk::load_ro(x + lc.at(i)); },
      [&](int64_t, const auto& v, int count) {
        add_values<D, VEC, kFusedInFlight>(m, v, count, shift);
      });
  store_unit(f, u, shift, m, lane);
}

// 2. segment_table_merge: each group's units merged (merge_groups), its team's first warp
//    writing mean, var and the table row (mean, rstd*scale, bias) of each of its A*K segments.
template <typename D>
__global__ void __launch_bounds__(kFusedThreads)
    segment_table_merge_kernel(Fwd<D> f, UnitParts<cuda::FastDiv> part) {
  using Acc = A<D>;
  cuda::await_prior_grids();
  const Shape& s = f.s;
  merge_groups(f, s.A * s.K * part.su.pieces, part,
               [&](int64_t grp, Acc mean, Acc var, int lane) {
                 if (lane == 0) {
                   f.mean[grp] = mean;
                   f.var[grp] = var;
                 }
                 const int64_t p = part.C.div(grp), c = grp - p * s.C;
                 // (affine row p / Pq: a 64-bit division, skipped when there is one row)
                 const int64_t affine = ((s.Q == 1 ? 0 : p / s.Pq()) * s.C + c) * s.K;
                 const Acc* const scale = f.scale + affine;
                 const Acc* const bias = f.bias + affine;
                 Acc* const rows = f.table + 4 * ((p * s.A * s.C + c) * s.K);  // (a, k) = (0, 0)
                 const Acc rstd = rstd_of<D>(var, f.eps);
                 for (int i = lane; i < s.A * s.K; i += 32) {
                   const int a = part.K.div(i), k = i - a * int(s.K);
                   Acc* const row = rows + 4 * (int64_t(a) * s.C * s.K + k);
                   row[0] = mean;
                   row[1] = rstd * scale[k];
                   row[2] = bias[k];
                 }
               });
}

// 3. segment_table_apply: y = (x - mean)*g + b, one 16-byte pack per thread (the activations'
//    flat grid, which streams at the copy rate where one-wave loops do not), blocks in reverse
//    (the first ones read what the statistics pass left in L2); the pack's segment's row of the
//    table in one or two 16-byte loads. The table has a row per segment although a row depends
//    only on (p, c, k): the pack's row is then one division away, not three. packs < 2^31.
template <typename D, int VEC>
__global__ void __launch_bounds__(kThreads)
    segment_table_apply_kernel(Fwd<D> f, unsigned packs, unsigned seg_packs) {
  using Acc = A<D>;
  cuda::await_prior_grids();
  const unsigned i = (gridDim.x - 1 - blockIdx.x) * unsigned(kThreads) + threadIdx.x;
  if (i >= packs) return;
  Acc row[4];
  load_words(f.table + 4 * int64_t(i / seg_packs), row);
  const int64_t at = int64_t(i) * VEC;
  Acc out[VEC], rv[VEC] = {};
  PackOf<D, VEC>::load_ro(f.x + at).unpack(out);
  if (f.residual) PackOf<D, VEC>::load_ro(f.residual + at).unpack(rv);  // (the epilogue's)
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = (out[e] - row[0]) * row[1] + row[2];
  finish_pack<Acc, VEC>(rv, f.residual != nullptr, f.relu, out);
  store_vals<D, VEC>(f.y + at, out);
}

SegmentUnits segment_units(const Shape& s) {
  return SegmentUnits{s.T, segment_piece_len(s), segment_pieces(s),
                      s.P * s.A * s.C * s.K * segment_pieces(s)};
}

// The split forward's units: whole segments, or, when there are fewer segments than warps in one
// wave of the statistics kernel (wave_warps), as many equal pieces of each as still give every
// warp of the wave a unit, never more than the workspace holds (segment_pieces). With the fused
// kernel's ~16K units the statistics kernel took as long (H200, float32 batch_norm NCHW 56.7 us
// both, group_norm 33.2 against 33.8), and the merge had more partials.
SegmentUnits split_units(const Shape& s, int64_t wave_warps) {
  const int64_t segs = s.P * s.A * s.C * s.K;
  const int64_t want = std::min(segment_pieces(s), std::max<int64_t>(1, wave_warps / segs));
  const int64_t len = ((s.T + want - 1) / want + 7) / 8 * 8, pieces = (s.T + len - 1) / len;
  return SegmentUnits{s.T, len, pieces, segs * pieces};
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
  if (vec) return Launch<D, Vec<D>::kN>::run(v, g, grid, name, st);
  return Launch<D, 1>::run(v, g, grid, name, st);
}

#define JAXDNN_SEGMENT_LAUNCH(Name, kernel, View)                                              \
  template <typename D, int VEC>                                                               \
  struct Name {                                                                                \
    static Status run(const View<D>& v, const SegmentGrid& g, unsigned grid, const char* name, \
                      cudaStream_t st) {                                                       \
      return cuda::launch(name, kernel<D, VEC>, grid, kThreads, 0, st, v, g);                  \
    }                                                                                          \
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
  return launch_segments<D, ApplyLaunch>(f, fwd_aligned(f), "norm segment_apply_kernel", st);
}

template <typename D>
Status segment_grads(const Bwd<D>& b, cudaStream_t st) {
  return launch_segments<D, GradsLaunch>(b, bwd_aligned(b), "norm segment_grads_kernel", st);
}

template <typename D>
Status segment_dx(const Bwd<D>& b, cudaStream_t st) {
  return launch_segments<D, DxLaunch>(b, bwd_aligned(b), "norm segment_dx_kernel", st);
}

template <typename D>
Support segment_fused_support(const Shape& s) {
  constexpr int N = Vec<D>::kN;
  if (s.T % N != 0)
    return Support::No("segments of T = " + std::to_string(s.T) + " values are not whole " +
                       "16-byte vectors");
  FusedCapacity cap;
  if (Status st = fused_capacity<segment_fused_kernel<D, N>>(&cap); !st.ok())
    return Support::No(st.message);
  if (cap.blocks == 0) return Support::No("the GPU takes no cooperative launch of the kernel");
  return Support::Yes();
}

template <typename D>
Status segment_fused(const Fwd<D>& f, cudaStream_t st) {
  constexpr int N = Vec<D>::kN;
  if (!fwd_aligned(f))
    return Status::Error("norm segment single pass: x, y and the residual must be 16-byte "
                         "aligned");
  constexpr auto kernel = segment_fused_kernel<D, N>;
  FusedCapacity cap;
  Status status = fused_capacity<kernel>(&cap);
  if (!status.ok()) return status;
  const SegmentUnits su = segment_units(f.s);
  return launch_cooperative(kernel, std::min(cap.blocks, su.units), cap.stash_bytes, st,
                            "norm segment_fused_kernel", f, su,
                            cap.stash_bytes / int64_t(sizeof(D)));
}

namespace {

// The split forward's units for shape s, and why it does not apply (units == 0): the segments
// must be long enough, whole 16-byte packs, and the merge's indices fit 32 bits.
template <typename D>
SegmentUnits split_units_of(const Shape& s, std::string* why) {
  constexpr int N = Vec<D>::kN;
  constexpr int64_t kIndex = int64_t(1) << 31;
  if (!segment_split_shape(s)) {
    *why = "segments shorter than " + std::to_string(kSplitMinSegment) + " values";
    return SegmentUnits{};
  }
  if (s.T % N != 0 || s.elems() / N >= kIndex) {
    *why = "segments not whole 16-byte vectors, or more than 2^31 vectors";
    return SegmentUnits{};
  }
  constexpr auto stats = segment_unit_stats_kernel<D, N>;
  const SegmentUnits su =
      split_units(s, kThreads / 32 * cuda::resident_grid<stats, kThreads>(int64_t(1) << 40));
  if (s.A * s.K * su.pieces >= kIndex || s.groups() >= kIndex) {
    *why = "more than 2^31 pieces or groups";
    return SegmentUnits{};
  }
  return su;
}

}  // namespace

template <typename D>
Support segment_split_support(const Shape& s) {
  std::string why;
  return split_units_of<D>(s, &why).units > 0 ? Support::Yes() : Support::No(why);
}

// The split forward's statistics half: per-unit statistics, then the merge into the table.
template <typename D>
Status segment_split_stats(const Fwd<D>& f, cudaStream_t st) {
  constexpr int64_t kWarps = kThreads / 32;
  const Shape& s = f.s;
  std::string why;
  const SegmentUnits su = split_units_of<D>(s, &why);
  if (su.units == 0) return Status::Error("norm segment split: " + why);
  if (!cuda::vec_aligned(f.x))
    return Status::Error("norm segment split: x must be 16-byte aligned");
  Status status = cuda::launch("norm segment_unit_stats_kernel",
                               segment_unit_stats_kernel<D, Vec<D>::kN>,
                               unsigned((su.units + kWarps - 1) / kWarps), kThreads, 0, st, f, su);
  if (!status.ok()) return status;
  const MergeLaunch ml = merge_launch(s.groups(), s.A * s.K * su.pieces);
  return cuda::launch("norm segment_table_merge_kernel", segment_table_merge_kernel<D>, ml.blocks,
                      ml.threads, 0, st, f, UnitParts<cuda::FastDiv>(s, su));
}

// The split forward's apply half: y from the table, one 16-byte pack per thread.
template <typename D>
Status segment_split_apply(const Fwd<D>& f, cudaStream_t st) {
  constexpr int N = Vec<D>::kN;
  if (!fwd_aligned(f))
    return Status::Error("norm segment split: x, y and the residual must be 16-byte aligned");
  const int64_t packs = f.s.elems() / N;
  return cuda::launch("norm segment_table_apply_kernel", segment_table_apply_kernel<D, N>,
                      unsigned((packs + kThreads - 1) / kThreads), kThreads, 0, st, f,
                      unsigned(packs), unsigned(f.s.T / N));
}

JAXDNN_NORM_CUDA_INSTANTIATE(segment_stats, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(segment_apply, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(segment_grads, Bwd);
JAXDNN_NORM_CUDA_INSTANTIATE(segment_dx, Bwd);
JAXDNN_NORM_CUDA_INSTANTIATE(segment_fused, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(segment_split_stats, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE(segment_split_apply, Fwd);
JAXDNN_NORM_CUDA_INSTANTIATE_SUPPORT(segment_fused_support);
JAXDNN_NORM_CUDA_INSTANTIATE_SUPPORT(segment_split_support);

}  // namespace jaxdnn::norm::cuda_impl
