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
//
// Channel padding. The gathers move 16-byte chunks of one tap's channels, so Cg must be a
// multiple of 8. When it is not (the 3-channel stem of image models), fwd and bwd_filter run
// the same GEMM on copies of x (and of w, fwd) whose channels are padded with zeros to a
// multiple of 8, in the workspace; bwd_filter then crops its padded dw. For the stem (64 x
// 224 x 224 x 3) that is 51 MB of padded x and 2.7x the multiply-adds (147 -> 392 per output),
// against im2col_gemm's 244 MB patch matrix or the direct kernel.
//
// Halo path. On Hopper, 16-bit 2-D stride-1 forward and bwd_data convolutions with channel
// counts that are multiples of 64 (ResNet's 3x3 layers) run cuda_halo_wgmma.cuh instead: each
// input chunk is brought into shared memory once per output tile by TMA and every tap reads
// it there, instead of one gather per tap (unless the variant pins no_halo).

#include "cc/conv/cuda_gemm_conv.cuh"
#include "cc/conv/cuda_halo_filter.cuh"
#include "cc/conv/cuda_halo_wgmma.cuh"

namespace jaxdnn::conv {
namespace {

using namespace gemm;

// Whether the call runs on channel-padded copies (see the top), and the padded problem.
bool pads(const Args& a) { return a.p.Cg() % 8 != 0 && a.dir != Direction::kBwdData; }

Args padded(const Args& a) {
  Args q = a;
  q.p.C = a.p.G * ((a.p.Cg() + 7) / 8 * 8);
  return q;
}

// Workspace: [x padded][w padded (fwd) | dw padded (bwd_filter)][w padded, transposed (TF32
// fwd)][split-K partials].
int64_t pad_x_bytes(const Args& q) { return align256(q.p.x_elems() * elem_bytes(q.in)); }
int64_t pad_w_bytes(const Args& q) {
  return align256(q.p.w_elems() * elem_bytes(q.dir == Direction::kBwdFilter ? q.out : q.in));
}
// The padded TF32 forward also writes its padded w transposed (per group Kg x taps*Cg, k-major),
// so that both operands are k-major and the GEMM runs on wgmma, which has no transposed form
// for 32-bit inputs; in place, w is mn-major and the GEMM runs on mma.sync.
bool kmajor_weight(const Args& q) {
  return q.dir == Direction::kFwd && q.in == DType::kF32 && q.tf32;
}
int64_t pad_wt_bytes(const Args& q) { return kmajor_weight(q) ? pad_w_bytes(q) : 0; }

Support supports_with(const Args& a, Reduce r) {
  Support s = gemm_dtype_support(a);
  if (!s.ok) return s;
  if (pads(a)) {
    if (a.p.Kg() % 8 != 0)
      return Support::No("output channels per group (Kg=" + std::to_string(a.p.Kg()) +
                         ") must be a multiple of 8");
    return split_support(padded(a), r);
  }
  if (!(s = channel_support(a)).ok) return s;
  return split_support(a, r);
}

// dst[o][m][i] = src[o][m][i] for m < mid_src, else 0, for m < mid_dst: pads (mid_dst >
// mid_src) or crops (mid_dst < mid_src) the middle axis of an [outer][mid][inner] tensor of
// E-byte elements. One thread per (o, i), walking m: the index is decoded once per thread
// rather than per element (per-element 64-bit divisions made padding the stem's x, 25.7 M
// elements, cost about a third of its forward).
template <typename E>
__global__ void resize_mid_kernel(const E* __restrict__ src, E* __restrict__ dst, int64_t outer,
                                  int64_t mid_src, int64_t mid_dst, int64_t inner) {
  const int64_t total = outer * inner, keep = mid_src < mid_dst ? mid_src : mid_dst;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = e / inner, i = e - o * inner;
    const E* from = src + o * mid_src * inner + i;
    E* to = dst + o * mid_dst * inner + i;
    for (int64_t m = 0; m < mid_dst; ++m) to[m * inner] = m < keep ? from[m * inner] : E(0);
  }
}

Status resize_mid(const void* src, void* dst, int bytes, int64_t outer, int64_t mid_src,
                  int64_t mid_dst, int64_t inner, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const unsigned blocks = cuda::grid_for(outer * inner, kThreads);
  if (bytes == 2)
    resize_mid_kernel<uint16_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), outer, mid_src, mid_dst,
        inner);
  else
    resize_mid_kernel<uint32_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), outer, mid_src, mid_dst,
        inner);
  return cuda::check_launch("conv implicit_gemm resize_mid_kernel");
}

// The halo kernel's forward view of a call (cuda_halo_wgmma.cuh): the tensor read through
// halos (x, or dy for bwd_data) as (N, H, W, channels), the result's spatial sizes and
// channels, and the padding in front (bwd_data: R - 1 - pad_lo, the flipped filter's).
struct HaloView {
  int64_t in_h, in_w, in_c, out_h, out_w, out_c, pad_h, pad_w;
};

HaloView halo_view(const Args& a) {
  const Problem& p = a.p;
  if (a.dir == Direction::kBwdData)
    return {p.out[1], p.out[2], p.K, p.in[1], p.in[2], p.C, p.filt[1] - 1 - p.pad_lo[1],
            p.filt[2] - 1 - p.pad_lo[2]};
  return {p.in[1], p.in[2], p.C, p.out[1], p.out[2], p.K, p.pad_lo[1], p.pad_lo[2]};
}

// 16 x 8 tiles over an out_h x out_w image: tiles along each axis.
struct HaloTiles {
  int64_t h, w;
};
HaloTiles halo_tiles(int64_t out_h, int64_t out_w) {
  return {(out_h + HaloShape::kTileH - 1) / HaloShape::kTileH,
          (out_w + HaloShape::kTileW - 1) / HaloShape::kTileW};
}

// The halo kernels' common conditions: 16-bit inputs on Hopper, one group, a 2-D (or 1-D)
// stride-1 undilated filter of up to 3 rows and `max_s` columns, channel counts multiples of
// 64, and 16 x 8 tiles of the output at least 70% inside it (56x56: 88%, 28x28 and 14x14: 77%;
// 7x7: 38%, left to the general kernels).
bool halo_shape_ok(const Args& a, int64_t max_s) {
  const Problem& p = a.p;
  if (a.variant.halo == Pin::kOff || a.in == DType::kF32 || p.G != 1 || !use_wgmma(a))
    return false;
  if (p.in[0] != 1 || p.filt[0] != 1) return false;  // 2-D (or 1-D along W)
  for (int ax = 0; ax < 3; ++ax)
    if (p.stride[ax] != 1 || p.lhs_dil[ax] != 1 || p.rhs_dil[ax] != 1) return false;
  const HaloView v = halo_view(a);
  const HaloTiles t = halo_tiles(v.out_h, v.out_w);
  const int64_t covered = t.h * HaloShape::kTileH * t.w * HaloShape::kTileW;
  return v.in_c % 64 == 0 && v.out_c % 64 == 0 && p.filt[1] <= HaloShape::kMaxR &&
         p.filt[2] <= max_s && 10 * v.out_h * v.out_w >= 7 * covered &&
         p.x_elems() < (int64_t(1) << 31) && p.y_elems() < (int64_t(1) << 31);
}

// Whether the halo path takes a fwd or bwd_data call (see the top and cuda_halo_wgmma.cuh).
bool halo_applies(const Args& a, Reduce r) {
  return r == Reduce::kNone && a.dir != Direction::kBwdFilter && a.out == a.in &&
         a.p.filt_spatial() >= 3 && halo_shape_ok(a, HaloShape::kMaxS);
}

// Whether the halo path takes a bwd_filter call (ordered split-K, 3x3 filters:
// cuda_halo_filter.cuh).
bool halo_filter_applies(const Args& a, Reduce r) {
  return r == Reduce::kOrdered && a.dir == Direction::kBwdFilter &&
         a.p.filt[1] == HaloFilterTile::kR && a.p.filt[2] == HaloFilterTile::kS &&
         halo_shape_ok(a, HaloFilterTile::kS);
}

// The halo filter kernel's grid: its output tiles, its (channel chunk, k block) pairs, and
// its splits of the tiles, one CTA per SM over all pairs and each split at least one tile
// (the workspace holds that many partials).
struct HaloFilterGrid {
  HaloTiles t;
  int64_t tiles, k_blocks, combos, splits;
};
HaloFilterGrid halo_filter_grid(const Args& a) {
  const Problem& p = a.p;
  HaloFilterGrid g;
  g.t = halo_tiles(p.out[1], p.out[2]);
  g.tiles = p.N * g.t.h * g.t.w;
  g.k_blocks = p.K / 64;
  g.combos = p.C / 64 * g.k_blocks;
  g.splits = std::max<int64_t>(1, std::min(kTargetCtas / 2 / g.combos, g.tiles));
  return g;
}

int64_t workspace_with(const Args& a, Reduce r) {
  if (!pads(a))
    return halo_filter_applies(a, r) ? partial_bytes(a, halo_filter_grid(a).splits)
                                     : reduce_workspace(a, r);
  const Args q = padded(a);
  return pad_x_bytes(q) + pad_w_bytes(q) + pad_wt_bytes(q) + reduce_workspace(q, r);
}

template <Mode kMode, int BN, bool kBwdData>
Status launch_halo(const HaloParams& hp, int64_t tiles, cudaStream_t stream) {
  using C = HaloTile<typename ModeTraits<kMode>::T, BN>;
  constexpr auto kernel = halo_kernel<kMode, BN, kBwdData>;
  constexpr const char* name = "conv implicit_gemm halo_kernel";
  if (Status st = allow_smem(kernel, C::kSmemBytes, name); !st.ok()) return st;
  kernel<<<cuda::resident_grid<kernel, C::kThreads>(tiles, C::kSmemBytes), C::kThreads,
           C::kSmemBytes, stream>>>(hp);
  return cuda::check_launch(name);
}

template <Mode kMode, int BN>
Status run_halo_tile(const Args& a, const Buffers& b, cudaStream_t stream) {
  using T = typename ModeTraits<kMode>::T;
  using C = HaloTile<T, BN>;
  const Problem& p = a.p;
  const bool bwd = a.dir == Direction::kBwdData;
  const HaloView v = halo_view(a);
  HaloParams hp{};
  const uint32_t lines = uint32_t(C::kTileH + p.filt[1] - 1);
  if (Status st = encode_nhwc(&hp.x, static_cast<const T*>(bwd ? b.y : b.x), p.N, v.in_h,
                              v.in_w, v.in_c, C::kPitch, lines);
      !st.ok())
    return st;
  // w as the (R*S*C) x K matrix; bwd_data reads BN of its rows (output channels) by 64
  // columns (the reduction), k-major.
  if (Status st = encode_tma_2d(&hp.w, static_cast<const T*>(b.w),
                                uint64_t(p.filt_spatial() * p.C), uint64_t(p.K), uint64_t(p.K),
                                bwd ? BN : 64);
      !st.ok())
    return st;
  hp.y = b.result;
  hp.P = int(v.out_h);
  hp.Q = int(v.out_w);
  hp.K = int(v.out_c);
  hp.w_rows = int(p.C);
  hp.S = int(p.filt[2]);
  hp.pad_h = int(v.pad_h);
  hp.pad_w = int(v.pad_w);
  hp.taps = int(p.filt[1] * p.filt[2]);
  hp.chunks = int(v.in_c / 64);
  const HaloTiles t = halo_tiles(v.out_h, v.out_w);
  hp.tiles_h = int(t.h);
  hp.tiles_w = int(t.w);
  hp.tiles_k = int(v.out_c / BN);
  const int64_t tiles = p.N * hp.tiles_h * hp.tiles_w * hp.tiles_k;
  hp.tiles = int(tiles);
  hp.halo_bytes = lines * C::kPitch * kSliceBytes;
  if (tiles == 0) return Status::Ok();
  return bwd ? launch_halo<kMode, BN, true>(hp, tiles, stream)
             : launch_halo<kMode, BN, false>(hp, tiles, stream);
}

template <Mode kMode>
Status run_halo(const Args& a, const Buffers& b, cudaStream_t stream) {
  if constexpr (kMode == Mode::kBf16 || kMode == Mode::kF16) {
    return halo_view(a).out_c % 128 == 0 ? run_halo_tile<kMode, 128>(a, b, stream)
                                          : run_halo_tile<kMode, 64>(a, b, stream);
  } else {
    return Status::Error("conv implicit_gemm: the halo path takes 16-bit inputs");
  }
}

// bwd_filter through cuda_halo_filter.cuh: the split kernel into ws, then the ordered sum.
template <Mode kMode>
Status run_halo_filter(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  if constexpr (kMode == Mode::kBf16 || kMode == Mode::kF16) {
    using C = HaloFilterTile;
    const Problem& p = a.p;
    using T = typename ModeTraits<kMode>::T;
    const uint32_t lines = uint32_t(C::kTileH + C::kR - 1);
    HaloFilterParams hp{};
    if (Status st = encode_nhwc(&hp.x, static_cast<const T*>(b.x), p.N, p.in[1], p.in[2], p.C,
                                C::kPitch, lines);
        !st.ok())
      return st;
    if (Status st = encode_nhwc(&hp.dy, static_cast<const T*>(b.y), p.N, p.out[1], p.out[2],
                                p.K, C::kTileW, C::kTileH);
        !st.ok())
      return st;
    hp.partials = static_cast<float*>(ws);
    hp.C = int(p.C);
    hp.K = int(p.K);
    hp.pad_h = int(p.pad_lo[1]);
    hp.pad_w = int(p.pad_lo[2]);
    const HaloFilterGrid g = halo_filter_grid(a);
    hp.tiles_h = int(g.t.h);
    hp.tiles_w = int(g.t.w);
    hp.tiles = int(g.tiles);
    hp.k_blocks = int(g.k_blocks);
    hp.combos = int(g.combos);
    hp.splits = int(g.splits);
    constexpr auto kernel = halo_filter_kernel<kMode>;
    constexpr const char* name = "conv implicit_gemm halo_filter_kernel";
    if (Status st = allow_smem(kernel, C::kSmemBytes, name); !st.ok()) return st;
    kernel<<<unsigned(hp.combos * hp.splits), C::kThreads, C::kSmemBytes, stream>>>(hp);
    if (Status st = cuda::check_launch(name); !st.ok()) return st;
    return sum_splits<T>(a, hp.partials, b.result, hp.splits, stream);
  } else {
    return Status::Error("conv implicit_gemm: the halo path takes 16-bit inputs");
  }
}

template <Mode kMode>
Status run_mode(const Args& a, const Buffers& b, Reduce r, void* ws, const void* wt,
                cudaStream_t stream) {
  if (halo_applies(a, r)) return run_halo<kMode>(a, b, stream);
  if (halo_filter_applies(a, r)) return run_halo_filter<kMode>(a, b, ws, stream);
  using T = typename ModeTraits<kMode>::T;
  const Geo geo = make_geo(a.p);
  const Shape s = shape_of(a);
  const T* x = static_cast<const T*>(b.x);
  const T* w = static_cast<const T*>(b.w);
  const T* y = static_cast<const T*>(b.y);
  // bwd_data's operands are both k-major, so TF32 runs it on wgmma; fwd and bwd_filter read an
  // mn-major operand in place, except the padded TF32 fwd, which brings w transposed (wt).
  const bool k_major = a.dir == Direction::kBwdData || wt != nullptr;
  return with_tile<kMode>(a, s.N, k_major, [&](auto tile) -> Status {
    using C = decltype(tile);
    switch (a.dir) {
      case Direction::kFwd: {
        using AL = ActRows<T, Direction::kFwd, C::BM, C::kThreads>;
        const typename AL::Params ap{x, geo, int(s.M)};
        if constexpr (kMode == Mode::kTf32) {
          if (wt != nullptr) {
            using BL = PlainK<T, C::BN, C::kThreads>;
            const MatrixParams<T> bp{static_cast<const T*>(wt), s.Kd, int(s.N), int(s.Kd),
                                     s.N * s.Kd};
            return launch<kMode, C, AL, BL, true>(a, ap, bp, b.result, r, ws, stream,
                                                  "conv implicit_gemm fwd gemm_kernel");
          }
        }
        using BL = PlainMn<T, C::BN, C::kThreads>;
        const typename BL::Params bp{w, a.p.K, int(s.Kd), int(s.N), a.p.Kg()};
        return launch<kMode, C, AL, BL, true>(a, ap, bp, b.result, r, ws, stream,
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

Status run_gemm(const Args& a, const Buffers& b, Reduce r, void* ws, cudaStream_t stream,
                const void* wt = nullptr) {
  return with_mode(a, [&](auto mode) {
    return run_mode<decltype(mode)::kMode>(a, b, r, ws, wt, stream);
  });
}

// The padded form: pad x (and w), run the GEMM of the padded problem, crop dw.
Status run_padded(const Args& a, const Buffers& b, Reduce r, void* ws, cudaStream_t stream) {
  const Args q = padded(a);
  const Problem& p = a.p;
  const int64_t cg = p.Cg(), cg8 = q.p.Cg();
  char* x8 = static_cast<char*>(ws);
  char* w8 = x8 + pad_x_bytes(q);
  char* w8t = w8 + pad_w_bytes(q);
  void* rest = w8t + pad_wt_bytes(q);
  const int eb = elem_bytes(a.in);
  if (Status st = resize_mid(b.x, x8, eb, p.N * p.in_spatial() * p.G, cg, cg8, 1, stream); !st.ok())
    return st;
  Buffers bq = b;
  bq.x = x8;
  if (a.dir == Direction::kFwd) {
    if (Status st = resize_mid(b.w, w8, eb, p.filt_spatial(), cg, cg8, p.K, stream); !st.ok())
      return st;
    bq.w = w8;
    if (!kmajor_weight(q)) return run_gemm(q, bq, r, rest, stream);
    const Shape s = shape_of(q);  // w8^T: group g's (Kd x Kg) block at column g * Kg
    if (Status st = transpose(reinterpret_cast<const float*>(w8), reinterpret_cast<float*>(w8t),
                              int(s.Kd), int(s.N), q.p.K, int(q.p.G), stream);
        !st.ok())
      return st;
    return run_gemm(q, bq, r, rest, stream, w8t);
  }
  bq.result = w8;  // bwd_filter: dw of the padded problem, then its first cg channels
  if (Status st = run_gemm(q, bq, r, rest, stream); !st.ok()) return st;
  return resize_mid(w8, b.result, elem_bytes(a.out), p.filt_spatial(), cg8, cg, p.K, stream);
}

// The options of the variant that runs `a` with reduction r (variant.h): the halo kernels, or
// the GEMM's core and tile (of the channel-padded problem where it pads), with no_halo where
// the variant keeps a halo kernel out.
std::string resolve_with(const Args& a, Reduce r) {
  const Args q = pads(a) ? padded(a) : a;
  if (halo_applies(q, r) || halo_filter_applies(q, r)) return ".halo";
  Args general = q;
  general.variant.halo = Pin::kAuto;
  const bool halo_off = halo_applies(general, r) || halo_filter_applies(general, r);
  const bool k_major = a.dir == Direction::kBwdData || (pads(a) && kmajor_weight(q));
  const std::string tile = tile_options(tile_kind(q, shape_of(q).N, k_major, false));
  return halo_off ? ".no_halo" + tile : tile;
}

// One registry entry per reduction form (see the top).
template <Reduce kReduce>
struct Form {
  static Support supports(const Args& a) { return supports_with(a, kReduce); }
  static int64_t workspace(const Args& a) { return workspace_with(a, kReduce); }
  static Status run(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
    return pads(a) ? run_padded(a, b, kReduce, ws, stream) : run_gemm(a, b, kReduce, ws, stream);
  }
  static std::string resolve(const Args& a) { return resolve_with(a, kReduce); }
};

constexpr const char* kGemmOptions = "halo no_halo wgmma mma_sync 128x64 128x128 ws no_ws";

}  // namespace

const CudaAlgorithm kCudaImplicitGemm = {
    "implicit_gemm", /*deterministic=*/true, /*tensor_cores=*/true,
    Form<Reduce::kNone>::supports, Form<Reduce::kNone>::workspace, Form<Reduce::kNone>::run,
    kGemmOptions, Form<Reduce::kNone>::resolve};
const CudaAlgorithm kCudaImplicitGemmSplitK = {
    "implicit_gemm_splitk", /*deterministic=*/true, /*tensor_cores=*/true,
    Form<Reduce::kOrdered>::supports, Form<Reduce::kOrdered>::workspace,
    Form<Reduce::kOrdered>::run, kGemmOptions, Form<Reduce::kOrdered>::resolve};
const CudaAlgorithm kCudaImplicitGemmSplitKAtomic = {
    "implicit_gemm_splitk_atomic", /*deterministic=*/false, /*tensor_cores=*/true,
    Form<Reduce::kAtomic>::supports, Form<Reduce::kAtomic>::workspace,
    Form<Reduce::kAtomic>::run, kGemmOptions, Form<Reduce::kAtomic>::resolve};

}  // namespace jaxdnn::conv
