// implicit_precomp_gemm: implicit_gemm whose activation gather reads precomputed offsets.
// A first kernel writes, for every (GEMM row, filter tap), the element offset of the pixel it
// reads in the gathered tensor (or -1 on padding) into the workspace; the GEMM's A loader then
// replaces the per-chunk coordinate arithmetic (three index maps with bounds, divisions when
// strided or dilated) by one cached 4-byte load. fwd and bwd_data (bwd_filter gathers along
// the reduction, where a table would be as large as the activations).
// Workspace = M * T*R*S * 4 bytes (M = the GEMM's rows: output pixels for fwd, input pixels for
// bwd_data).

#include "cc/conv/cuda_gemm_conv.cuh"

namespace jaxdnn::conv {
namespace {

using namespace gemm;

template <Direction kDir>
__global__ void offsets_kernel(Geo geo, int* __restrict__ table, int64_t M, int channels) {
  const int taps = geo.taps();
  const int64_t total = M * taps;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pix = gathered_pixel<kDir>(geo, e / taps, int(e % taps));
    table[e] = pix < 0 ? -1 : int(pix * channels);
  }
}

Support supports(const Args& a) {
  if (a.dir == Direction::kBwdFilter)
    return Support::No("bwd_filter gathers along the reduction: use implicit_gemm");
  Support s = gemm_dtype_support(a);
  if (!s.ok) return s;
  return channel_support(a);
}

int64_t workspace_bytes(const Args& a) {
  return shape_of(a).M * a.p.filt_spatial() * int64_t(sizeof(int));
}

template <Mode kMode>
Status run_mode(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  using T = typename ModeTraits<kMode>::T;
  const Geo geo = make_geo(a.p);
  const Shape s = shape_of(a);
  const bool fwd = a.dir == Direction::kFwd;
  int* table = static_cast<int*>(ws);
  constexpr int kThreads = 256;
  const unsigned blocks = cuda::grid_for(s.M * a.p.filt_spatial(), kThreads);
  if (fwd)
    offsets_kernel<Direction::kFwd><<<blocks, kThreads, 0, stream>>>(geo, table, s.M, geo.C);
  else
    offsets_kernel<Direction::kBwdData><<<blocks, kThreads, 0, stream>>>(geo, table, s.M, geo.K);
  if (Status st = cuda::check_launch("conv implicit_precomp_gemm offsets_kernel"); !st.ok())
    return st;
  const T* act = static_cast<const T*>(fwd ? b.x : b.y);
  const T* w = static_cast<const T*>(b.w);
  return with_tile<T>(s.N, [&](auto tile) -> Status {
    using C = decltype(tile);
    using AL = TableRows<T, C::BM, C::kThreads>;
    const typename AL::Params ap{act, table, geo, int(s.M), fwd ? geo.Cg : geo.Kg};
    if (fwd) {
      using BL = PlainMn<T, C::BN, C::kThreads>;
      const typename BL::Params bp{w, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
      return launch<kMode, C, AL, BL>(a, ap, bp, b.result, Reduce::kNone, nullptr, stream,
                                      "conv implicit_precomp_gemm fwd gemm_kernel");
    }
    using BL = WeightRows<T, C::BN, C::kThreads>;
    const typename BL::Params bp{w, geo};
    return launch<kMode, C, AL, BL>(a, ap, bp, b.result, Reduce::kNone, nullptr, stream,
                                    "conv implicit_precomp_gemm bwd_data gemm_kernel");
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
