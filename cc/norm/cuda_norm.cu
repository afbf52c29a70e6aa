// The CUDA norm registry and entry points: each algorithm enqueues its passes and merges the
// partials. Training forwards of the column and segment paths:
//   *_single_pass     the cooperative single-pass kernel (cuda_kernels.cuh): one read of x.
//   *_three_pass      stats, merge, apply in one XLA call.
//   *_two_call        stats and merge, then apply, as two XLA calls (Half).
//   segment_split     the split forward (cuda_segment.cu): per-unit statistics and a merge into
//                     a coefficient table, then a flat apply from the table; *_two_call as two
//                     XLA calls.
//   *_flat            the column apply as a flat grid of 16-byte packs (4- and 8-byte types),
//                     else the tiled column apply.
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
// 4.5-6.7 us on the H200 (docs/perf/norm.md).
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

// What a training forward algorithm runs besides the single-pass kernels: its statistics
// (the split forward's, or stats and merge) and its apply (split, flat or tiled).
struct Passes {
  bool split = false, flat = false;
};

template <typename D>
Status stats_half(const Fwd<D>& f, Passes ps, cudaStream_t st) {
  if (ps.split) return segment_split_stats(f, st);
  return run_steps(
      [&] { return path_of(f.s) == Path::kColumn ? column_stats(f, st) : segment_stats(f, st); },
      [&] { return merge_stats(f, st); });
}

template <typename D>
Status apply_half(const Fwd<D>& f, Passes ps, cudaStream_t st) {
  if (ps.split) return segment_split_apply(f, st);
  if (ps.flat) return column_flat_apply(f, st);
  return path_of(f.s) == Path::kColumn ? column_apply(f, st) : segment_apply(f, st);
}

template <typename D>
Fwd<D> fwd_view(const Problem& p, const FwdBuffers& b, bool training) {
  using Acc = A<D>;
  auto* ws = static_cast<double*>(b.ws);
  return {p.s, p.centered, training, Acc(p.eps), static_cast<const D*>(b.x),
          static_cast<const Acc*>(b.scale), static_cast<const Acc*>(b.bias),
          static_cast<D*>(b.y), static_cast<Acc*>(b.mean), static_cast<Acc*>(b.var),
          ws, ws ? ws + fwd_partials(p.s) : nullptr,
          ws ? reinterpret_cast<Acc*>(ws + 2 * fwd_partials(p.s)) : nullptr,
          static_cast<const D*>(b.residual), p.epi.relu};
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
                 (row || !ws) ? nullptr : ws + 2 * plane, p.epi.relu,
                 static_cast<const Acc*>(b.bias), static_cast<const D*>(b.residual),
                 static_cast<D*>(b.dresidual)};
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

// Support of a kernel's dtype-dependent check (check(D{}, shape)), on `path`. An empty problem
// runs no kernel.
template <typename Check>
Support on_path_typed(const Problem& p, Path path, Check&& check) {
  if (Support s = on_path(p, path); !s.ok || p.s.elems() == 0) return s;
  Support out = Support::No(std::string("unsupported dtype ") + dtype_name(p.dtype));
  dispatch_io(p.dtype, p.dtype,
              [&](auto tag, auto) { out = check(device_t<decltype(tag)>{}, p.s); });
  return out;
}

Support row_path(const Problem& p) { return on_path(p, Path::kRow); }
Support column_path(const Problem& p) { return on_path(p, Path::kColumn); }
Support segment_path(const Problem& p) { return on_path(p, Path::kSegment); }
Support column_flat(const Problem& p) {
  return on_path_typed(p, Path::kColumn,
                       [](auto d, const Shape& s) { return column_flat_support<decltype(d)>(s); });
}
Support column_single_pass(const Problem& p) {
  return on_path_typed(p, Path::kColumn,
                       [](auto d, const Shape& s) { return column_fused_support<decltype(d)>(s); });
}
Support segment_single_pass(const Problem& p) {
  return on_path_typed(p, Path::kSegment, [](auto d, const Shape& s) {
    return segment_fused_support<decltype(d)>(s);
  });
}
Support segment_split(const Problem& p) {
  return on_path_typed(p, Path::kSegment, [](auto d, const Shape& s) {
    return segment_split_support<decltype(d)>(s);
  });
}

const Algorithm kRowTrain{"row", Pass::kTrain, row_path};
const Algorithm kColumnTwoCallFlat{"column_two_call_flat", Pass::kTrain, column_flat, true};
const Algorithm kColumnTwoCall{"column_two_call", Pass::kTrain, column_path, true};
const Algorithm kColumnSinglePass{"column_single_pass", Pass::kTrain, column_single_pass};
const Algorithm kColumnThreePassFlat{"column_three_pass_flat", Pass::kTrain, column_flat};
const Algorithm kColumnThreePass{"column_three_pass", Pass::kTrain, column_path};
const Algorithm kSegmentSplitTwoCall{"segment_split_two_call", Pass::kTrain, segment_split, true};
const Algorithm kSegmentSplit{"segment_split", Pass::kTrain, segment_split};
const Algorithm kSegmentSinglePass{"segment_single_pass", Pass::kTrain, segment_single_pass};
const Algorithm kSegmentTwoCall{"segment_two_call", Pass::kTrain, segment_path, true};
const Algorithm kSegmentThreePass{"segment_three_pass", Pass::kTrain, segment_path};
const Algorithm kRowInfer{"row", Pass::kInfer, row_path};
const Algorithm kColumnFlatInfer{"column_flat", Pass::kInfer, column_flat};
const Algorithm kColumnInfer{"column", Pass::kInfer, column_path};
const Algorithm kSegmentInfer{"segment", Pass::kInfer, segment_path};
const Algorithm kRowBwd{"row", Pass::kBwd, row_path};
const Algorithm kColumnBwd{"column", Pass::kBwd, column_path};
const Algorithm kSegmentBwd{"segment", Pass::kBwd, segment_path};

Passes passes_of(const Algorithm& a) {
  return {&a == &kSegmentSplitTwoCall || &a == &kSegmentSplit,
          &a == &kColumnTwoCallFlat || &a == &kColumnThreePassFlat || &a == &kColumnFlatInfer};
}

}  // namespace
}  // namespace cuda_impl

// The heuristic order, today's measured best first:
// - two calls, statistics then apply, where the segment path's split forward applies (segments
//   of at least kSplitMinSegment values) and on the column path for 4- and 8-byte values, so that
//   XLA schedules the statistics passes of independent ops apart from their writes (a read right
//   after a ~200 MB write pays for the L2's dirty lines): float32 batch_norm NHWC 0.92-0.94x XLA
//   as one call, 0.96 as two; float32 group_norm NHWC 32x56x56x256 84.4-84.6 us of GPU time as
//   two calls (the apply a flat grid) against 86.0 for the single-pass kernel. In 16-bit types
//   two calls were slower (batch and group norm, by 2-3%), so they take the single-pass kernel.
// - the flat column apply for 4- and 8-byte types, the tiled one for 16-bit types (whose 8
//   columns' per-pack coefficients cost more than they save). H200 figures: docs/perf/norm.md.
std::vector<const Algorithm*> cuda_algorithms(Pass pass, const Problem& p) {
  using namespace cuda_impl;
  switch (pass) {
    case Pass::kTrain: {
      const bool wide = dtype_bytes(p.dtype) >= 4;
      std::vector<const Algorithm*> column =
          wide ? std::vector<const Algorithm*>{&kColumnTwoCallFlat, &kColumnTwoCall,
                                               &kColumnSinglePass, &kColumnThreePassFlat,
                                               &kColumnThreePass}
               : std::vector<const Algorithm*>{&kColumnSinglePass, &kColumnThreePass,
                                               &kColumnTwoCall, &kColumnThreePassFlat,
                                               &kColumnTwoCallFlat};
      std::vector<const Algorithm*> segment =
          segment_split_shape(p.s)
              ? std::vector<const Algorithm*>{&kSegmentSplitTwoCall, &kSegmentTwoCall,
                                              &kSegmentSplit, &kSegmentSinglePass,
                                              &kSegmentThreePass}
              : std::vector<const Algorithm*>{&kSegmentSinglePass, &kSegmentThreePass,
                                              &kSegmentTwoCall, &kSegmentSplit,
                                              &kSegmentSplitTwoCall};
      std::vector<const Algorithm*> all{&kRowTrain};
      all.insert(all.end(), column.begin(), column.end());
      all.insert(all.end(), segment.begin(), segment.end());
      return all;
    }
    case Pass::kInfer:
      return {&kRowInfer, &kColumnFlatInfer, &kColumnInfer, &kSegmentInfer};
    case Pass::kBwd:
      return {&kRowBwd, &kColumnBwd, &kSegmentBwd};
  }
  return {};
}

Status cuda_forward(const Algorithm& algo, const Problem& p, const FwdBuffers& b, Half half,
                    cudaStream_t stream) {
  using namespace cuda_impl;
  return with_dtype(p, "forward", [&](auto tag) -> Status {
    using D = decltype(tag);
    using Acc = A<D>;
    const Fwd<D> f = fwd_view<D>(p, b, /*training=*/true);
    if (p.s.elems() == 0) {  // empty groups: NaN statistics (0xFF bytes are NaN)
      if (half == Half::kApply) return Status::Ok();
      return run_steps(
          [&] { return memset_bytes(f.mean, 0xFF, p.s.groups() * sizeof(Acc), stream); },
          [&] { return memset_bytes(f.var, 0xFF, p.s.groups() * sizeof(Acc), stream); });
    }
    if (&algo == &kRowTrain) return row_forward(f, stream);
    if (&algo == &kColumnSinglePass) return column_fused(f, stream);
    if (&algo == &kSegmentSinglePass) return segment_fused(f, stream);
    const Passes ps = passes_of(algo);
    if (half == Half::kStats) return stats_half(f, ps, stream);
    if (half == Half::kApply) return apply_half(f, ps, stream);
    return run_steps([&] { return stats_half(f, ps, stream); },
                     [&] { return apply_half(f, ps, stream); });
  });
}

Status cuda_inference(const Algorithm& algo, const Problem& p, const FwdBuffers& b,
                      cudaStream_t stream) {
  using namespace cuda_impl;
  return with_dtype(p, "inference", [&](auto tag) -> Status {
    using D = decltype(tag);
    const Fwd<D> f = fwd_view<D>(p, b, /*training=*/false);
    if (p.s.elems() == 0) return Status::Ok();
    if (&algo == &kRowInfer) return row_forward(f, stream);
    return apply_half(f, passes_of(algo), stream);
  });
}

Status cuda_backward(const Algorithm&, const Problem& p, const BwdBuffers& b,
                     cudaStream_t stream) {
  return cuda_impl::with_dtype(
      p, "backward", [&](auto tag) { return cuda_impl::backward<decltype(tag)>(p, b, stream); });
}

}  // namespace jaxdnn::norm
