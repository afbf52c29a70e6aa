// Conv-as-GEMM plumbing shared by implicit_gemm, implicit_precomp_gemm and im2col_gemm: the
// GEMM shape of each direction, tile and split-K choice, support rules, the launch, and the
// split-K reductions. Each algorithm file only chooses its operand loaders.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cc/common/cuda_util.h"
#include "cc/conv/cuda_algorithms.h"
#include "cc/conv/cuda_gemm_core.cuh"
#include "cc/conv/cuda_gemm_operands.cuh"
#include "cc/conv/cuda_gemm_wgmma.cuh"

namespace jaxdnn::conv::gemm {

// One group's GEMM: C(M, N) = A(M, Kd) B(Kd, N); see cuda_gemm_core.cuh.
struct Shape {
  int64_t M, N, Kd;
};

inline Shape shape_of(const Args& a) {
  const Problem& p = a.p;
  const int64_t taps = p.filt_spatial();
  switch (a.dir) {
    case Direction::kFwd: return {p.N * p.out_spatial(), p.Kg(), taps * p.Cg()};
    case Direction::kBwdData: return {p.N * p.in_spatial(), p.Cg(), taps * p.Kg()};
    case Direction::kBwdFilter: return {taps * p.Cg(), p.Kg(), p.N * p.out_spatial()};
  }
  return {0, 0, 0};
}

inline int elem_bytes(DType t) { return t == DType::kF64 ? 8 : (t == DType::kF32 ? 4 : 2); }

// Tiles: (BM, BN) = (128, 64) when the GEMM's N is at most 64 (ResNet's 64-channel layers would
// waste half of a 128-wide tile), else (128, 128).
//   mma.sync (any sm_80+ GPU, and float32): 4 warps of 64 x 32 or 64 x 64 (32 independent mmas
//   per k step per warp); 3 stages of 128-byte k-slices (72 / 96 KB of shared memory, two CTAs
//   per SM).
//   wgmma (sm_90; 16-bit inputs, and TF32 when both operands are k-major): 2 warpgroups of
//   64 x BN, persistent CTAs, a 4-slice ring; wide tiles warp-specialised (WsTile: two
//   producer warpgroups feed the two consumers through a 5-slice ring).
template <typename T> using TileNarrow = Tile<T, 128, 64, 64, 32, 3>;
template <typename T> using TileWide = Tile<T, 128, 128, 64, 64, 3>;
template <typename T> using WgTileNarrow = WgTile<T, 128, 64>;
template <typename T> using WgTileWide = WgTile<T, 128, 128>;
template <typename T> using WsTileWide = WsTile<T, 128, 128>;
template <typename T> using WsTileWider = WsTile<T, 128, 256>;

constexpr int kTileM = 128;
inline int tile_n(int64_t N) { return N <= 64 ? 64 : 128; }
inline int slice_elems(const Args& a) { return kSliceBytes / elem_bytes(a.in); }

// Whether the wgmma kernels may run: a Hopper GPU (they are compiled for sm_90a only; other
// GPUs run the PTX of the mma.sync ones), unless the variant pins mma_sync.
inline bool use_wgmma(const Args& a) {
  if (a.variant.wgmma == Pin::kOff) return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

// Whether a GEMM of `a`'s mode runs on wgmma: 16-bit, or TF32 when both of its operand loaders
// are k-major (`k_major`); 3xTF32 stays on mma.sync.
inline bool wgmma_runs(const Args& a, bool k_major) {
  const bool tf32 = a.in == DType::kF32;
  return (!tf32 || (a.tf32 && k_major)) && use_wgmma(a);
}

// The GEMM tiles (variant.h names them by their options):
//   kMmaNarrow  mma.sync 128x64          kMmaWide  mma.sync 128x128
//   kWgNarrow   wgmma 128x64             kWgWide   wgmma 128x128
//   kWsWide     warp-specialised 128x128 kWsWider  warp-specialised 128x256
// By the problem: 64 columns when the GEMM's N is at most 64, else 128, warp-specialised on
// wgmma (narrow tiles keep wgmma_kernel: with half the MMA work per slice and one CTA per SM,
// the warp-specialised one lost up to 2x there, docs/perf/conv.md), and 128x256 where `wider`
// (kAllTma GEMMs: with_tile) and N is a multiple of 256. The variant may pin the width (64,
// 128, 256), the core (wgmma_runs) and ws.
enum class TileKind { kMmaNarrow, kMmaWide, kWgNarrow, kWgWide, kWsWide, kWsWider };

inline TileKind tile_kind(const Args& a, int64_t N, bool k_major, bool wider) {
  const int pinned = a.variant.tile_n;
  const bool narrow = pinned == 64 || (pinned == 0 && N <= 64);
  if (wgmma_runs(a, k_major)) {
    const bool ws = a.variant.ws != Pin::kOff;
    if (wider && N % 256 == 0 && ws && pinned != 64 && pinned != 128) return TileKind::kWsWider;
    if (narrow) return TileKind::kWgNarrow;
    return ws ? TileKind::kWsWide : TileKind::kWgWide;
  }
  return narrow ? TileKind::kMmaNarrow : TileKind::kMmaWide;
}

inline bool is_wgmma(TileKind t) { return t != TileKind::kMmaNarrow && t != TileKind::kMmaWide; }

// Columns of a tile.
inline int tile_cols(TileKind t) {
  switch (t) {
    case TileKind::kMmaNarrow: case TileKind::kWgNarrow: return 64;
    case TileKind::kWsWider: return 256;
    default: return 128;
  }
}

// The options of a GEMM's variant (variant.h): its core, the options of its operand loaders
// (`loaders`, e.g. ".table.tma_b"), the tile's width and (wgmma, 128 columns and up) ws.
inline std::string tile_options(TileKind t, const std::string& loaders = "") {
  std::string s = (is_wgmma(t) ? ".wgmma" : ".mma_sync") + loaders;
  s += ".128x" + std::to_string(tile_cols(t));
  if (t == TileKind::kWgWide) s += ".no_ws";
  if (t == TileKind::kWsWide || t == TileKind::kWsWider) s += ".ws";
  return s;
}

// Runs fn(tile config) for a GEMM of mode kMode with N columns: tile_kind's tile; `k_major` and
// `wider` as there. kAllTma: both operand loaders are TMA ones (the only GEMMs with
// 128x256 tiles; `wider` needs one group, so that no 64-column box of a 256-column tile reaches
// into the next group's columns, and wide_plan).
template <Mode kMode, bool kAllTma = false, typename Fn>
Status with_tile(const Args& a, int64_t N, bool k_major, Fn&& fn, bool wider = false) {
  using T = typename ModeTraits<kMode>::T;
  const TileKind tile = tile_kind(a, N, k_major, kAllTma && wider);
  switch (tile) {
    case TileKind::kMmaNarrow: return fn(TileNarrow<T>{});
    case TileKind::kMmaWide: return fn(TileWide<T>{});
    default: break;
  }
  if constexpr (kMode != Mode::k3xTf32) {  // (wgmma_runs never gives 3xTF32 a wgmma tile)
    switch (tile) {
      case TileKind::kWgNarrow: return fn(WgTileNarrow<T>{});
      case TileKind::kWgWide: return fn(WgTileWide<T>{});
      case TileKind::kWsWide: return fn(WsTileWide<T>{});
      case TileKind::kWsWider:
        if constexpr (kAllTma) return fn(WsTileWider<T>{});
        break;
      default: break;
    }
  }
  return Status::Error("conv gemm: no tile for this mode");
}

template <Mode M> struct ModeTag { static constexpr Mode kMode = M; };

// The tensor-core mode of a call: bf16/f16 as given, float32 as TF32 when the caller's
// precision allows it, else 3xTF32 (float32 accuracy).
template <typename Fn>
Status with_mode(const Args& a, Fn&& fn) {
  switch (a.in) {
    case DType::kBF16: return fn(ModeTag<Mode::kBf16>{});
    case DType::kF16: return fn(ModeTag<Mode::kF16>{});
    case DType::kF32: return a.tf32 ? fn(ModeTag<Mode::kTf32>{}) : fn(ModeTag<Mode::k3xTf32>{});
    default: return Status::Error("conv gemm: unsupported dtype");
  }
}

// What every tensor-core GEMM algorithm needs: 16-bit or float32 operands (no integers) (float64 has no
// tensor-core path here), a result of the input dtype or float32, and int32 sizes.
inline Support gemm_dtype_support(const Args& a) {
  if (Support s = float_inputs(a); !s.ok) return s;
  if (a.in == DType::kF64) return Support::No("float64 has no tensor-core path: use direct");
  if (a.out != a.in && a.out != DType::kF32)
    return Support::No("the result must have the input dtype or float32");
  const Problem& p = a.p;
  const int64_t limit = int64_t(1) << 31;
  if (p.x_elems() >= limit || p.y_elems() >= limit || p.w_elems() >= limit)
    return Support::No("tensors of 2^31 or more elements are not supported");
  return Support::Yes();
}

// The 16-byte chunks of the GEMM operands must not straddle channel groups or taps, and the
// epilogue stores pairs: both channel counts a multiple of 8 elements.
inline Support channel_support(const Args& a) {
  const Problem& p = a.p;
  if (p.Cg() % 8 != 0 || p.Kg() % 8 != 0)
    return Support::No("channels per group (Cg=" + std::to_string(p.Cg()) + ", Kg=" +
                       std::to_string(p.Kg()) + ") must be multiples of 8");
  return Support::Yes();
}

// ---------------------------------------------------------------------------------------------
// Split-K. The reduction of a GEMM with few output tiles (bwd_filter's C is only the filter;
// late ResNet layers have few output pixels) is cut into `splits` ranges run by separate CTAs
// so the grid fills the GPU's 132 SMs about twice.
// ---------------------------------------------------------------------------------------------

constexpr int64_t kTargetCtas = 2 * 132;
constexpr int64_t kMinSlicesPerSplit = 4;

inline int64_t k_slices(const Args& a) {
  return (shape_of(a).Kd + slice_elems(a) - 1) / slice_elems(a);
}

inline int64_t output_tiles(const Args& a) {
  const Shape s = shape_of(a);
  return ((s.M + kTileM - 1) / kTileM) * ((s.N + tile_n(s.N) - 1) / tile_n(s.N)) * a.p.G;
}

// (splits, slices per split) with no empty split.
struct SplitPlan {
  int64_t splits, per_split;
};

// `slices` cut into at most `splits` even ranges.
inline SplitPlan even_split(int64_t slices, int64_t splits) {
  const int64_t per = (slices + splits - 1) / splits;
  return {(slices + per - 1) / per, per};
}

inline SplitPlan split_plan(const Args& a) {
  const int64_t tiles = output_tiles(a), slices = k_slices(a);
  int64_t splits = (kTargetCtas + tiles - 1) / tiles;
  const int64_t cap = slices / kMinSlicesPerSplit;
  if (splits > cap) splits = cap;
  if (splits < 1) splits = 1;
  return even_split(slices, splits);
}

inline int64_t partial_bytes(const Args& a, int64_t splits) {
  const Shape s = shape_of(a);
  return splits * a.p.G * s.M * s.N * int64_t(sizeof(float));
}

// How a GEMM algorithm writes its result.
enum class Reduce { kNone, kOrdered, kAtomic };

inline Support split_support(const Args& a, Reduce r) {
  if (r == Reduce::kNone) return Support::Yes();
  const SplitPlan plan = split_plan(a);
  if (plan.splits < 2) {
    const int64_t tiles = output_tiles(a);
    if (tiles >= kTargetCtas)
      return Support::No("the output already fills the GPU (" + std::to_string(tiles) +
                         " tiles): split-K would run one split");
    return Support::No("the reduction (" + std::to_string(k_slices(a)) +
                       " slices) is too short to split");
  }
  if (a.p.G * plan.splits > 65535) return Support::No("too many groups for split-K");
  return Support::Yes();
}

// bwd_filter reduces over every output pixel into a filter-sized result: the workspace-using
// algorithms (tables, patch matrix) always split it, ordered, when that gives several splits.
inline Reduce filter_split(const Args& a) {
  return a.dir == Direction::kBwdFilter && split_plan(a).splits > 1 ? Reduce::kOrdered
                                                                    : Reduce::kNone;
}

// 256-column tiles (with_tile's `wider`) halve the B operand's L2 traffic per output, but also
// the tile count. Measured on the H200 (docs/perf/conv.md): they pay where the 128x256 tiles
// cover two thirds of the SMs (l3 3x3 and l4s2 fwd, 98 tiles on 132: +26-45%) and lose where
// they don't (l4 3x3, 50 tiles: -15-17%). Below that, a GEMM with a long enough reduction runs
// them in two ordered splits where that fills two thirds of the SMs in one wave (l4 3x3: 100
// CTAs), if `may_split`. A variant pinned to 128x256 takes them at any size, split wherever two
// splits fit one wave; one pinned to narrower tiles or no_ws never does.
struct WidePlan {
  bool wide;
  int64_t splits;  // of the reduction (1: none)
};

inline WidePlan wide_plan(const Args& a, const Shape& s, int64_t slices, bool may_split) {
  const int pinned = a.variant.tile_n;
  if (s.N % 256 != 0 || pinned == 64 || pinned == 128 || a.variant.ws == Pin::kOff)
    return {false, 1};
  const int64_t tiles = (s.M + 127) / 128 * (s.N / 256), sms = cuda::sm_count();
  const bool two = may_split && slices >= 2 * kMinSlicesPerSplit && 2 * tiles <= sms;
  if (pinned == 256) return {true, two ? 2 : 1};
  if (3 * tiles >= 2 * sms) return {true, 1};
  if (two && 3 * 2 * tiles >= 2 * sms) return {true, 2};
  return {false, 1};
}

// Workspace of the result path: ordered partials for every split, or one float accumulator.
inline int64_t reduce_workspace(const Args& a, Reduce r) {
  switch (r) {
    case Reduce::kNone: return 0;
    case Reduce::kOrdered: return partial_bytes(a, split_plan(a).splits);
    case Reduce::kAtomic: return partial_bytes(a, 1);
  }
  return 0;
}

// out[m, g*N + n] = sum over s in order of ws[s][g][m][n], converted to the result dtype.
template <typename Out>
__global__ void sum_splits_kernel(const float* __restrict__ ws, Out* __restrict__ out,
                                  int64_t G, int64_t M, int64_t N, int64_t splits, int64_t ldo) {
  const int64_t total = G * M * N;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int64_t k = 0; k < splits; ++k) s += ws[k * total + e];
    const int64_t n = e % N, m = e / N % M, g = e / (N * M);
    out[m * ldo + g * N + n] = cuda::from_acc<Out>(s);
  }
}

inline int64_t result_ld(const Args& a) { return a.dir == Direction::kBwdData ? a.p.C : a.p.K; }

// The result of a split GEMM: `splits` float partials of its shape in `ws`, added in order and
// converted to the result dtype (T, the 16-bit input type, or float).
template <typename T>
Status sum_splits(const Args& a, const float* ws, void* result, int64_t splits,
                  cudaStream_t stream) {
  const Shape s = shape_of(a);
  const int64_t total = a.p.G * s.M * s.N;
  constexpr int kThreads = 256;
  if (a.out == DType::kF32)
    sum_splits_kernel<float><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        ws, static_cast<float*>(result), a.p.G, s.M, s.N, splits, result_ld(a));
  else
    sum_splits_kernel<T><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        ws, static_cast<T*>(result), a.p.G, s.M, s.N, splits, result_ld(a));
  return cuda::check_launch("conv gemm sum_splits_kernel");
}

// Per-group transpose for an operand that must be k-major: group g's rows x cols block at
// in + g * cols (row stride ld) becomes cols x rows, dense, at out + g * rows * cols. Through a
// 32 x 33 shared tile, so that both the reads and the writes are coalesced.
template <typename T>
__global__ void transpose_kernel(const T* __restrict__ in, T* __restrict__ out, int rows,
                                 int cols, int64_t ld) {
  __shared__ T tile[32][33];
  const T* src = in + int64_t(blockIdx.z) * cols;
  T* dst = out + int64_t(blockIdx.z) * rows * cols;
  const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * ld + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[int64_t(c) * rows + r] = tile[threadIdx.x][i];
  }
}

template <typename T>
Status transpose(const T* in, T* out, int rows, int cols, int64_t ld, int groups,
                 cudaStream_t stream) {
  const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32), unsigned(groups));
  transpose_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(in, out, rows, cols, ld);
  return cuda::check_launch("conv gemm transpose_kernel");
}

// Lets `kernel` take `bytes` of dynamic shared memory, carved out of L1 in full (the GEMM
// kernels stage all their reuse in shared memory).
template <typename Kernel>
Status allow_smem(Kernel kernel, int bytes, const char* name) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) !=
          cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared) != cudaSuccess)
    return cuda::check_launch(name);
  return Status::Ok();
}

// The wgmma kernel of tile C: warp-specialised (WsTile) or not (WgTile).
template <Mode kMode, typename C, typename AL, typename BL, bool kFuse>
constexpr auto wgmma_entry() {
  if constexpr (C::kWs) return wgmma_ws_kernel<kMode, C, AL, BL, kFuse>;
  else return wgmma_kernel<kMode, C, AL, BL, kFuse>;
}

// Launches the persistent wgmma kernel (kFuse: its fused-epilogue instantiation): as many CTAs
// as fit (one wave), each running a strided share of the tiles.
template <Mode kMode, typename C, typename AL, typename BL, bool kFuse>
Status launch_wgmma(const typename AL::Params& ap, const typename BL::Params& bp,
                    const Epilogue& epi, const Shape& s, int64_t tiles, int64_t slices,
                    const SplitPlan& run, cudaStream_t stream, const char* name) {
  constexpr auto kernel = wgmma_entry<kMode, C, AL, BL, kFuse>();
  if (Status st = allow_smem(kernel, C::kSmemBytes, name); !st.ok()) return st;
  kernel<<<cuda::resident_grid<kernel, C::kLaunchThreads>(tiles, C::kSmemBytes),
           C::kLaunchThreads, C::kSmemBytes, stream>>>(ap, bp, epi, int(s.M), int(s.N),
                                                       int(slices), int(run.per_split),
                                                       int(run.splits));
  return Status::Ok();
}

// Hands the fused forward's epilogue (Args::epilogue) to a wgmma GEMM whose unsplit, dense
// store writes the call's result itself (in its layout): the kernel applies it on the way out
// (stage_rows) and the call skips its pass.
inline bool fuse_epilogue(const Args& a, const void* result, Reduce r, Epilogue* epi) {
  const FusedEpilogue* f = a.epilogue;
  if (f == nullptr || a.dir != Direction::kFwd || r != Reduce::kNone || a.rows.mapped() ||
      result != f->result() || f->e.dtype == DType::kF64)
    return false;
  epi->y = f->b.y;
  epi->bias = static_cast<const float*>(f->b.bias);
  epi->residual = f->b.residual;
  epi->act = f->e.act ? int(f->e.op) : -1;
  epi->alpha = float(f->e.alpha);
  f->applied = true;
  return true;
}

// Launches one GEMM with loaders AL, BL and the result path `r`; `ws` is the reduction's
// workspace (reduce_workspace bytes). `kd` overrides the reduction length (a padded one),
// `splits` (> 0) split_plan's split count. kFusable: a forward's call site, whose wgmma kernel
// may take the fused forward's epilogue (fuse_epilogue; only such sites instantiate the
// kernels that apply it).
template <Mode kMode, typename C, typename AL, typename BL, bool kFusable = false>
Status launch(const Args& a, const typename AL::Params& ap, const typename BL::Params& bp,
              void* result, Reduce r, void* ws, cudaStream_t stream, const char* name,
              int64_t kd = -1, int64_t splits = 0) {
  using T = typename ModeTraits<kMode>::T;
  const Shape s = shape_of(a);
  const int64_t slices = kd < 0 ? k_slices(a) : (kd + C::BK - 1) / C::BK;
  const SplitPlan run = r == Reduce::kNone ? SplitPlan{1, slices}
                        : splits > 0       ? even_split(slices, splits)
                                           : split_plan(a);
  Epilogue epi{r == Reduce::kNone ? Store::kOut
                                  : (r == Reduce::kOrdered ? Store::kPartial : Store::kAtomic),
               r == Reduce::kNone ? result : ws, a.out == DType::kF32, result_ld(a), int(a.p.G),
               a.rows};
  if (r != Reduce::kNone && a.rows.mapped())
    return Status::Error("conv gemm: mapped result rows need a direct (unsplit) store");
  if (r == Reduce::kAtomic && cudaMemsetAsync(ws, 0, partial_bytes(a, 1), stream) != cudaSuccess)
    return cuda::check_launch("conv gemm workspace memset");
  const unsigned tiles_m = unsigned((s.M + C::BM - 1) / C::BM);
  const unsigned tiles_n = unsigned((s.N + C::BN - 1) / C::BN);
  if constexpr (C::kWgmma && !kWgmmaOperands<T, AL, BL>) {
    return Status::Error("conv gemm: TF32 on wgmma needs k-major operands");  // see with_tile
  } else if constexpr (C::kWgmma) {
    const int64_t tiles = int64_t(tiles_m) * tiles_n * a.p.G * run.splits;
    if (tiles == 0) return Status::Ok();
    bool fused = false;
    if constexpr (kFusable) fused = fuse_epilogue(a, result, r, &epi);
    Status st = fused ? launch_wgmma<kMode, C, AL, BL, kFusable>(ap, bp, epi, s, tiles, slices,
                                                                 run, stream, name)
                      : launch_wgmma<kMode, C, AL, BL, false>(ap, bp, epi, s, tiles, slices,
                                                              run, stream, name);
    if (!st.ok()) return st;
  } else {
    if (a.rows.mapped())
      return Status::Error("conv gemm: mapped result rows need the wgmma epilogue");
    auto kernel = gemm_kernel<kMode, C, AL, BL>;
    if (Status st = allow_smem(kernel, C::kSmemBytes, name); !st.ok()) return st;
    const dim3 grid(tiles_m, tiles_n, unsigned(a.p.G * run.splits));
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(ap, bp, epi, int(s.M), int(s.N),
                                                         int(slices), int(run.per_split));
  }
  Status st = cuda::check_launch(name);
  if (!st.ok() || r == Reduce::kNone) return st;
  return sum_splits<T>(a, static_cast<const float*>(ws), result,
                       r == Reduce::kOrdered ? run.splits : 1, stream);
}

}  // namespace jaxdnn::conv::gemm
