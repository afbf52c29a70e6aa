// im2col_gemm: explicit im2col into the workspace, then the tensor-core GEMM core
// (cuda_gemm_core.cuh) on plain matrices. It trades workspace and one extra pass over the
// patches for the simplest possible GEMM operand (contiguous rows, no gathers), and handles
// channel counts the implicit forms cannot chunk (e.g. the 3-channel stem of image models):
// the patch matrix's rows are padded to whole 16-byte chunks with zeros.
//
//   direction   workspace matrix (per group)                   GEMM
//   fwd         [N*Z*P*Q][T*R*S*Cg] patches of x                patches  x  w
//   bwd_data    [N*Z*P*Q][T*R*S*Cg] float column gradients      dy  x  w^T, then col2im
//   bwd_filter  [N*Z*P*Q][T*R*S*Cg] patches of x                patches^T x dy
// bwd_data is the transpose of fwd's im2col: a dense GEMM gives each output pixel's gradient
// for every (tap, input channel) it read, and col2im adds, for each input pixel, the columns
// of the outputs that read it. Unlike the implicit forms it spends no multiply on taps that a
// stride skips, and its GEMM's N side is T*R*S*Cg (padded to 8), so any Cg works.
// Workspace = G * rows * round_up(cols, 16 bytes) * sizeof(T) (float for bwd_data), rounded up
// to 256 bytes, plus bwd_filter's split-K partials; e.g. fwd with N=32, 224x224x3, 7x7,
// stride 1, SAME, float32: 32*224*224 rows * 148 cols * 4 B = 950,534,144 bytes.

#include "cc/conv/cuda_gemm_conv.cuh"

namespace jaxdnn::conv {
namespace {

using namespace gemm;

struct Patches {
  int64_t rows, cols, ld;  // ld = cols rounded up to whole chunks
};

// Element bytes of the workspace matrix: the input dtype, float for bwd_data's gradients.
int patch_elem_bytes(const Args& a) {
  return a.dir == Direction::kBwdData ? int(sizeof(float)) : elem_bytes(a.in);
}

Patches patches_of(const Args& a) {
  const Problem& p = a.p;
  const int64_t rows = p.N * p.out_spatial(), cols = p.filt_spatial() * p.Cg();
  // bwd_data: its columns are the GEMM's N, which the epilogue stores in 8-element pairs/rows.
  const int64_t epc = a.dir == Direction::kBwdData ? 8 : kChunk / elem_bytes(a.in);
  return {rows, cols, (cols + epc - 1) / epc * epc};
}

// ws[g][row][col] = x at (output pixel row through tap col / Cg, channel g*Cg + col % Cg), 0
// on padding and in the pad columns.
template <typename T>
__global__ void im2col_kernel(Geo geo, const T* __restrict__ src, T* __restrict__ ws,
                              int64_t G, Patches pm) {
  const int cch = geo.Cg, channels = geo.C;
  const int64_t total = G * pm.rows * pm.ld;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = e % pm.ld, row = e / pm.ld % pm.rows, g = e / (pm.ld * pm.rows);
    T v = cuda::from_acc<T>(0.f);
    if (col < pm.cols) {
      const int tap = int(col / cch), c = int(col % cch);
      const int64_t pix = gathered_pixel<Direction::kFwd>(geo, row, tap);
      if (pix >= 0) v = src[pix * channels + g * cch + c];
    }
    ws[e] = v;
  }
}

// dx[m, g*Cg + c] = sum over taps of cols[pixel of dy that input pixel m reaches through the
// tap][g*ld + tap*Cg + c] (col2im, accumulated in float). One thread per run of up to kRun
// channels of one group of one input pixel, walking its taps with for_each_tap (one thread
// per element with gathered_pixel per tap had made this kernel most of the 3-channel stem's
// 4.2 ms bwd_data).
constexpr int kRun = 8;

template <typename Out>
__global__ void col2im_kernel(Geo geo, const float* __restrict__ cols, Out* __restrict__ dx,
                              int64_t pixels, Patches pm) {
  const int groups = geo.C / geo.Cg, runs = (geo.Cg + kRun - 1) / kRun;
  const int64_t total = pixels * groups * runs;
  const int64_t row = int64_t(groups) * pm.ld;  // all groups' columns of one dy pixel
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = e / (groups * runs);
    const int gr = int(e - m * (groups * runs)), g = gr / runs, c0 = gr % runs * kRun;
    const int n_c = min(kRun, geo.Cg - c0);
    const float* base = cols + int64_t(g) * pm.ld + c0;
    float acc[kRun] = {};
    for_each_tap<Direction::kBwdData>(geo, m, [&](int tap, int64_t pix) {
      if (pix < 0) return;
      const float* src = base + pix * row + int64_t(tap) * geo.Cg;
#pragma unroll
      for (int i = 0; i < kRun; ++i)
        if (i < n_c) acc[i] += src[i];
    });
    Out* out = dx + m * geo.C + int64_t(g) * geo.Cg + c0;
#pragma unroll
    for (int i = 0; i < kRun; ++i)
      if (i < n_c) out[i] = cuda::from_acc<Out>(acc[i]);
  }
}

Support supports(const Args& a) {
  Support s = gemm_dtype_support(a);
  if (!s.ok) return s;
  const Problem& p = a.p;
  // The GEMM's N side is chunked: Kg for fwd and bwd_filter (w's and dy's columns); bwd_data
  // reduces over Kg (dy's and w's rows are read in 16-byte chunks of k).
  if (p.Kg() % 8 != 0)
    return Support::No("output channels per group (Kg=" + std::to_string(p.Kg()) +
                       ") must be a multiple of 8");
  const Patches pm = patches_of(a);
  if (p.G * pm.rows * pm.ld >= (int64_t(1) << 31))
    return Support::No("the patch matrix would have 2^31 or more elements");
  return Support::Yes();
}

// bwd_filter splits its reduction (filter_split; the 3-channel stem has 2 output tiles for
// 64*112*112 pixels); the partials follow the patch matrix.
int64_t patch_bytes(const Args& a) {
  const Patches pm = patches_of(a);
  return align256(a.p.G * pm.rows * pm.ld * patch_elem_bytes(a));
}

int64_t workspace_bytes(const Args& a) {
  return patch_bytes(a) + reduce_workspace(a, filter_split(a));
}

// bwd_data: cols = dy x w^T as the GEMM of a 1x1 forward conv over dy's pixels (C = K, Kg
// inputs per group; G * ld outputs, float), then col2im into dx.
Args bwd_data_gemm(const Args& a) {
  const Problem& p = a.p;
  Args q = a;
  q.dir = Direction::kFwd;
  q.out = DType::kF32;
  q.p = Problem{};
  q.p.N = p.N;
  q.p.C = p.K;
  q.p.K = p.G * patches_of(a).ld;
  q.p.G = p.G;
  for (int d = 0; d < 3; ++d) q.p.in[d] = q.p.out[d] = p.out[d];
  return q;
}

template <Mode kMode>
Status run_bwd_data(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  using T = typename ModeTraits<kMode>::T;
  const Problem& p = a.p;
  const Patches pm = patches_of(a);
  const Args q = bwd_data_gemm(a);
  const Shape s = shape_of(q);
  float* cols = static_cast<float*>(ws);
  const MatrixParams<T> dy{static_cast<const T*>(b.y), p.K, int(s.M), int(s.Kd), p.Kg()};
  const MatrixParams<T> w{static_cast<const T*>(b.w), p.K, int(pm.cols), int(s.Kd), p.Kg()};
  Status st = with_tile<kMode>(q, s.N, /*k_major=*/true, [&](auto tile) -> Status {
    using C = decltype(tile);
    return launch<kMode, C, PlainK<T, C::BM, C::kThreads>, PlainK<T, C::BN, C::kThreads>>(
        q, dy, w, cols, Reduce::kNone, nullptr, stream, "conv im2col_gemm bwd_data gemm_kernel");
  });
  if (!st.ok()) return st;
  const Geo geo = make_geo(p);
  const int64_t pixels = p.N * p.in_spatial();
  constexpr int kThreads = 256;
  const unsigned blocks =
      cuda::grid_for(pixels * p.G * ((p.Cg() + kRun - 1) / kRun), kThreads);
  if (a.out == DType::kF32)
    col2im_kernel<float><<<blocks, kThreads, 0, stream>>>(geo, cols, static_cast<float*>(b.result),
                                                          pixels, pm);
  else
    col2im_kernel<T><<<blocks, kThreads, 0, stream>>>(geo, cols, static_cast<T*>(b.result),
                                                      pixels, pm);
  return cuda::check_launch("conv im2col_gemm col2im_kernel");
}

template <Mode kMode>
Status run_mode(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  if (a.dir == Direction::kBwdData) return run_bwd_data<kMode>(a, b, ws, stream);
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
  im2col_kernel<T><<<blocks, kThreads, 0, stream>>>(geo, x, patches, a.p.G, pm);
  if (Status st = cuda::check_launch("conv im2col_gemm im2col_kernel"); !st.ok()) return st;

  const MatrixParams<T> pmat{patches, pm.ld, int(pm.rows), int(pm.ld), pm.rows * pm.ld};
  return with_tile<kMode>(a, s.N, /*k_major=*/false, [&](auto tile) -> Status {
    using C = decltype(tile);
    switch (a.dir) {
      case Direction::kFwd: {
        using AL = PlainK<T, C::BM, C::kThreads>;
        using BL = PlainMn<T, C::BN, C::kThreads>;
        const typename BL::Params bp{w, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
        return launch<kMode, C, AL, BL, true>(a, pmat, bp, b.result, Reduce::kNone, nullptr,
                                              stream, "conv im2col_gemm fwd gemm_kernel", pm.ld);
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

// The options of the variant that runs `a` (variant.h): the GEMM's core and tile.
std::string resolve(const Args& a) {
  if (a.dir == Direction::kBwdData) {
    const Args q = bwd_data_gemm(a);
    return tile_options(tile_kind(q, shape_of(q).N, /*k_major=*/true, false));
  }
  return tile_options(tile_kind(a, shape_of(a).N, /*k_major=*/false, false));
}

}  // namespace

const CudaAlgorithm kCudaIm2colGemm = {"im2col_gemm", /*deterministic=*/true,
                                       /*tensor_cores=*/true, supports, workspace_bytes, run,
                                       "wgmma mma_sync 128x64 128x128 ws no_ws", resolve};

}  // namespace jaxdnn::conv
