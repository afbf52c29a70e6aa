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

#include <cstdlib>
#include <type_traits>

#include "cc/conv/cuda_gemm_conv.cuh"

namespace jaxdnn::conv {
namespace {

using namespace gemm;

template <Direction kDir>
__global__ void offsets_kernel(Geo geo, int* __restrict__ table, int64_t pixels, int channels) {
  const int taps = geo.taps();
  const int64_t total = pixels * taps;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pix = gathered_pixel<kDir>(geo, e / taps, int(e % taps));
    table[e] = pix < 0 ? -1 : int(pix * channels);
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

int64_t workspace_bytes(const Args& a) {
  return table_bytes(a) + reduce_workspace(a, filter_split(a)) + weight_bytes(a);
}

// The wgmma kernel reads its mn-major B (w in fwd, dy in bwd_filter: Kg columns per group)
// through TMA boxes, unless JAXDNN_CONV_NO_TMA=1 (benchmarks compare the two), whenever no box
// can reach into the next group's columns: one group, or whole tiles per group.
bool tma_b(const Args& a) {
  static const bool off = [] {
    const char* e = std::getenv("JAXDNN_CONV_NO_TMA");
    return e != nullptr && e[0] == '1';
  }();
  const int64_t kg = a.p.Kg();
  return !off && (a.p.G == 1 || kg % tile_n(kg) == 0);
}

// Launches the GEMM with A loader AL and B = the row-major matrix `bm` (mn-major), through TMA
// when the tile is a wgmma one and tma_b allows it.
template <Mode kMode, typename C, typename AL>
Status launch_mn_b(const Args& a, const typename AL::Params& ap,
                   const MatrixParams<typename ModeTraits<kMode>::T>& bm, int64_t total_cols,
                   void* result, Reduce r, void* ws, cudaStream_t stream, const char* name) {
  using T = typename ModeTraits<kMode>::T;
  if constexpr (C::kWgmma && sizeof(T) == 2) {
    if (tma_b(a)) {
      using BL = TmaMn<T, C::BN, C::kThreads>;
      typename BL::Params bp;
      if (Status st = encode_tma_2d(&bp.map, kMode == Mode::kF16, bm.ptr, uint64_t(bm.rows),
                                    uint64_t(total_cols), uint64_t(bm.ld), uint32_t(C::BK));
          !st.ok())
        return st;
      bp.group_cols = int(bm.group_stride);
      return launch<kMode, C, AL, BL>(a, ap, bp, result, r, ws, stream, name);
    }
  }
  return launch<kMode, C, AL, PlainMn<T, C::BN, C::kThreads>>(a, ap, bm, result, r, ws, stream,
                                                               name);
}

template <Mode kMode>
Status run_mode(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  using T = typename ModeTraits<kMode>::T;
  const Geo geo = make_geo(a.p);
  const Shape s = shape_of(a);
  const Direction dir = a.dir;
  int* table = static_cast<int*>(ws);
  void* partials = static_cast<char*>(ws) + table_bytes(a);
  T* wt = reinterpret_cast<T*>(static_cast<char*>(ws) + table_bytes(a) +
                               reduce_workspace(a, filter_split(a)));
  constexpr int kThreads = 256;
  const unsigned blocks = cuda::grid_for(table_rows(a) * a.p.filt_spatial(), kThreads);
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
  return with_tile<kMode>(s.N, dir != Direction::kBwdFilter, [&](auto tile) -> Status {
    using C = decltype(tile);
    using Rows = TableRows<T, C::BM, C::kThreads>;
    switch (dir) {
      case Direction::kFwd: {
        const typename Rows::Params ap{x, table, geo, int(s.M), geo.Cg};
        // B = w (Kd x Kg per group, mn-major), or its k-major transpose w^T for TF32.
        if constexpr (kTf32) {
          using BL = PlainK<T, C::BN, C::kThreads>;
          const MatrixParams<T> bp{wt, s.Kd, int(s.N), int(s.Kd), s.N * s.Kd};
          return launch<kMode, C, Rows, BL>(a, ap, bp, b.result, Reduce::kNone, nullptr, stream,
                                            "conv implicit_precomp_gemm fwd gemm_kernel");
        } else {
          const MatrixParams<T> bp{w, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
          return launch_mn_b<kMode, C, Rows>(a, ap, bp, a.p.K, b.result, Reduce::kNone, nullptr,
                                             stream, "conv implicit_precomp_gemm fwd gemm_kernel");
        }
      }
      case Direction::kBwdData: {
        using BL = WeightRows<T, C::BN, C::kThreads>;
        const typename Rows::Params ap{y, table, geo, int(s.M), geo.Kg};
        const typename BL::Params bp{w, geo};
        return launch<kMode, C, Rows, BL>(a, ap, bp, b.result, Reduce::kNone, nullptr, stream,
                                          "conv implicit_precomp_gemm bwd_data gemm_kernel");
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

Status run(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  return with_mode(a, [&](auto mode) { return run_mode<decltype(mode)::kMode>(a, b, ws, stream); });
}

}  // namespace

const CudaAlgorithm kCudaImplicitPrecompGemm = {"implicit_precomp_gemm", /*deterministic=*/true,
                                                /*tensor_cores=*/true, supports,
                                                workspace_bytes, run};

}  // namespace jaxdnn::conv
