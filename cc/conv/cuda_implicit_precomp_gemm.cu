// implicit_precomp_gemm: implicit_gemm whose activation gather reads precomputed offsets.
// A first kernel writes, for every (pixel, filter tap), the element offset of the pixel it
// reads in the gathered tensor (or -1 on padding) into the workspace; the GEMM's A loader then
// replaces the per-chunk coordinate arithmetic (three index maps with bounds, divisions when
// strided or dilated, carries of the incremental cursors) by one cached 4-byte load. Those
// integer instructions compete with the mmas for issue slots: the table is worth 10-35% on
// the 3x3 layers (benchmarks/NOTES.md).
//   fwd, bwd_filter  table[output pixel][tap] = offset of the x pixel it reads (or -1)
//   bwd_data         table[input pixel][tap]  = offset of the dy pixel it reads (or -1)
// bwd_filter reduces over all output pixels into a small filter-sized result, so it always
// runs split-K with an ordered reduction of the partial sums (deterministic) when that
// gives more than one split. With TF32, fwd reads w through its transpose (Hopper's wgmma
// takes 32-bit operands k-major only), written into the workspace by a first kernel.
// Workspace = pixels * T*R*S * 4 bytes (rounded up to 256) + the split-K partials + (TF32 fwd)
// the transposed w, each rounded up to 256 bytes.
// On Hopper, where im2col_tma_applies, the activation operand comes instead through TMA's
// im2col mode (TmaIm2col, TmaIm2colCols): one copy per slice and 64-row block, no table (its
// workspace stays reserved); 1.1-1.4x over the table gathers (benchmarks/NOTES.md, session 9).
// Strided bwd_data (no lhs dilation) runs as residue classes (strided_classes.h): per class
// this algorithm's stride-1 forward on dy and the class's sub-filter. On wgmma its epilogue
// stores the class's rows straight into dx (Args::rows); elsewhere into a dense buffer, then
// one scatter into dx. On a 3x3 stride-2 layer that is 9/4 instead of 9 taps of GEMM work per
// input position. Workspace: the sub-filters (w's size), the class results (dx's size) and the
// largest class's own workspace.

#include <algorithm>
#include <type_traits>

#include "cc/conv/cuda_gemm_conv.cuh"
#include "cc/conv/strided_classes.h"

namespace jaxdnn::conv {
namespace {

using namespace gemm;

// table[m][tap] = element offset of the pixel that row m gathers through the tap (-1 on
// padding); one thread per row (for_each_tap).
template <Direction kDir>
__global__ void offsets_kernel(Geo geo, int* __restrict__ table, int64_t pixels, int channels) {
  const int taps = geo.taps();
  for (int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; m < pixels;
       m += int64_t(gridDim.x) * blockDim.x) {
    int* row = table + m * taps;
    for_each_tap<kDir>(geo, m, [&](int tap, int64_t pix) {
      row[tap] = pix < 0 ? -1 : int(pix * channels);
    });
  }
}

// Rows of the table: the pixels whose reads it records.
int64_t table_rows(const Args& a) {
  return a.dir == Direction::kBwdData ? a.p.N * a.p.in_spatial() : a.p.N * a.p.out_spatial();
}

int64_t table_bytes(const Args& a) {
  return align256(table_rows(a) * a.p.filt_spatial() * int64_t(sizeof(int)));
}

Support supports(const Args& a) {
  Support s = gemm_dtype_support(a);
  if (!s.ok) return s;
  return channel_support(a);
}

// TF32 fwd reads w k-major: per group the Kg x (taps * Cg) transpose of w, in the workspace
// after the table and the partials.
bool kmajor_weight(const Args& a) {
  return a.dir == Direction::kFwd && a.in == DType::kF32 && a.tf32;
}

int64_t weight_bytes(const Args& a) {
  return kmajor_weight(a) ? align256(a.p.w_elems() * elem_bytes(a.in)) : 0;
}

bool by_classes(const Args& a) {
  return a.dir == Direction::kBwdData && strided_classes_apply(a.p) &&
         a.p.w_elems() < (int64_t(1) << 30);
}

// The forward problem of one residue class (strided_classes.h).
Args class_args(const Args& a, const StridedClass& c) {
  Args q = a;
  q.dir = Direction::kFwd;
  q.p = c.sub;
  return q;
}

int64_t workspace_bytes(const Args& a);
int64_t partials_bytes(const Args& a);

// [sub-filters][class results][the largest class's workspace].
struct ClassWorkspace {
  int64_t filters, results, sub;
};

ClassWorkspace class_workspace(const Args& a) {
  int64_t sub = 0;
  for (int64_t ci = 0; ci < strided_class_count(a.p); ++ci) {
    const StridedClass c = strided_class(a.p, ci);
    if (!c.empty()) sub = std::max(sub, workspace_bytes(class_args(a, c)));
  }
  return {align256(a.p.w_elems() * elem_bytes(a.in)),
          align256(a.p.x_elems() * elem_bytes(a.out)), sub};
}

int64_t workspace_bytes(const Args& a) {
  if (by_classes(a)) {
    const ClassWorkspace w = class_workspace(a);
    return w.filters + w.results + w.sub;
  }
  return table_bytes(a) + partials_bytes(a) + weight_bytes(a);
}

// The wgmma kernel reads its mn-major B (w in fwd, dy in bwd_filter: Kg columns per group)
// through TMA boxes (unless the variant pins gather_b) whenever no box can reach into the next
// group's columns: one group, or whole tiles per group (several groups never take 128x256).
bool tma_b(const Args& a) {
  if (a.variant.tma_b == Pin::kOff) return false;
  const Shape s = shape_of(a);
  return a.p.G == 1 ||
         a.p.Kg() % tile_cols(tile_kind(a, s.N, a.dir != Direction::kBwdFilter, false)) == 0;
}

// Launches the GEMM with A loader AL and B = the row-major matrix `bm` (mn-major), through TMA
// when the tile is a wgmma one and tma_b allows it; kFusable as launch's.
template <Mode kMode, typename C, typename AL, bool kFusable = false>
Status launch_mn_b(const Args& a, const typename AL::Params& ap,
                   const MatrixParams<typename ModeTraits<kMode>::T>& bm, int64_t total_cols,
                   void* result, Reduce r, void* ws, cudaStream_t stream, const char* name,
                   int64_t splits = 0) {
  using T = typename ModeTraits<kMode>::T;
  if constexpr (C::kWgmma && sizeof(T) == 2) {
    if (tma_b(a)) {
      using BL = TmaMn<T, C::BN, C::kThreads>;
      typename BL::Params bp;
      if (Status st = encode_tma_2d(&bp.map, bm.ptr, uint64_t(bm.rows), uint64_t(total_cols),
                                    uint64_t(bm.ld), uint32_t(C::BK));
          !st.ok())
        return st;
      bp.group_cols = int(bm.group_stride);
      return launch<kMode, C, AL, BL, kFusable>(a, ap, bp, result, r, ws, stream, name, -1,
                                                splits);
    }
  }
  if constexpr (AL::kTma) {
    return Status::Error("conv implicit_precomp_gemm: a TMA A needs a TMA B");  // im2col_tma
  } else {
    using BL = PlainMn<T, C::BN, C::kThreads>;
    return launch<kMode, C, AL, BL, kFusable>(a, ap, bm, result, r, ws, stream, name, -1,
                                              splits);
  }
}

// Whether A comes through TMA's im2col mode (TmaIm2col; bwd_filter's x^T TmaIm2colCols)
// instead of the table: 16-bit, or TF32 outside bwd_filter, on Hopper with B through TMA
// (tma_b; bwd_data: one group, as TmaKRows), a 2-D (or 1-D) filter, no lhs dilation, channels
// per group (Kg in bwd_data) a multiple of the slice (64 16-bit, 32 TF32); fwd and bwd_filter
// with strides up to 8, bwd_data stride 1; window corners and filter offsets within the
// im2col mode's ranges for a 4-D tensor ([-128, 127] and [0, 255]); unless the variant pins
// the table.
struct Im2colView {
  int lower[2], out[2], stride[2], size[2];
  int64_t channels, rows;  // of the gathered tensor (x or dy); pixels per image
};

Im2colView im2col_view(const Args& a) {
  const Problem& p = a.p;
  Im2colView v;
  const bool bwd = a.dir == Direction::kBwdData;
  for (int i = 0; i < 2; ++i) {
    const int ax = i + 1;
    v.stride[i] = bwd ? 1 : int(p.stride[ax]);
    v.lower[i] = bwd ? int(p.pad_lo[ax] - p.rhs_dil[ax] * (p.filt[ax] - 1)) : int(-p.pad_lo[ax]);
    v.out[i] = int(bwd ? p.in[ax] : p.out[ax]);
    v.size[i] = int(bwd ? p.out[ax] : p.in[ax]);
  }
  v.channels = bwd ? p.K : p.C;
  v.rows = int64_t(v.out[0]) * v.out[1];
  return v;
}

bool im2col_tma_applies(const Args& a) {
  const Problem& p = a.p;
  // (bwd_filter reads x^T mn-major, which wgmma takes in 16 bits only.)
  if (a.variant.im2col == Pin::kOff || !wgmma_runs(a, a.dir != Direction::kBwdFilter) ||
      !tma_b(a))
    return false;
  // (A tensor map cannot have an empty dimension: empty problems keep the table path, which
  // launches nothing.)
  if (p.in[0] != 1 || p.filt[0] != 1 || p.x_elems() == 0 || p.y_elems() == 0 ||
      p.x_elems() >= (int64_t(1) << 31) || p.y_elems() >= (int64_t(1) << 31))
    return false;
  const bool bwd = a.dir == Direction::kBwdData;
  const Im2colView v = im2col_view(a);
  for (int i = 0; i < 2; ++i) {
    const int ax = i + 1;
    const int upper = v.lower[i] + (v.out[i] - 1) * v.stride[i] + 1 - v.size[i];
    if (p.lhs_dil[ax] != 1 || p.stride[ax] > (bwd ? 1 : 8) || v.lower[i] < -128 ||
        v.lower[i] > 127 || upper < -128 || upper > 127 ||
        p.rhs_dil[ax] * (p.filt[ax] - 1) > 255)
      return false;
  }
  const int64_t slice = kSliceBytes / elem_bytes(a.in);
  return bwd ? p.G == 1 && p.Kg() % slice == 0 : p.Cg() % slice == 0;
}

// wide_plan for an im2col GEMM. bwd_filter splits its own way (filter_split), and the strided
// classes' GEMMs store their rows straight into dx, which a split store cannot do.
WidePlan wide_plan_of(const Args& a) {
  return wide_plan(a, shape_of(a), k_slices(a),
                   a.dir != Direction::kBwdFilter && !a.rows.mapped());
}

// The reduction's ordered splits (1: none): bwd_filter's (filter_split), or wide_plan's.
int64_t result_splits(const Args& a) {
  if (a.dir == Direction::kBwdFilter)
    return filter_split(a) == Reduce::kOrdered ? split_plan(a).splits : 1;
  return a.p.G == 1 && im2col_tma_applies(a) ? wide_plan_of(a).splits : 1;
}

int64_t partials_bytes(const Args& a) {
  const int64_t n = result_splits(a);
  return n > 1 ? partial_bytes(a, n) : 0;
}

// The workspace after the table: the split-K partials, then the TF32 forward's k-major w
// (kmajor_weight).
char* partials_at(const Args& a, void* ws) { return static_cast<char*>(ws) + table_bytes(a); }

template <typename T>
T* weight_at(const Args& a, void* ws) {
  return reinterpret_cast<T*>(partials_at(a, ws) + partials_bytes(a));
}

// B of bwd_data (w^T, k-major) as TmaKRows' parameters: w as the (taps * Cg) x K matrix, one
// group.
template <typename T>
Status weight_rows_b(const Args& a, const void* w, int bn, TmaKRowsParams* bp) {
  bp->tap_rows = int(a.p.Cg());
  bp->tap_cols = int(a.p.Kg());
  bp->group_rows = 0;
  return bp->encode(static_cast<const T*>(w), a.p.filt_spatial() * a.p.C, a.p.K, bn);
}

// The im2col loaders' parameters: the map of x (dy in bwd_data) read `pixels` at a time.
template <typename T>
Status im2col_params(const Args& a, const Buffers& b, uint32_t pixels, Im2colParams* ap) {
  const Problem& p = a.p;
  const bool bwd = a.dir == Direction::kBwdData;
  const Im2colView v = im2col_view(a);
  if (Status st = encode_tma_im2col(&ap->map, static_cast<const T*>(bwd ? b.y : b.x), p.N,
                                    v.size[0], v.size[1], v.channels, v.lower, v.out, v.stride,
                                    pixels);
      !st.ok())
    return st;
  ap->Q = v.out[1];
  ap->PQ = int(v.rows);
  ap->stride_h = v.stride[0];
  ap->stride_w = v.stride[1];
  ap->lo_h = v.lower[0];
  ap->lo_w = v.lower[1];
  ap->dil_h = int(p.rhs_dil[1]);
  ap->dil_w = int(p.rhs_dil[2]);
  ap->R = int(p.filt[1]);
  ap->S = int(p.filt[2]);
  ap->cch = int(bwd ? p.Kg() : p.Cg());
  ap->flip = bwd;
  return Status::Ok();
}

template <Mode kMode>
Status run_im2col_tma(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  using T = typename ModeTraits<kMode>::T;
  if constexpr (kMode == Mode::k3xTf32) {
    return Status::Error("conv implicit_precomp_gemm: im2col TMA takes 16-bit or TF32 inputs");
  } else {
    const Problem& p = a.p;
    const Shape s = shape_of(a);
    const Direction dir = a.dir;
    constexpr bool kTf32 = kMode == Mode::kTf32;
    T* wt = weight_at<T>(a, ws);
    if (kTf32 && dir == Direction::kFwd) {  // w^T: group g's Kg x Kd block at row g * Kg
      if (Status st = transpose(static_cast<const T*>(b.w), wt, int(s.Kd), int(s.N), p.K,
                                int(p.G), stream);
          !st.ok())
        return st;
    }
    return with_tile<kMode, true>(a, s.N, dir != Direction::kBwdFilter, [&](auto tile) -> Status {
      using C = decltype(tile);
      if constexpr (!C::kWgmma) {
        return Status::Error("conv implicit_precomp_gemm: im2col TMA runs on wgmma only");
      } else {
        Im2colParams ap;
        if (dir == Direction::kBwdFilter) {
          if constexpr (!kTf32) {  // B = dy, mn-major (TmaMn)
            if (Status st = im2col_params<T>(a, b, uint32_t(C::BK), &ap); !st.ok()) return st;
            const MatrixParams<T> bp{static_cast<const T*>(b.y), p.K, int(s.Kd), int(s.N),
                                     p.Kg()};
            return launch_mn_b<kMode, C, TmaIm2colCols<T, C::BM, C::kThreads>>(
                a, ap, bp, p.K, b.result, filter_split(a), partials_at(a, ws), stream,
                "conv implicit_precomp_gemm bwd_filter gemm_kernel");
          }
          return Status::Error("conv implicit_precomp_gemm: bwd_filter im2col takes 16 bits");
        }
        if (Status st = im2col_params<T>(a, b, uint32_t(C::BM), &ap); !st.ok()) return st;
        using AL = TmaIm2col<T, C::BM, C::kThreads>;
        // wide_plan's splits, taken with the 256-column tile it planned them for.
        const int64_t splits = C::BN == 256 ? result_splits(a) : 1;
        const Reduce r = splits > 1 ? Reduce::kOrdered : Reduce::kNone;
        void* partials = splits > 1 ? partials_at(a, ws) : nullptr;
        const bool bwd = dir == Direction::kBwdData;
        const char* name = bwd ? "conv implicit_precomp_gemm bwd_data gemm_kernel"
                               : "conv implicit_precomp_gemm fwd gemm_kernel";
        if constexpr (!kTf32) {
          if (!bwd) {  // B = w, mn-major (TmaMn)
            const MatrixParams<T> bp{static_cast<const T*>(b.w), p.K, int(s.Kd), int(s.N),
                                     p.Kg()};
            return launch_mn_b<kMode, C, AL, true>(a, ap, bp, p.K, b.result, r, partials,
                                                   stream, name, splits);
          }
        }
        TmaKRowsParams bp;
        if (bwd) {
          if (Status st = weight_rows_b<T>(a, b.w, C::BN, &bp); !st.ok()) return st;
        } else {  // TF32: B = w^T, K x Kd
          bp.tap_rows = 0;
          bp.tap_cols = int(s.Kd);
          bp.group_rows = int(p.Kg());
          if (Status st = bp.encode(static_cast<const T*>(wt), p.K, s.Kd, C::BN); !st.ok())
            return st;
        }
        return launch<kMode, C, AL, TmaKRows<T, C::BN, C::kThreads>, true>(
            a, ap, bp, b.result, r, partials, stream, name, -1, splits);
      }
    }, p.G == 1 && wide_plan_of(a).wide);
  }
}

template <Mode kMode>
Status run_mode(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  using T = typename ModeTraits<kMode>::T;
  if (im2col_tma_applies(a)) return run_im2col_tma<kMode>(a, b, ws, stream);
  const Geo geo = make_geo(a.p);
  const Shape s = shape_of(a);
  const Direction dir = a.dir;
  int* table = static_cast<int*>(ws);
  void* partials = partials_at(a, ws);
  T* wt = weight_at<T>(a, ws);
  constexpr int kThreads = 256;
  const unsigned blocks = cuda::grid_for(table_rows(a), kThreads);
  if (dir == Direction::kBwdData)
    offsets_kernel<Direction::kBwdData><<<blocks, kThreads, 0, stream>>>(geo, table, table_rows(a),
                                                                         geo.K);
  else
    offsets_kernel<Direction::kFwd><<<blocks, kThreads, 0, stream>>>(geo, table, table_rows(a),
                                                                     geo.C);
  if (Status st = cuda::check_launch("conv implicit_precomp_gemm offsets_kernel"); !st.ok())
    return st;
  const T* x = static_cast<const T*>(b.x);
  const T* w = static_cast<const T*>(b.w);
  const T* y = static_cast<const T*>(b.y);
  constexpr bool kTf32 = kMode == Mode::kTf32;
  if (kTf32 && dir == Direction::kFwd) {  // w^T: group g's (Kd x Kg) block at column g * Kg
    if (Status st = transpose(w, wt, int(s.Kd), int(s.N), a.p.K, int(a.p.G), stream); !st.ok())
      return st;
  }
  // fwd (with w^T when TF32) and bwd_data read both operands k-major; bwd_filter reads x^T.
  return with_tile<kMode>(a, s.N, dir != Direction::kBwdFilter, [&](auto tile) -> Status {
    using C = decltype(tile);
    using Rows = TableRows<T, C::BM, C::kThreads>;
    switch (dir) {
      case Direction::kFwd: {
        const typename Rows::Params ap{x, table, geo, int(s.M), geo.Cg};
        // B = w (Kd x Kg per group, mn-major), or its k-major transpose w^T for TF32.
        if constexpr (kTf32) {
          using BL = PlainK<T, C::BN, C::kThreads>;
          const MatrixParams<T> bp{wt, s.Kd, int(s.N), int(s.Kd), s.N * s.Kd};
          return launch<kMode, C, Rows, BL, true>(a, ap, bp, b.result, Reduce::kNone, nullptr,
                                                  stream,
                                                  "conv implicit_precomp_gemm fwd gemm_kernel");
        } else {
          const MatrixParams<T> bp{w, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
          return launch_mn_b<kMode, C, Rows, true>(
              a, ap, bp, a.p.K, b.result, Reduce::kNone, nullptr, stream,
              "conv implicit_precomp_gemm fwd gemm_kernel");
        }
      }
      case Direction::kBwdData: {
        const typename Rows::Params ap{y, table, geo, int(s.M), geo.Kg};
        constexpr const char* name = "conv implicit_precomp_gemm bwd_data gemm_kernel";
        // B = w^T, k-major; through TMA boxes when a slice is one tap of one group.
        if constexpr (C::kWgmma) {
          if (tma_b(a) && a.p.G == 1 && geo.Kg % C::BK == 0) {
            TmaKRowsParams bp;
            if (Status st = weight_rows_b<T>(a, w, C::BN, &bp); !st.ok()) return st;
            return launch<kMode, C, Rows, TmaKRows<T, C::BN, C::kThreads>>(
                a, ap, bp, b.result, Reduce::kNone, nullptr, stream, name);
          }
        }
        using BL = WeightRows<T, C::BN, C::kThreads>;
        const typename BL::Params bp{w, geo};
        return launch<kMode, C, Rows, BL>(a, ap, bp, b.result, Reduce::kNone, nullptr, stream,
                                          name);
      }
      case Direction::kBwdFilter: {
        using AL = TableCols<T, C::BM, C::kThreads>;
        const typename AL::Params ap{x, table, geo.taps(), int(s.M), int(s.Kd), geo.Cg};
        const MatrixParams<T> bp{y, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
        return launch_mn_b<kMode, C, AL>(a, ap, bp, a.p.K, b.result, filter_split(a), partials,
                                         stream,
                                         "conv implicit_precomp_gemm bwd_filter gemm_kernel");
      }
    }
    return Status::Error("conv implicit_precomp_gemm: bad direction");
  });
}

Status run(const Args& a, const Buffers& b, void* ws, cudaStream_t stream);

// E: an unsigned type of the element's width (the two kernels below only move elements).
// Every class's sub-filter in one launch, into their concatenation; they partition w's
// elements, so 32-bit indices (by_classes: w below 2^30).
template <typename E>
__global__ void sub_filters_kernel(const E* __restrict__ w, E* __restrict__ sub, Problem p,
                                   SubFilters f) {
  const int32_t total = int32_t(f.start[f.count]);
  for (int32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
    int ci = 0;
    while (e >= f.start[ci + 1]) ++ci;  // empty classes start where the next one does
    sub[e] = w[sub_filter_source<int32_t>(p, f.axis[ci], e - int32_t(f.start[ci]))];
  }
}

// dx from the class results, one Vec of a pixel's channels per thread (16 bytes: this
// algorithm takes channel counts that are multiples of 8; I: the index type, see class_pixel).
template <typename E, typename Vec, typename I>
__global__ void scatter_classes_kernel(const E* __restrict__ results, E* __restrict__ dx,
                                       Problem p, ClassMap map) {
  constexpr int V = sizeof(Vec) / sizeof(E);
  const I per_pixel = I(p.C / V), total = I(p.x_elems() / V);
  for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < total;
       e += I(gridDim.x) * I(blockDim.x)) {
    const I pix = e / per_pixel;
    const ClassPixel cp = class_pixel<I>(p, map.sizes, pix);
    const int64_t base = map.base[cp.ci];  // elements; a multiple of V (C is)
    Vec v{};
    if (base >= 0)
      v = reinterpret_cast<const Vec*>(results + base)[cp.index * per_pixel + (e - pix * per_pixel)];
    reinterpret_cast<Vec*>(dx)[e] = v;
  }
}

template <typename E, typename Vec>
Status scatter_classes(const void* results, void* dx, const Problem& p, const ClassMap& map,
                       cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t total = p.x_elems() / (sizeof(Vec) / sizeof(E));
  const unsigned grid = cuda::grid_for(total, kThreads);
  const auto* r = static_cast<const E*>(results);
  auto* out = static_cast<E*>(dx);
  if (total + int64_t(grid) * kThreads < (int64_t(1) << 31))
    scatter_classes_kernel<E, Vec, int32_t><<<grid, kThreads, 0, stream>>>(r, out, p, map);
  else
    scatter_classes_kernel<E, Vec, int64_t><<<grid, kThreads, 0, stream>>>(r, out, p, map);
  return cuda::check_launch("conv implicit_precomp_gemm scatter_classes_kernel");
}

// Whether the classes' GEMMs store into dx themselves: they run on wgmma (Hopper, 16-bit or
// TF32; bwd_data's operands are k-major), whose epilogue takes mapped rows; unless the variant
// pins the scatter.
bool class_rows_direct(const Args& a) {
  return a.variant.class_rows != Pin::kOff && wgmma_runs(a, /*k_major=*/true);
}

// The GEMM call of class `ci` (`c`): its forward problem, storing its rows straight into dx
// when `direct`.
Args class_run_args(const Args& a, int64_t ci, const StridedClass& c, bool direct) {
  Args q = class_args(a, c);
  if (direct) {
    int64_t r[3];
    class_residues(a.p, ci, r);
    for (int ax = 0; ax < 3; ++ax) {
      q.rows.size[ax] = int32_t(c.axis[ax].size);
      q.rows.stride[ax] = int32_t(a.p.stride[ax]);
      q.rows.residue[ax] = int32_t(r[ax]);
      q.rows.dx[ax] = int32_t(a.p.in[ax]);
    }
  }
  return q;
}

// W, E: unsigned types of the input's and of the result's width.
template <typename W, typename E>
Status run_classes_typed(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  const Problem& p = a.p;
  const ClassWorkspace cw = class_workspace(a);
  char* filters = static_cast<char*>(ws);
  char* results = filters + cw.filters;
  void* sub_ws = results + cw.results;
  const int64_t eb = elem_bytes(a.in), ob = elem_bytes(a.out);
  constexpr int kThreads = 256;
  const int64_t classes = strided_class_count(p);
  SubFilters f;
  f.count = int(classes);
  f.start[0] = 0;
  bool any_empty = false;
  for (int64_t ci = 0; ci < classes; ++ci) {
    const StridedClass c = strided_class(p, ci);
    for (int ax = 0; ax < 3; ++ax)
      f.axis[ci][ax] = {int32_t(c.axis[ax].first), int32_t(c.axis[ax].step),
                        int32_t(c.axis[ax].taps)};
    f.start[ci + 1] = f.start[ci] + (c.empty() ? 0 : c.sub.w_elems());
    any_empty = any_empty || c.empty();
  }
  sub_filters_kernel<W><<<cuda::grid_for(f.start[classes], kThreads), kThreads, 0, stream>>>(
      static_cast<const W*>(b.w), reinterpret_cast<W*>(filters), p, f);
  if (Status st = cuda::check_launch("conv implicit_precomp_gemm sub_filters_kernel"); !st.ok())
    return st;
  // On wgmma each class's GEMM stores its rows straight into dx (ResultRows); elsewhere into
  // a dense buffer per class, then one scatter pass.
  // (An empty class's dx rows are zero: cleared first.)
  const bool direct = class_rows_direct(a);
  if (direct && any_empty &&
      cudaMemsetAsync(b.result, 0, p.x_elems() * ob, stream) != cudaSuccess)
    return cuda::check_launch("conv implicit_precomp_gemm dx memset");
  ClassMap map;
  int64_t y_at = 0;  // elements of the results so far
  for (int64_t ci = 0; ci < classes; ++ci) {
    const StridedClass c = strided_class(p, ci);
    for (int ax = 0; ax < 3; ++ax) map.sizes[ci][ax] = c.axis[ax].size;
    map.base[ci] = -1;
    if (c.empty()) continue;
    const Args q = class_run_args(a, ci, c, direct);
    Buffers bq;
    bq.x = b.y;
    bq.w = filters + f.start[ci] * eb;
    bq.result = direct ? b.result : results + y_at * ob;
    if (Status st = run(q, bq, sub_ws, stream); !st.ok()) return st;
    map.base[ci] = y_at;
    y_at += q.p.y_elems();
  }
  if (direct) return Status::Ok();
  return scatter_classes<E, uint4>(results, b.result, p, map, stream);
}

Status run(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  if (by_classes(a)) {  // 16-bit or float32 inputs (supports), a result of either width
    const bool in16 = elem_bytes(a.in) == 2, out16 = elem_bytes(a.out) == 2;
    if (in16) return out16 ? run_classes_typed<uint16_t, uint16_t>(a, b, ws, stream)
                           : run_classes_typed<uint16_t, uint32_t>(a, b, ws, stream);
    return run_classes_typed<uint32_t, uint32_t>(a, b, ws, stream);
  }
  return with_mode(a, [&](auto mode) { return run_mode<decltype(mode)::kMode>(a, b, ws, stream); });
}

// The options of the variant that runs `a` (variant.h): for the strided classes their store and
// the first non-empty class's GEMM (all share N = C and the mode), else the GEMM's core, its A
// loader (TMA im2col or the table), its B loader where run_mode chooses one, and its tile.
std::string resolve(const Args& a) {
  if (by_classes(a)) {
    const bool direct = class_rows_direct(a);
    const std::string store = direct ? ".class_rows" : ".scatter";
    for (int64_t ci = 0; ci < strided_class_count(a.p); ++ci) {
      const StridedClass c = strided_class(a.p, ci);
      if (!c.empty()) return store + resolve(class_run_args(a, ci, c, direct));
    }
    return store;
  }
  const int64_t n = shape_of(a).N;
  const bool k_major = a.dir != Direction::kBwdFilter;
  if (im2col_tma_applies(a))
    return tile_options(tile_kind(a, n, k_major, a.p.G == 1 && wide_plan_of(a).wide),
                        ".im2col_tma.tma_b");
  const TileKind t = tile_kind(a, n, k_major, false);
  if (!is_wgmma(t)) return tile_options(t);
  const bool b_choice = a.dir == Direction::kBwdData
                            ? a.p.G == 1 && a.p.Kg() % slice_elems(a) == 0
                            : elem_bytes(a.in) == 2;
  return tile_options(t, b_choice ? (tma_b(a) ? ".table.tma_b" : ".table.gather_b") : ".table");
}

}  // namespace

const CudaAlgorithm kCudaImplicitPrecompGemm = {
    "implicit_precomp_gemm", /*deterministic=*/true, /*tensor_cores=*/true, supports,
    workspace_bytes, run,
    "wgmma mma_sync im2col_tma table tma_b gather_b 128x64 128x128 128x256 ws no_ws class_rows "
    "scatter",
    resolve};

}  // namespace jaxdnn::conv
