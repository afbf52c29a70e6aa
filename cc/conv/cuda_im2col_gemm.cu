// im2col_gemm: explicit im2col into the workspace, then the tensor-core GEMM core
// (cuda_gemm_core.cuh) on plain matrices. It trades workspace and one extra pass over the
// patches for the simplest possible GEMM operand (contiguous rows, no gathers), and handles
// channel counts the implicit form cannot chunk (e.g. the 3-channel stem of image models):
// the patch matrix's rows are padded to whole 16-byte chunks with zeros.
//
//   direction   patch matrix (per group)                      GEMM
//   fwd         [N*Z*P*Q][T*R*S*Cg] patches of x               patches  x  w
//   bwd_data    [N*D*H*W][T*R*S*Kg] patches of dy (gathered)   patches  x  w^T
//   bwd_filter  [N*Z*P*Q][T*R*S*Cg] patches of x               patches^T x dy
// Workspace = G * rows * round_up(cols, 16 bytes) * sizeof(T) (rounded up to 256 bytes), plus
// bwd_filter's split-K partials; e.g. fwd with N=32, 224x224x3, 7x7, stride 1, SAME, float32:
// 32*224*224 rows * 148 cols * 4 B = 950,534,144 bytes.

#include "cc/conv/cuda_gemm_conv.cuh"

namespace jaxdnn::conv {
namespace {

using namespace gemm;

struct Patches {
  int64_t rows, cols, ld;  // ld = cols rounded up to whole chunks
};

Patches patches_of(const Args& a) {
  const Problem& p = a.p;
  const bool from_dy = a.dir == Direction::kBwdData;
  const int64_t rows = from_dy ? p.N * p.in_spatial() : p.N * p.out_spatial();
  const int64_t cols = p.filt_spatial() * (from_dy ? p.Kg() : p.Cg());
  const int64_t epc = kChunk / elem_bytes(a.in);
  return {rows, cols, (cols + epc - 1) / epc * epc};
}

// ws[g][row][col] = the gathered tensor at (row's pixel through tap col / cch, channel
// g*cch + col % cch), 0 on padding and in the pad columns.
template <typename T, Direction kDir>
__global__ void im2col_kernel(Geo geo, const T* __restrict__ src, T* __restrict__ ws,
                              int64_t G, Patches pm) {
  constexpr bool kFromDy = kDir == Direction::kBwdData;
  const int cch = kFromDy ? geo.Kg : geo.Cg, channels = kFromDy ? geo.K : geo.C;
  const int64_t total = G * pm.rows * pm.ld;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = e % pm.ld, row = e / pm.ld % pm.rows, g = e / (pm.ld * pm.rows);
    T v = cuda::from_acc<T>(0.f);
    if (col < pm.cols) {
      const int tap = int(col / cch), c = int(col % cch);
      const int64_t pix = gathered_pixel<kDir>(geo, row, tap);
      if (pix >= 0) v = src[pix * channels + g * cch + c];
    }
    ws[e] = v;
  }
}

Support supports(const Args& a) {
  Support s = gemm_dtype_support(a);
  if (!s.ok) return s;
  const Problem& p = a.p;
  // The GEMM's N side (w or dy columns, and the result) is still chunked: Kg (fwd, bwd_filter)
  // or Cg (bwd_data, whose w^T rows are read in (tap, k) chunks, so Kg too).
  if (p.Kg() % 8 != 0 || (a.dir == Direction::kBwdData && p.Cg() % 8 != 0))
    return Support::No("output channels per group (Kg=" + std::to_string(p.Kg()) + ")" +
                       (a.dir == Direction::kBwdData ? " and Cg" : "") +
                       " must be multiples of 8");
  const Patches pm = patches_of(a);
  if (pm.rows * pm.ld >= (int64_t(1) << 31))
    return Support::No("the patch matrix would have 2^31 or more elements");
  return Support::Yes();
}

// bwd_filter splits its reduction (filter_split; the 3-channel stem has 2 output tiles for
// 64*112*112 pixels); the partials follow the patch matrix.
int64_t patch_bytes(const Args& a) {
  const Patches pm = patches_of(a);
  return align256(a.p.G * pm.rows * pm.ld * elem_bytes(a.in));
}

int64_t workspace_bytes(const Args& a) {
  return patch_bytes(a) + reduce_workspace(a, filter_split(a));
}

template <Mode kMode>
Status run_mode(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  using T = typename ModeTraits<kMode>::T;
  const Geo geo = make_geo(a.p);
  const Shape s = shape_of(a);
  const Patches pm = patches_of(a);
  T* patches = static_cast<T*>(ws);
  const int64_t total = a.p.G * pm.rows * pm.ld;
  constexpr int kThreads = 256;
  const unsigned blocks = cuda::grid_for(total, kThreads);
  const T* x = static_cast<const T*>(b.x);
  const T* w = static_cast<const T*>(b.w);
  const T* y = static_cast<const T*>(b.y);
  if (a.dir == Direction::kBwdData)
    im2col_kernel<T, Direction::kBwdData><<<blocks, kThreads, 0, stream>>>(geo, y, patches, a.p.G, pm);
  else
    im2col_kernel<T, Direction::kFwd><<<blocks, kThreads, 0, stream>>>(geo, x, patches, a.p.G, pm);
  if (Status st = cuda::check_launch("conv im2col_gemm im2col_kernel"); !st.ok()) return st;

  const MatrixParams<T> pmat{patches, pm.ld, int(pm.rows), int(pm.ld), pm.rows * pm.ld};
  return with_tile<T>(s.N, [&](auto tile) -> Status {
    using C = decltype(tile);
    switch (a.dir) {
      case Direction::kFwd: {
        using AL = PlainK<T, C::BM, C::kThreads>;
        using BL = PlainMn<T, C::BN, C::kThreads>;
        const typename BL::Params bp{w, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
        return launch<kMode, C, AL, BL>(a, pmat, bp, b.result, Reduce::kNone, nullptr, stream,
                                        "conv im2col_gemm fwd gemm_kernel", pm.ld);
      }
      case Direction::kBwdData: {
        using AL = PlainK<T, C::BM, C::kThreads>;
        using BL = WeightRows<T, C::BN, C::kThreads>;
        const typename BL::Params bp{w, geo};
        return launch<kMode, C, AL, BL>(a, pmat, bp, b.result, Reduce::kNone, nullptr, stream,
                                        "conv im2col_gemm bwd_data gemm_kernel", pm.ld);
      }
      case Direction::kBwdFilter: {
        // A = patches^T: mn-major over the patch matrix, whose rows are the reduction.
        using AL = PlainMn<T, C::BM, C::kThreads>;
        using BL = PlainMn<T, C::BN, C::kThreads>;
        const MatrixParams<T> at{patches, pm.ld, int(pm.rows), int(pm.cols), pm.rows * pm.ld};
        const typename BL::Params bp{y, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
        return launch<kMode, C, AL, BL>(a, at, bp, b.result, filter_split(a),
                                        static_cast<char*>(ws) + patch_bytes(a), stream,
                                        "conv im2col_gemm bwd_filter gemm_kernel", s.Kd);
      }
    }
    return Status::Error("conv im2col_gemm: bad direction");
  });
}

Status run(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  return with_mode(a, [&](auto mode) { return run_mode<decltype(mode)::kMode>(a, b, ws, stream); });
}

}  // namespace

const CudaAlgorithm kCudaIm2colGemm = {"im2col_gemm", /*deterministic=*/true,
                                       /*tensor_cores=*/true, supports, workspace_bytes, run};

}  // namespace jaxdnn::conv
