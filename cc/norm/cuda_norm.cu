// CUDA norm entry points: pick the path (norm.h), enqueue its passes, and merge the partials.
// Training forward of the column and segment paths: on the segment path the split forward
// (cuda_segment.cu) where it applies, then the single-pass cooperative kernel
// (cuda_kernels.cuh) where it applies, else three passes: stats, merge, apply. The two-call
// forward (Half) runs the statistics (the split's, or stats and merge) and the apply as separate
// XLA calls.
//
// Merge kernels (fixed combination order, so results are bitwise reproducible):
//   stats   a team of warps per group (p, c) (merge_groups, cuda_kernels.cuh): threads take the
//           (slice, k) partials in strides and sum them about a shift in double -> mean, var.
//   grads   one block per group: sg = sum scale*sum(dy), sgx = sum scale*sum(dy*xhat) in
//           double, block sums -> dx coefficients (or the inference statistics' gradients).
//   params  block (32 columns x 8 row splits) per column tile and affine row q: each thread
//           sums every 8th partial row in double, the 8 splits are added in order.
//           Traffic: read the partials once.

#include <limits>

#include "cc/common/env.h"
#include "cc/norm/cuda_kernels.cuh"
#include "cc/norm/cuda_norm.h"

namespace jaxdnn::norm {
namespace cuda_impl {
namespace {

constexpr int kMergeThreads = 256;

template <typename D, typename Div>
__global__ void __launch_bounds__(kFusedThreads) stats_merge_kernel(Fwd<D> f,
                                                                    SliceParts<Div> part) {
  cuda::await_prior_grids();
  merge_groups(f, part.slices * f.s.K, part);
}

template <typename D>
__global__ void __launch_bounds__(kMergeThreads) grad_merge_kernel(Bwd<D> b, int64_t slices) {
  using Acc = A<D>;
  __shared__ double scratch[32];
  cuda::await_prior_grids();
  const Shape& s = b.s;
  const int tid = threadIdx.x;
  for (int64_t grp = blockIdx.x; grp < s.groups(); grp += gridDim.x) {
    const int64_t p = grp / s.C, c = grp % s.C;
    const Acc* scale = b.scale + (p / s.Pq() * s.C + c) * s.K;
    double sg = 0, sgx = 0;
    for (int64_t i = tid; i < slices * s.K; i += kMergeThreads) {
      const int64_t sl = i / s.K, k = i % s.K, off = (p * slices + sl) * s.CK() + c * s.K + k;
      sg += double(scale[k]) * double(b.ws1[off]);
      sgx += double(scale[k]) * double(b.ws0[off]);
    }
    sg = cuda::block_reduce(sg, cuda::SumOp{}, 0.0, scratch);
    sgx = cuda::block_reduce(sgx, cuda::SumOp{}, 0.0, scratch);
    Acc c1, c2;
    b.coef_fn(grp, Acc(1) / Acc(s.group_size()), rstd_of<D>(b.var[grp], b.eps), Acc(sg),
              Acc(sgx), &c1, &c2, tid == 0);
    if (tid == 0) {
      b.coef[2 * grp] = c1;
      b.coef[2 * grp + 1] = c2;
    }
  }
}

// 32 columns x 32 splits of the partial rows per block, each thread's loop unrolled by 8, so that
// many loads are in flight: a 4096-wide layer norm's 264-512 partial rows (8.7-16.8 MB) reduce in
// 4.5-6.7 us on the H200 (benchmarks/NOTES.md, session 25).
constexpr int kParamCols = 32, kParamSplits = 32;

// dscale[q, j] = sum_r ws0[(q*R + r)*CK + j], dbias likewise from ws1.
template <typename Acc>
__global__ void __launch_bounds__(kParamCols* kParamSplits)
    param_reduce_kernel(const Acc* ws0, const Acc* ws1, Acc* dscale, Acc* dbias, int64_t R,
                        int64_t CK, int64_t tiles) {
  __shared__ double part[2][kParamSplits][kParamCols];  // (ws plane, split, column)
  cuda::await_prior_grids();
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t q = blockIdx.x / tiles, j = blockIdx.x % tiles * kParamCols + tx;
  double a0 = 0, a1 = 0;
  if (j < CK)
#pragma unroll 8
    for (int64_t r = ty; r < R; r += kParamSplits) {
      a0 += double(ws0[(q * R + r) * CK + j]);
      a1 += double(ws1[(q * R + r) * CK + j]);
    }
  part[0][ty][tx] = a0;
  part[1][ty][tx] = a1;
  __syncthreads();
  if (ty != 0 || j >= CK) return;
  for (int y = 1; y < kParamSplits; ++y) {
    a0 += part[0][y][tx];
    a1 += part[1][y][tx];
  }
  dscale[q * CK + j] = Acc(a0);
  dbias[q * CK + j] = Acc(a1);
}

// The statistics from the partials of the column path's stats pass (column_stats_rows rows per
// slice) or the segment path's (a partial per segment).
template <typename D>
Status merge_stats(const Fwd<D>& f, cudaStream_t st) {
  const Shape& s = f.s;
  const int64_t rps = path_of(s) == Path::kColumn ? column_stats_rows(s, Vec<D>::kN) : 1;
  const int64_t slices = (s.A + rps - 1) / rps;
  const MergeLaunch ml = merge_launch(s.groups(), slices * s.K);
  constexpr int64_t kIndex = int64_t(1) << 31;
  constexpr const char* kName = "norm stats_merge_kernel";
  if (slices * s.K < kIndex && s.groups() < kIndex)
    return cuda::launch(kName, stats_merge_kernel<D, cuda::FastDiv>, ml.blocks, ml.threads, 0, st,
                        f, SliceParts<cuda::FastDiv>(s, slices, rps));
  return cuda::launch(kName, stats_merge_kernel<D, cuda::PlainDiv>, ml.blocks, ml.threads, 0, st,
                      f, SliceParts<cuda::PlainDiv>(s, slices, rps));
}

template <typename D>
Status merge_grads(const Bwd<D>& b, cudaStream_t st) {
  const unsigned grid = unsigned(std::min<int64_t>(b.s.groups(), 132 * 16));
  return cuda::launch("norm grad_merge_kernel", grad_merge_kernel<D>, grid, kMergeThreads, 0, st,
                      b, num_slices(b.s));
}

template <typename Acc>
Status reduce_params(const Acc* ws0, const Acc* ws1, Acc* dscale, Acc* dbias, const Shape& s,
                     int64_t R, cudaStream_t st) {
  const int64_t tiles = (s.CK() + kParamCols - 1) / kParamCols;
  if (s.Q * tiles == 0) return Status::Ok();
  return cuda::launch("norm param_reduce_kernel", param_reduce_kernel<Acc>, unsigned(s.Q * tiles),
                      dim3(kParamCols, kParamSplits), 0, st, ws0, ws1, dscale, dbias, R, s.CK(),
                      tiles);
}

// Runs the steps in order, stopping at the first failure.
template <typename... Steps>
Status run_steps(Steps&&... steps) {
  Status st;
  ((st.ok() ? (st = steps()) : st), ...);
  return st;
}

Status memset_bytes(void* p, int value, int64_t bytes, cudaStream_t st) {
  if (bytes == 0) return Status::Ok();
  cudaError_t e = cudaMemsetAsync(p, value, size_t(bytes), st);
  if (e != cudaSuccess)
    return Status::Error(std::string("norm: memset failed: ") + cudaGetErrorString(e));
  return Status::Ok();
}

// The split and single-pass training forwards where they apply, unless JAXDNN_NORM_NO_FUSED=1
// (the three passes: stats, merge, apply); JAXDNN_NORM_NO_SPLIT=1 leaves out the split one
// (the two-call forward then runs the three passes). Benchmarks compare them so.
bool use_fused() {
  static const bool off = env_switch("JAXDNN_NORM_NO_FUSED") == '1';
  return !off;
}
bool use_split() {
  static const bool off = env_switch("JAXDNN_NORM_NO_SPLIT") == '1';
  return use_fused() && !off;
}

// What a forward call runs: all of it, or one half of the two-call training forward.
enum class Half { kAll, kStats, kApply };

template <typename D>
Status forward(const Problem& p, const FwdBuffers& b, bool training, cudaStream_t st,
               Half half = Half::kAll) {
  using Acc = A<D>;
  auto* ws = static_cast<double*>(b.ws);
  const Fwd<D> f{p.s, p.centered, training, Acc(p.eps), static_cast<const D*>(b.x),
                 static_cast<const Acc*>(b.scale), static_cast<const Acc*>(b.bias),
                 static_cast<D*>(b.y), static_cast<Acc*>(b.mean), static_cast<Acc*>(b.var),
                 ws, ws ? ws + fwd_partials(p.s) : nullptr,
                 ws ? reinterpret_cast<Acc*>(ws + 2 * fwd_partials(p.s)) : nullptr};
  if (half != Half::kAll && (!training || path_of(p.s) == Path::kRow))
    return Status::Error("norm: the two-call forward is for training, column and segment paths");
  if (p.s.elems() == 0) {  // empty groups: NaN statistics (0xFF bytes are NaN)
    if (!training || half == Half::kApply) return Status::Ok();
    return run_steps([&] { return memset_bytes(f.mean, 0xFF, p.s.groups() * sizeof(Acc), st); },
                     [&] { return memset_bytes(f.var, 0xFF, p.s.groups() * sizeof(Acc), st); });
  }
  switch (path_of(p.s)) {
    case Path::kRow:
      return row_forward(f, st);
    case Path::kColumn: {
      if (!training || half == Half::kApply) return column_apply(f, st);
      if (half == Half::kStats)
        return run_steps([&] { return column_stats(f, st); }, [&] { return merge_stats(f, st); });
      bool fused = false;
      if (use_fused()) {
        if (Status s = column_fused(f, st, &fused); !s.ok() || fused) return s;
      }
      return run_steps([&] { return column_stats(f, st); }, [&] { return merge_stats(f, st); },
                       [&] { return column_apply(f, st); });
    }
    case Path::kSegment: {
      if (!training) return segment_apply(f, st);
      bool ran = false;
      if (half == Half::kStats) {
        if (use_split()) {
          if (Status s = segment_split_stats(f, st, &ran); !s.ok() || ran) return s;
        }
        return run_steps([&] { return segment_stats(f, st); }, [&] { return merge_stats(f, st); });
      }
      if (half == Half::kApply) {
        if (use_split()) {
          if (Status s = segment_split_apply(f, st, &ran); !s.ok() || ran) return s;
        }
        return segment_apply(f, st);
      }
      if (use_split()) {
        if (Status s = segment_split(f, st, &ran); !s.ok() || ran) return s;
      }
      if (use_fused()) {
        if (Status s = segment_fused(f, st, &ran); !s.ok() || ran) return s;
      }
      return run_steps([&] { return segment_stats(f, st); }, [&] { return merge_stats(f, st); },
                       [&] { return segment_apply(f, st); });
    }
  }
  return Status::Error("norm: unknown path");
}

template <typename D>
Status backward(const Problem& p, const BwdBuffers& b, cudaStream_t st) {
  using Acc = A<D>;
  const Shape& s = p.s;
  auto* ws = static_cast<Acc*>(b.ws);
  const int64_t plane = bwd_partials(s);
  const bool row = path_of(s) == Path::kRow;
  const GradCoef<Acc> coef_fn{b.training, p.centered, static_cast<const Acc*>(b.dmean),
                              static_cast<const Acc*>(b.dvar), static_cast<Acc*>(b.dmean_out),
                              static_cast<Acc*>(b.dvar_out)};
  const Bwd<D> v{s, p.centered, Acc(p.eps), static_cast<const D*>(b.dy),
                 static_cast<const D*>(b.x), static_cast<const Acc*>(b.scale),
                 static_cast<const Acc*>(b.mean), static_cast<const Acc*>(b.var),
                 static_cast<D*>(b.dx), coef_fn, ws, ws ? ws + plane : nullptr,
                 (row || !ws) ? nullptr : ws + 2 * plane};
  auto* dscale = static_cast<Acc*>(b.dscale);
  auto* dbias = static_cast<Acc*>(b.dbias);
  if (s.elems() == 0) {  // every sum is empty
    const int64_t pb = s.Q * s.CK() * sizeof(Acc), gb = s.groups() * sizeof(Acc);
    auto stat_grad = [&](void* out) {  // inference only: d(mean), d(var)
      return b.training ? Status::Ok() : memset_bytes(out, 0, gb, st);
    };
    return run_steps([&] { return memset_bytes(dscale, 0, pb, st); },
                     [&] { return memset_bytes(dbias, 0, pb, st); },
                     [&] { return stat_grad(b.dmean_out); }, [&] { return stat_grad(b.dvar_out); });
  }
  switch (path_of(s)) {
    case Path::kRow: {
      int64_t slices = 0;
      return run_steps([&] { return row_backward(v, &slices, st); },
                       [&] { return reduce_params(v.ws0, v.ws1, dscale, dbias, s, slices, st); });
    }
    case Path::kColumn:  // (inference: column_grads writes dx too)
      return run_steps([&] { return column_grads(v, st); }, [&] { return merge_grads(v, st); },
                       [&] {
                         return reduce_params(v.ws0, v.ws1, dscale, dbias, s,
                                              s.Pq() * num_slices(s), st);
                       },
                       [&] { return b.training ? column_dx(v, st) : Status::Ok(); });
    case Path::kSegment:  // (inference: segment_grads writes dx too)
      return run_steps([&] { return segment_grads(v, st); }, [&] { return merge_grads(v, st); },
                       [&] {
                         return reduce_params(v.ws0, v.ws1, dscale, dbias, s,
                                              s.Pq() * num_slices(s), st);
                       },
                       [&] { return b.training ? segment_dx(v, st) : Status::Ok(); });
  }
  return Status::Error("norm: unknown path");
}

template <typename Fn>
Status with_dtype(const Problem& p, const char* what, Fn&& fn) {
  Status st = validate(p.s);
  if (!st.ok()) return Status::Error(std::string("norm ") + what + ": " + st.message);
  Status out;
  if (!dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) { out = fn(device_t<decltype(tag)>{}); }))
    return Status::Error(std::string("norm ") + what + ": unsupported dtype " +
                         dtype_name(p.dtype));
  return out;
}

}  // namespace
}  // namespace cuda_impl

Status cuda_forward(const Problem& p, const FwdBuffers& b, cudaStream_t stream) {
  return cuda_impl::with_dtype(p, "forward", [&](auto tag) {
    return cuda_impl::forward<decltype(tag)>(p, b, /*training=*/true, stream);
  });
}

Status cuda_forward_stats(const Problem& p, const FwdBuffers& b, cudaStream_t stream) {
  return cuda_impl::with_dtype(p, "forward statistics", [&](auto tag) {
    return cuda_impl::forward<decltype(tag)>(p, b, true, stream, cuda_impl::Half::kStats);
  });
}

Status cuda_forward_apply(const Problem& p, const FwdBuffers& b, cudaStream_t stream) {
  return cuda_impl::with_dtype(p, "forward apply", [&](auto tag) {
    return cuda_impl::forward<decltype(tag)>(p, b, true, stream, cuda_impl::Half::kApply);
  });
}

Status cuda_inference(const Problem& p, const FwdBuffers& b, cudaStream_t stream) {
  return cuda_impl::with_dtype(p, "inference", [&](auto tag) {
    return cuda_impl::forward<decltype(tag)>(p, b, /*training=*/false, stream);
  });
}

Status cuda_backward(const Problem& p, const BwdBuffers& b, cudaStream_t stream) {
  return cuda_impl::with_dtype(
      p, "backward", [&](auto tag) { return cuda_impl::backward<decltype(tag)>(p, b, stream); });
}

}  // namespace jaxdnn::norm
