// Halo GEMM: implicit_gemm's Hopper path for 2-D stride-1 convolutions, forward and bwd_data
// (16-bit, one group, channel counts multiples of 64, filters of up to 3 rows and 9 columns,
// 3+ taps). bwd_data of a stride-1 layer is the forward of dy with the filter flipped and its
// channels swapped: the same kernel, with "x" = dy and the padding R - 1 - pad_lo, reading w
// k-major (below).
//
// The general kernels gather A from x once per filter tap (9 times per pixel on a 3x3 layer),
// through per-thread cp.asyncs and table or index arithmetic; ncu put the 3x3 layers at 43%
// SM / 45% L2 with 8 cycles per issued instruction, i.e. waiting on those gathers. Here a
// CTA's output tile is 16 rows x 8 columns of one image and BN output channels; for each
// 64-channel chunk of x, one 4-D TMA box brings the tile's halo into shared memory:
//   halo  18 rows x 16 columns x 64 channels (rows and columns past the image, the padding,
//         zero-filled by the copy engine), one 128-byte row per pixel: 36 KB.
// Every tap's A operand is then a view of that box, nothing is copied per tap: output pixel
// (i, j) of tap (r, s) reads halo pixel (i + r, j + s), so the 8 pixels of an output row are
// 8 consecutive 128-byte rows of the halo (one wgmma core group) and consecutive output rows
// are one halo row (16 pixels, 2048 bytes) apart: a k-major operand with SBO 2048 starting at
// halo pixel (r, s). The 128-byte swizzle is applied by TMA when it writes and by wgmma when
// it reads, both to absolute shared-memory address bits (cuda_gemm_wgmma.cuh), so a view that
// starts s rows into a 1024-byte block reads what the box wrote there with the descriptor's
// base offset field left at 0. (Measured on the H200: setting it to the start's row in the
// block, (start >> 7) & 7, as one reading of the PTX ISA suggests, shifts the swizzle a second
// time; every tap with s != 0 came out wrong.)
//   B     w as the (R*S*C) x K row-major matrix (HWIO). fwd: per (chunk, tap) slice the
//         64 x BN block at row tap*C + chunk*64, column k0, as 64x64 TMA boxes (TmaMn's
//         layout, mn-major). bwd_data: the reduction runs over K (w's columns) and the output
//         over C (its rows), so w is already k-major: one BN x 64 box at row
//         (taps - 1 - tap)*C + c0 (the flipped tap), column chunk*64.
// Work per slice and warpgroup: 64 rows (8 output rows x 8 columns) x BN x 64 channels, four
// wgmma k16 steps. Bytes per slice (BN = 128): 16 KB of w + a ninth of a 36 KB halo on a 3x3
// layer, against 16 KB of gathered A + 16 KB of w in implicit_precomp_gemm, and no address
// arithmetic per element.
//
// Schedule: persistent CTAs as in wgmma_kernel, each running tiles b, b + grid, ... as one
// stream of (tile, chunk, tap) slices; thread 0 issues every copy ahead of its use:
//   B     a ring of kStages buffers, one mbarrier each (slice q in buffer q % kStages); after
//         the barrier of slice q (every slice up to q - 2 retired) slice q + kStages - 2.
//   halo  two buffers, one mbarrier each; chunk c of the stream in buffer c % 2, issued after
//         the barrier of chunk c - 1's second slice, when chunk c - 2's last slice has retired
//         (a chunk has 3+ taps): taps - 1 slices ahead of its first use.
// The epilogue stages each warpgroup's 64 x BN block in the B buffers of the tile's last two
// slices (idle until the next barrier) and writes the rows that fall inside the image.
#pragma once

#include "cc/conv/cuda_gemm_wgmma.cuh"

namespace jaxdnn::conv::gemm {

struct HaloShape {
  static constexpr int kTileH = 16, kTileW = 8;   // output rows, columns per CTA tile
  static constexpr int kMaxR = 3, kMaxS = 9;      // filter rows, columns
  static constexpr int kLines = kTileH + kMaxR - 1;  // halo rows (boxes of R < 3 use fewer)
  static constexpr int kPitch = 16;                // halo columns (pixels per halo row)
  static constexpr int kHaloBytes = kLines * kPitch * kSliceBytes;  // 36 KB
};

template <typename T, int BN_>
struct HaloTile : HaloShape {
  // B ring: kAhead slices in flight plus the two the wgmmas may still read. BN 64 keeps two
  // CTAs per SM (105 KB each); BN 128 runs one (169 KB) and looks further ahead.
  static constexpr int BN = BN_, kStages = BN == 128 ? 6 : 4, kAhead = kStages - 2;
  static constexpr int kThreads = 256;
  static constexpr int kBBytes = BN * kSliceBytes;  // one slice of w: 64 rows of k x BN
  static constexpr int kSmemBytes = 1024 + 2 * kHaloBytes + kStages * kBBytes;
  static_assert(sizeof(T) == 2 && (BN == 64 || BN == 128), "16-bit inputs, 64 or 128 columns");
};

// The forward view: "x" is the tensor read through halos (x, or dy for bwd_data), "y" the
// result (y, or dx), (P, Q, K) its sizes; w_rows = C of w's HWIO shape (rows per tap).
struct HaloParams {
  CUtensorMap x;  // {channels, W, H, N}, boxes {64, 16, 16 + R - 1, 1}
  CUtensorMap w;  // {K, R*S*C}: boxes {64, 64} (fwd) or {64, BN} (bwd_data)
  void* y;        // (N, P, Q, K)
  int P, Q, K, w_rows, S, pad_h, pad_w;
  int taps, chunks;                         // R*S, C / 64
  int tiles_h, tiles_w, tiles_k, tiles;     // tiles = N * tiles_h * tiles_w * tiles_k
  uint32_t halo_bytes;                      // the box's bytes: (16 + R - 1) * 16 * 128
};

// Output tile t: channel tile fastest (the CTAs running together share one halo in L2).
struct HaloJob {
  int n, h0, w0, k0;
};

template <int BN>
__device__ __forceinline__ HaloJob halo_job(const HaloParams& p, int t) {
  HaloJob j;
  j.k0 = t % p.tiles_k * BN;
  t /= p.tiles_k;
  j.w0 = t % p.tiles_w * HaloShape::kTileW;
  t /= p.tiles_w;
  j.h0 = t % p.tiles_h * HaloShape::kTileH;
  j.n = t / p.tiles_h;
  return j;
}

// Row r of warpgroup wg's 64: output pixel (h0 + 8 wg + r / 8, w0 + r % 8), kept if inside.
template <typename T>
struct HaloRows {
  T* y;
  int64_t pix0;  // pixel index of the warpgroup's first row: (n*P + h0 + 8 wg)*Q + w0
  int h_left, w_left, Q, K;  // rows and columns of the image left from that pixel
  __device__ __forceinline__ bool ok(int r) const {
    return (r >> 3) < h_left && (r & 7) < w_left;
  }
  __device__ __forceinline__ T* at(int r) const {
    return y + (pix0 + int64_t(r >> 3) * Q + (r & 7)) * K;
  }
};

template <Mode kMode, int BN, bool kBwdData>
__global__ void __launch_bounds__(256, 2) halo_kernel(const __grid_constant__ HaloParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename ModeTraits<kMode>::T;
  using C = HaloTile<T, BN>;
  extern __shared__ unsigned char smem[];
  __shared__ alignas(8) uint64_t bars[C::kStages + 2];  // B ring, then the two halos
  auto bar = [&](int i) { return smem_addr(&bars[i]); };
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  auto halo = [&](int i) { return base + uint32_t(i * C::kHaloBytes); };
  auto b_tile = [&](int s) { return base + uint32_t(2 * C::kHaloBytes + s * C::kBBytes); };
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3;
  if (tid == 0) {
    for (int i = 0; i < C::kStages + 2; ++i) mbar_init(bar(i), 1);
    mbar_init_fence();
  }
  __syncthreads();
  const int slices = p.chunks * p.taps;

  // Producer (thread 0). B: tile pt, its slice pq, the ring slot to fill next. Halo: the next
  // chunk of the stream, tile ht and chunk hc, and the buffer to fill.
  int pt = blockIdx.x, pq = 0, fill_slot = 0;
  auto produce = [&] {
    if (pq == slices) {
      pt += gridDim.x;
      pq = 0;
    }
    if (pt >= p.tiles) return;
    const HaloJob j = halo_job<BN>(p, pt);
    const int chunk = pq / p.taps, tap = pq % p.taps;
    const uint32_t bb = bar(fill_slot);
    mbar_expect_bytes(bb, C::kBBytes);
    if constexpr (kBwdData) {
      tma_load_2d(b_tile(fill_slot), &p.w, chunk * 64, (p.taps - 1 - tap) * p.w_rows + j.k0, bb);
    } else {
#pragma unroll
      for (int b = 0; b < BN / 64; ++b)
        tma_load_2d(b_tile(fill_slot) + uint32_t(b * 64 * kSliceBytes), &p.w, j.k0 + 64 * b,
                    tap * p.w_rows + chunk * 64, bb);
    }
    fill_slot = fill_slot + 1 == C::kStages ? 0 : fill_slot + 1;
    ++pq;
  };
  int ht = blockIdx.x, hc = 0, fill_halo = 0;
  auto produce_halo = [&] {
    if (ht >= p.tiles) return;
    const HaloJob j = halo_job<BN>(p, ht);
    const uint32_t hb = bar(C::kStages + fill_halo);
    mbar_expect_bytes(hb, p.halo_bytes);
    tma_load_4d(halo(fill_halo), &p.x, hc * 64, j.w0 - p.pad_w, j.h0 - p.pad_h, j.n, hb);
    fill_halo ^= 1;
    if (++hc == p.chunks) {
      hc = 0;
      ht += gridDim.x;
    }
  };
  if (tid == 0) {
    produce_halo();
    for (int i = 0; i < C::kAhead; ++i) produce();
  }

  // Consumers (everyone): phases of the next completion to wait for, one bit per barrier.
  uint32_t phases = 0;
  int slot = 0, use_halo = 0;
  uint32_t a_base = 0;
  float acc[BN / 2];
  for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const HaloJob j = halo_job<BN>(p, t);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    for (int q = 0; q < slices; ++q) {
      const int tap = q % p.taps;
      if (tap == 0) {  // a new chunk: its halo
        const int hb = C::kStages + use_halo;
        mbar_wait(bar(hb), (phases >> hb) & 1u);
        phases ^= 1u << hb;
        // Warpgroup wg's output rows 8 wg.. start 8 wg halo rows down.
        a_base = halo(use_halo) + uint32_t(wg * 8 * C::kPitch * kSliceBytes);
        use_halo ^= 1;
      }
      mbar_wait(bar(slot), (phases >> slot) & 1u);
      phases ^= 1u << slot;
      fence_proxy_async();  // the epilogue's staging writes before copies reuse the buffers
      __syncthreads();      // slice q landed; slice q - 2 retired in every warpgroup
      if (tid == 0) {
        produce();
        // The chunk's second slice: the previous chunk's slices have all retired, so its
        // buffer takes the next chunk's halo, a chunk (taps - 1 slices) ahead.
        if (tap == 1) produce_halo();
      }
      const int r = tap / p.S, s = tap % p.S;
      const uint32_t at = a_base + uint32_t((r * C::kPitch + s) * kSliceBytes);
      const uint32_t bt = b_tile(slot);
      slot = slot + 1 == C::kStages ? 0 : slot + 1;
      mma_slice<BN, kMode, false, !kBwdData>(
          acc,
          [&](int ks) {
            return smem_desc(at + ks * 32, 16, C::kPitch * kSliceBytes);
          },
          [&](int ks) { return operand_desc<kBwdData>(bt, ks); });
    }
    wgmma_wait<0>();
    __syncthreads();  // every warpgroup's last wgmmas retired
    unsigned char* stg =
        smem + (b_tile(staging_slot<C::kStages>(slot, wg)) - smem_addr(smem));
    const int h = j.h0 + wg * 8;
    const HaloRows<T> rows{static_cast<T*>(p.y) + j.k0,
                           (int64_t(j.n) * p.P + h) * p.Q + j.w0,
                           p.P - h, p.Q - j.w0, p.Q, p.K};
    stage_rows<T, BN>(acc, stg, wq, lane, tid & 127, wg, rows, BN);
  }
#endif
}

}  // namespace jaxdnn::conv::gemm
