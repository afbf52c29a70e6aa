// Halo bwd_filter: implicit_gemm_splitk's Hopper path for the filter gradient of 2-D stride-1
// 3x3 convolutions (16-bit, one group, channel counts multiples of 64), the companion of
// cuda_halo_wgmma.cuh's forward and bwd_data. The filter size is fixed at compile time: a
// runtime tap count around the wgmmas made ptxas serialise them (C7518).
//
//   dw[r, s, c, k] = sum over (n, p, q) of x[n, p + r - pad_h, q + s - pad_w, c] * dy[n, p, q, k]
//
// The general kernels gather x^T once per filter tap. Here a CTA owns one 64-channel chunk of
// C and one 64-column block of K for all R x S taps, and walks a run of 16 x 8-pixel output
// tiles; per tile, two TMA boxes:
//   halo  x around the tile: 18 rows x 16 columns x 64 channels (the padding zero-filled by
//         the copy engine), one 128-byte row per pixel, 36 KB (cuda_halo_wgmma.cuh);
//   dy    the tile's 16 x 8 pixels x 64 columns of K, 16 KB (pixels past the image zero-filled,
//         so the tile's junk rows add nothing).
// The GEMM per tap is dw_tap (64 c x 64 k) += X_tap^T (64 c x 128 pixels) * DY (128 pixels x
// 64 k), the reduction over the tile's pixels in row-major order. DY is an mn-major operand
// (k contiguous): k16 step t = pixel rows 16t.. of the box, 2048 bytes, SBO 1024. X_tap^T is an
// mn-major view into the halo (c contiguous): the 16 pixels of step t are output rows 2t and
// 2t + 1, columns 0-7, i.e. 8 consecutive halo rows starting at pixel (2t + r, s) and 8 more
// one halo row (2048 bytes) further: SBO 2048. As in the forward, the swizzle is by absolute
// address, so the view needs no base offset.
// Warpgroup r (three, one per filter row) keeps the accumulators of taps (r, 0..2): 3 x 32
// registers. Work per tile and warpgroup: 3 x 8 wgmmas of 64 x 64 x 16.
//
// Split-K: CTA (combo, split) runs tiles [split * T / splits, (split + 1) * T / splits) of the
// T = N x tiles_h x tiles_w tiles, combo = (chunk, k block); each CTA writes its R x S x 64 x 64
// partial sums once, at the end, into split `split` of the ordered partials that
// sum_splits_kernel adds in a fixed order (deterministic).
// Pipeline: kStages = 4 buffers of (halo, dy), one mbarrier each; thread 0 issues tile i + 2
// after the barrier of tile i, into tile i - 2's buffer (each warpgroup leaves one tile's
// wgmmas in flight, wait_group 1, so at that barrier tile i - 2 has retired everywhere).
#pragma once

#include "cc/conv/cuda_halo_wgmma.cuh"

namespace jaxdnn::conv::gemm {

struct HaloFilterTile : HaloShape {
  static constexpr int kR = 3, kS = 3;  // the filter; warpgroup r owns row r's taps
  static constexpr int kStages = 4, kAhead = 2, kThreads = kR * 128;
  static constexpr int kDyBytes = kTileH * kTileW * kSliceBytes;  // 16 KB
  static constexpr int kStageBytes = kHaloBytes + kDyBytes;       // 52 KB
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes;  // 209 KB
  // The epilogue stages each (warpgroup, tap) block of 64 x 64 floats in the idle buffers.
  static_assert(kR * kS * 64 * 64 * 4 <= kStages * kStageBytes, "staging");
};

struct HaloFilterParams {
  CUtensorMap x;   // {C, W, H, N}, boxes {64, 16, 18, 1}
  CUtensorMap dy;  // {K, Q, P, N}, boxes {64, 8, 16, 1}
  float* partials;  // [split][9*C][K]
  int C, K, pad_h, pad_w;
  int tiles_h, tiles_w, tiles, k_blocks, combos, splits;  // tiles = N * tiles_h * tiles_w,
                                                          // combos = C / 64 * k_blocks
};

template <Mode kMode>
__global__ void __launch_bounds__(HaloFilterTile::kThreads, 1)
    halo_filter_kernel(const __grid_constant__ HaloFilterParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = HaloFilterTile;
  extern __shared__ unsigned char smem[];
  __shared__ alignas(8) uint64_t bars[C::kStages];
  auto bar = [&](int i) { return smem_addr(&bars[i]); };
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  auto halo = [&](int i) { return base + uint32_t(i * C::kStageBytes); };
  auto dy_tile = [&](int i) { return halo(i) + uint32_t(C::kHaloBytes); };
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3;
  const int combo = blockIdx.x % p.combos, split = blockIdx.x / p.combos;
  const int chunk = combo / p.k_blocks, k0 = combo % p.k_blocks * 64;
  const int first = int(int64_t(split) * p.tiles / p.splits);
  const int count = int(int64_t(split + 1) * p.tiles / p.splits) - first;
  if (tid == 0) {
    for (int i = 0; i < C::kStages; ++i) mbar_init(bar(i), 1);
    mbar_init_fence();
  }
  __syncthreads();

  auto produce = [&](int i) {  // thread 0: tile first + i into buffer i % kStages
    if (i >= count) return;
    int t = first + i;
    const int w0 = t % p.tiles_w * C::kTileW;
    t /= p.tiles_w;
    const int h0 = t % p.tiles_h * C::kTileH, n = t / p.tiles_h;
    const int s = i % C::kStages;
    mbar_expect_bytes(bar(s), uint32_t(C::kStageBytes));
    tma_load_4d(halo(s), &p.x, chunk * 64, w0 - p.pad_w, h0 - p.pad_h, n, bar(s));
    tma_load_4d(dy_tile(s), &p.dy, k0, w0, h0, n, bar(s));
  };
  if (tid == 0)
    for (int i = 0; i < C::kAhead; ++i) produce(i);

  float acc[C::kS][32];  // warpgroup wg: taps (wg, s)
#pragma unroll
  for (int s = 0; s < C::kS; ++s)
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      acc[s][i] = 0.f;
      // Pins the zeros here: sunk into the first tile's wgmma sequence, they made ptxas
      // serialise the wgmmas (C7515).
      asm volatile("" : "+f"(acc[s][i])::"memory");
    }
  uint32_t phases = 0;
  for (int i = 0; i < count; ++i) {
    const int slot = i % C::kStages;
    mbar_wait(bar(slot), (phases >> slot) & 1u);
    phases ^= 1u << slot;
    __syncthreads();  // tile i landed; tile i - 2 retired in every warpgroup
    if (tid == 0) produce(i + C::kAhead);
    const uint32_t hb = halo(slot), db = dy_tile(slot);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < C::kS; ++s)
#pragma unroll
      for (int t = 0; t < C::kTileH * C::kTileW / 16; ++t) {
        // Output rows 2t, 2t + 1 of the tile, tap (wg, s): halo pixel (2t + wg, s).
        const uint32_t at = hb + uint32_t(((2 * t + wg) * C::kPitch + s) * kSliceBytes);
        wgmma<64, kMode, true, true>(acc[s], smem_desc(at, 64 * kSliceBytes, 2 * 1024),
                                     operand_desc<false>(db, t));
      }
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  __syncthreads();  // every wgmma retired: the buffers take the staging

  const int64_t M = int64_t(C::kR * C::kS) * p.C;
  float* out = p.partials + int64_t(split) * M * p.K;
#pragma unroll
  for (int s = 0; s < C::kS; ++s) {
    unsigned char* stg =
        smem + (base - smem_addr(smem)) + (wg * C::kS + s) * 64 * 64 * int(sizeof(float));
    const int64_t row0 = int64_t(wg * C::kS + s) * p.C + chunk * 64;
    const DenseRows<float> rows{out + row0 * p.K + k0, p.K, 64};
    stage_rows<float, 64>(acc[s], stg, wq, lane, tid & 127, wg, rows, 64);
  }
#endif
}

}  // namespace jaxdnn::conv::gemm
