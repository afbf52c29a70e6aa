// implicit_gemm: convolution as a tensor-core GEMM whose operands are gathered from the conv
// tensors on the fly (no im2col matrix, no workspace); cuda_gemm_core.cuh has the GEMM and
// cuda_gemm_operands.cuh the gathers. Three registry entries share it:
//   implicit_gemm               one CTA per output tile, result written directly;
//   implicit_gemm_splitk        the reduction cut into splits, partial sums in the workspace
//                               added in a fixed order (deterministic);
//   implicit_gemm_splitk_atomic the same, partial sums added with float atomics (faster
//                               reduction, order-dependent rounding: not deterministic).
// Split-K pays where the output has too few tiles to fill 132 SMs: bwd_filter (C is the
// filter, the reduction runs over N*P*Q) and the 7x7 / 14x14 layers.

#include "cc/conv/cuda_gemm_conv.cuh"

namespace jaxdnn::conv {
namespace {

using namespace gemm;

Support supports_with(const Args& a, Reduce r) {
  Support s = gemm_dtype_support(a);
  if (!s.ok) return s;
  if (!(s = channel_support(a)).ok) return s;
  return split_support(a, r);
}

template <Mode kMode>
Status run_mode(const Args& a, const Buffers& b, Reduce r, void* ws, cudaStream_t stream) {
  using T = typename ModeTraits<kMode>::T;
  const Geo geo = make_geo(a.p);
  const Shape s = shape_of(a);
  const T* x = static_cast<const T*>(b.x);
  const T* w = static_cast<const T*>(b.w);
  const T* y = static_cast<const T*>(b.y);
  return with_tile<T>(s.N, [&](auto tile) -> Status {
    using C = decltype(tile);
    switch (a.dir) {
      case Direction::kFwd: {
        using AL = ActRows<T, Direction::kFwd, C::BM, C::kThreads>;
        using BL = PlainMn<T, C::BN, C::kThreads>;
        const typename AL::Params ap{x, geo, int(s.M)};
        const typename BL::Params bp{w, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
        return launch<kMode, C, AL, BL>(a, ap, bp, b.result, r, ws, stream,
                                        "conv implicit_gemm fwd gemm_kernel");
      }
      case Direction::kBwdData: {
        using AL = ActRows<T, Direction::kBwdData, C::BM, C::kThreads>;
        using BL = WeightRows<T, C::BN, C::kThreads>;
        const typename AL::Params ap{y, geo, int(s.M)};
        const typename BL::Params bp{w, geo};
        return launch<kMode, C, AL, BL>(a, ap, bp, b.result, r, ws, stream,
                                        "conv implicit_gemm bwd_data gemm_kernel");
      }
      case Direction::kBwdFilter: {
        using AL = ActCols<T, C::BM, C::kThreads>;
        using BL = PlainMn<T, C::BN, C::kThreads>;
        const typename AL::Params ap{x, geo, int(s.M), int(s.Kd)};
        const typename BL::Params bp{y, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
        return launch<kMode, C, AL, BL>(a, ap, bp, b.result, r, ws, stream,
                                        "conv implicit_gemm bwd_filter gemm_kernel");
      }
    }
    return Status::Error("conv implicit_gemm: bad direction");
  });
}

template <Reduce kReduce>
struct Variant {
  static Support supports(const Args& a) { return supports_with(a, kReduce); }
  static int64_t workspace(const Args& a) { return reduce_workspace(a, kReduce); }
  static Status run(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
    return with_mode(a, [&](auto mode) {
      return run_mode<decltype(mode)::kMode>(a, b, kReduce, ws, stream);
    });
  }
};

}  // namespace

const CudaAlgorithm kCudaImplicitGemm = {
    "implicit_gemm", /*deterministic=*/true, /*tensor_cores=*/true,
    Variant<Reduce::kNone>::supports, Variant<Reduce::kNone>::workspace,
    Variant<Reduce::kNone>::run};
const CudaAlgorithm kCudaImplicitGemmSplitK = {
    "implicit_gemm_splitk", /*deterministic=*/true, /*tensor_cores=*/true,
    Variant<Reduce::kOrdered>::supports, Variant<Reduce::kOrdered>::workspace,
    Variant<Reduce::kOrdered>::run};
const CudaAlgorithm kCudaImplicitGemmSplitKAtomic = {
    "implicit_gemm_splitk_atomic", /*deterministic=*/false, /*tensor_cores=*/true,
    Variant<Reduce::kAtomic>::supports, Variant<Reduce::kAtomic>::workspace,
    Variant<Reduce::kAtomic>::run};

}  // namespace jaxdnn::conv
