// The tensor-core GEMM core shared by the GEMM-based conv algorithms (implicit_gemm,
// implicit_precomp_gemm, im2col_gemm and their split-K forms).
//
// Every conv direction is one GEMM per group, C(M, N) = A(M, Kd) * B(Kd, N), whose operands are
// gathered from the conv tensors by an operand *loader* (cuda_gemm_operands.cuh):
//   fwd        M = N*Z*P*Q output pixels, N = Kg,  Kd = T*R*S*Cg   A = x gathered, B = w
//   bwd_data   M = N*D*H*W input pixels,  N = Cg,  Kd = T*R*S*Kg   A = dy gathered, B = w^T
//   bwd_filter M = T*R*S*Cg filter rows,  N = Kg,  Kd = N*Z*P*Q    A = x^T gathered, B = dy
//
// Data path (Ampere-style, runs on sm_80+; cuda_gemm_wgmma.cuh is the Hopper form for 16-bit):
//   global --cp.async 16 B--> shared (STAGES-deep ring of (BM + BN) x 128-byte k-slices)
//          --ldmatrix--> registers --mma.sync--> float accumulators --epilogue--> global
// One k-slice is 128 bytes of the reduction: BK = 64 for 16-bit inputs, 32 for float32.
// A shared tile stores an operand either "k-major" (rows = M or N index, 128 contiguous bytes
// of k per row) or "mn-major" (rows = k, BM or BN contiguous elements per row), whichever
// matches the global layout, so every cp.async moves 16 contiguous bytes; ldmatrix (.trans
// for mn-major) then produces the same register fragments from either layout. 16-byte chunks
// are XOR-swizzled within each 128-byte line so the 8 row addresses of an ldmatrix hit 8
// different bank groups.
//
// Precision modes: bf16/f16 use mma m16n8k16 (f32 accumulate); float32 uses m16n8k8 TF32,
// either once (kTf32: 10-bit mantissa products, like XLA's default precision) or as the
// 3-pass split a*b ~ a_hi*b_hi + a_hi*b_lo + a_lo*b_hi (k3xTf32), which matches float32 FMA
// accuracy (relative error ~1e-6) at 3x the tensor-core work.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cc/common/cuda_async.h"
#include "cc/common/cuda_util.h"
#include "cc/conv/conv.h"

namespace jaxdnn::conv::gemm {

enum class Mode : int { kBf16 = 0, kF16 = 1, kTf32 = 2, k3xTf32 = 3 };

template <Mode M> struct ModeTraits;
template <> struct ModeTraits<Mode::kBf16> { using T = __nv_bfloat16; };
template <> struct ModeTraits<Mode::kF16> { using T = __half; };
template <> struct ModeTraits<Mode::kTf32> { using T = float; };
template <> struct ModeTraits<Mode::k3xTf32> { using T = float; };

constexpr int kSliceBytes = 128;  // bytes of the reduction per pipeline stage and row
constexpr int kChunk = 16;       // bytes per cp.async

// Elements of T per 16-byte chunk and per k-slice.
template <typename T>
struct Elems {
  static constexpr int kEpc = kChunk / int(sizeof(T));
  static constexpr int kBK = kSliceBytes / int(sizeof(T));
  static constexpr bool kTma = false;  // loaded by the copy engine (cuda_tma.cuh), wgmma only
};

// CTA tile (BM, BN) of C, warp tile (WM, WN), STAGES-deep pipeline; T the element type.
template <typename T, int BM_, int BN_, int WM_, int WN_, int STAGES_>
struct Tile {
  static constexpr bool kWgmma = false;
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int BK = Elems<T>::kBK;                    // reduction elements per stage
  static constexpr int kStep = 2 * Elems<T>::kEpc;            // k per mma (32 bytes)
  static constexpr int kMi = WM / 16, kNi = WN / 8;           // mma blocks per warp
  static constexpr int kStageBytes = (BM + BN) * kSliceBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile is whole 16x16 fragments");
};

// ---------------------------------------------------------------------------------------------
// Shared-memory tile geometry. A tile is ROWS rows of CPR 16-byte chunks.
// ---------------------------------------------------------------------------------------------

template <int ROWS, int CPR>
struct SmemTile {
  static constexpr int kRows = ROWS, kCpr = CPR;
  // Byte offset of chunk `c` of row `r`, XOR-swizzled inside each 128-byte line. Rows longer
  // than 128 bytes are stored as column blocks of 128 bytes ([CPR / 8][ROWS][128 bytes]): the
  // layout of Hopper's 128-byte-swizzled mn-major operands (cuda_gemm_wgmma.cuh), which
  // ldmatrix reads just as well.
  __device__ __forceinline__ static uint32_t offset(int r, int c) {
    if constexpr (CPR >= 8)
      return uint32_t((((c >> 3) * ROWS + r) * 8 + ((c & 7) ^ (r & 7))) * kChunk);
    int sw;
    if constexpr (CPR == 4) sw = c ^ ((r >> 1) & 3);
    else sw = c ^ ((r >> 2) & 1);
    return uint32_t((r * CPR + sw) * kChunk);
  }
};

// The chunks of a ROWS x CPR tile one thread copies: ids tid + i*THREADS. Because THREADS is a
// multiple of CPR, a thread always copies the same chunk column, in rows row0 + i*kRowStep.
template <int ROWS, int CPR, int THREADS>
struct ChunkMap {
  static_assert(THREADS % CPR == 0 && (ROWS * CPR) % THREADS == 0, "chunks spread evenly");
  static constexpr int kPerThread = ROWS * CPR / THREADS;
  static constexpr int kRowStep = THREADS / CPR;
  __device__ __forceinline__ static int row0(int tid) { return tid / CPR; }
  __device__ __forceinline__ static int col(int tid) { return tid % CPR; }
};

// k-major operand tile: rows = the M (or N) index, one 128-byte k-slice each.
template <int BMN> using KMajorTile = SmemTile<BMN, kSliceBytes / kChunk>;
// mn-major operand tile: rows = k, BMN contiguous elements each.
template <typename T, int BMN, int BK> using MnMajorTile = SmemTile<BK, BMN * int(sizeof(T)) / kChunk>;

// ---------------------------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------------------------

using cuda::cp_async16;
using cuda::cp_async_commit;
using cuda::cp_async_wait;
using cuda::smem_addr;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// d += a * b for one m16n8 block; a: 4 regs, b: 2 regs (fragment layouts of the PTX ISA).
template <Mode M>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (M == Mode::kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else if constexpr (M == Mode::kF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// ---------------------------------------------------------------------------------------------
// Fragments. frag16() reads a (16 mn, 32-byte k) block of an operand tile into 4 registers in
// the order (mn 0-7, k lo), (mn 8-15, k lo), (mn 0-7, k hi), (mn 8-15, k hi) where k lo/hi are
// the two 16-byte halves of the k range. That is the A fragment of one m16 mma, and the B
// fragments of two n8 mmas ({r0, r2} and {r1, r3}).
// ---------------------------------------------------------------------------------------------

template <typename T, typename TileT, bool kKMajor>
__device__ __forceinline__ void frag16(uint32_t (&r)[4], uint32_t tile, int mn0, int k_chunk0) {
  const int lane = threadIdx.x & 31;
  if constexpr (kKMajor) {
    const int i = lane >> 3, j = lane & 7;  // matrix i, its row j
    ldmatrix_x4(r, tile + TileT::offset(mn0 + (i & 1) * 8 + j, k_chunk0 + (i >> 1)));
  } else if constexpr (sizeof(T) == 2) {
    const int i = lane >> 3, j = lane & 7;
    constexpr int kEpc = kChunk / 2;
    ldmatrix_x4_trans(r, tile + TileT::offset(k_chunk0 * kEpc + (i >> 1) * 8 + j,
                                              (mn0 + (i & 1) * 8) / kEpc));
  } else {  // 32-bit mn-major: the transposing ldmatrix works on 16-bit halves, so scalar loads
    const int g = lane >> 2, t = lane & 3;
    const int k = k_chunk0 * 4 + t;
    auto at = [&](int mn, int kk) {
      uint32_t v;
      asm volatile("ld.shared.b32 %0, [%1];\n"
                   : "=r"(v)
                   : "r"(tile + TileT::offset(kk, mn >> 2) + (mn & 3) * 4));
      return v;
    };
    r[0] = at(mn0 + g, k);
    r[1] = at(mn0 + g + 8, k);
    r[2] = at(mn0 + g, k + 4);
    r[3] = at(mn0 + g + 8, k + 4);
  }
}

// All kMi x kNi mmas of one k step of a warp tile.
template <Mode kMode, typename C>
__device__ __forceinline__ void mma_block(float (&acc)[C::kMi][C::kNi][4],
                                          const uint32_t (&af)[C::kMi][4],
                                          const uint32_t (&bf)[C::kNi / 2][4]) {
#pragma unroll
  for (int i = 0; i < C::kMi; ++i)
#pragma unroll
    for (int j = 0; j < C::kNi; ++j) {
      const uint32_t b2[2] = {bf[j / 2][j & 1], bf[j / 2][(j & 1) + 2]};
      mma<kMode>(acc[i][j], af[i], b2);
    }
}

// 3xTF32: the three products of one k step are summed by the tensor core into a zeroed
// fragment, which is then added to the accumulator with an IEEE float add. Chaining the mmas
// straight into the accumulator instead loses accuracy on long reductions (the tensor core's
// float accumulation is not round-to-nearest): measured 2.5e-5 relative error over a
// 3600-long reduction, against 1e-5 required of float32.
template <typename C>
__device__ __forceinline__ void mma_block_3x(float (&acc)[C::kMi][C::kNi][4],
                                             const uint32_t (&ah)[C::kMi][4],
                                             const uint32_t (&al)[C::kMi][4],
                                             const uint32_t (&bh)[C::kNi / 2][4],
                                             const uint32_t (&bl)[C::kNi / 2][4]) {
#pragma unroll
  for (int i = 0; i < C::kMi; ++i)
#pragma unroll
    for (int j = 0; j < C::kNi; ++j) {
      const uint32_t bh2[2] = {bh[j / 2][j & 1], bh[j / 2][(j & 1) + 2]};
      const uint32_t bl2[2] = {bl[j / 2][j & 1], bl[j / 2][(j & 1) + 2]};
      float t[4] = {0.f, 0.f, 0.f, 0.f};
      mma<Mode::k3xTf32>(t, al[i], bh2);
      mma<Mode::k3xTf32>(t, ah[i], bl2);
      mma<Mode::k3xTf32>(t, ah[i], bh2);
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] += t[q];
    }
}

// hi <- tf32(x) in place; for 3xTF32 also lo <- tf32(x - hi).
template <Mode kMode, int R>
__device__ __forceinline__ void split_tf32(uint32_t (&hi)[R][4], uint32_t (&lo)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float x = __uint_as_float(hi[i][q]);
      hi[i][q] = to_tf32(x);
      if constexpr (kMode == Mode::k3xTf32) lo[i][q] = to_tf32(x - __uint_as_float(hi[i][q]));
    }
}

// ---------------------------------------------------------------------------------------------
// Epilogue: where C goes. kOut stores C (converted to the output dtype) at
// out[m * ldo + col0 + n] for group g's col0 = g * N (m through `rows` when mapped); kPartial
// stores float partial sums of split s at ws[((s * G + g) * M + m) * N + n] for a later ordered
// reduction; kAtomic adds them into ws[(g * M + m) * N + n] with atomicAdd (order-dependent
// rounding).
// ---------------------------------------------------------------------------------------------

enum class Store : int { kOut = 0, kPartial = 1, kAtomic = 2 };

struct Epilogue {
  Store store;
  void* out;           // kOut: the result tensor; otherwise the float workspace
  bool out_f32;        // kOut: result dtype is float32 (else the input dtype)
  int64_t ldo;         // kOut: row stride of the result, in elements
  int groups;
  ResultRows rows;     // kOut: row m goes to row rows.row(m) when mapped (wgmma kernels only)
  // The fused forward's epilogue (conv/epilogue.h), which the wgmma kernels' dense kOut stores
  // apply when y is set: y = act(C + bias + residual), C rounded to the result's dtype first,
  // and C itself to `out` too when out != y (the call keeps it for the backward).
  void* y = nullptr;
  const float* bias = nullptr;     // per result column g * N + n, or null
  const void* residual = nullptr;  // laid out like the result, or null
  int act = -1;                    // an activation.h code, or -1 for none
  float alpha = 0;
};

template <typename T>
__device__ __forceinline__ void store_pair(const Epilogue& e, int M, int N, int g, int split,
                                           int m, int n, float v0, float v1) {
  if (m >= M || n >= N) return;  // N is a multiple of 8 and n even, so n + 1 < N too
  switch (e.store) {
    case Store::kOut: {
      const int64_t at = m * e.ldo + int64_t(g) * N + n;
      if (e.out_f32) {
        *reinterpret_cast<float2*>(static_cast<float*>(e.out) + at) = make_float2(v0, v1);
      } else if constexpr (sizeof(T) == 2) {
        T* o = static_cast<T*>(e.out) + at;
        o[0] = cuda::from_acc<T>(v0);
        o[1] = cuda::from_acc<T>(v1);
      }
      break;
    }
    case Store::kPartial: {
      float* ws = static_cast<float*>(e.out) + ((int64_t(split) * e.groups + g) * M + m) * N + n;
      *reinterpret_cast<float2*>(ws) = make_float2(v0, v1);
      break;
    }
    case Store::kAtomic: {
      float* ws = static_cast<float*>(e.out) + (int64_t(g) * M + m) * N + n;
      atomicAdd(ws, v0);
      atomicAdd(ws + 1, v1);
      break;
    }
  }
}

// The A and B fragments of k step ks of a warp tile at (wm, wn).
template <typename T, typename C, typename AL, typename BL>
__device__ __forceinline__ void load_frags(uint32_t (&af)[C::kMi][4], uint32_t (&bf)[C::kNi / 2][4],
                                           uint32_t at, uint32_t bt, int wm, int wn, int ks) {
#pragma unroll
  for (int i = 0; i < C::kMi; ++i)
    frag16<T, typename AL::TileT, AL::kKMajor>(af[i], at, wm + i * 16, ks * 2);
#pragma unroll
  for (int j = 0; j < C::kNi / 2; ++j)
    frag16<T, typename BL::TileT, BL::kKMajor>(bf[j], bt, wn + j * 16, ks * 2);
}

// ---------------------------------------------------------------------------------------------
// The kernel. grid = (ceil(M / BM), ceil(N / BN), G * splits); split s of group g reduces
// k-slices [s * per_split, min(k_tiles, (s + 1) * per_split)).
// Loader contract (cuda_gemm_operands.cuh): `Loader::Params`; `Loader(params, mn0, g, kt0,
// tid)` positions the thread's chunks at k-slice kt0; `load(tile)` issues the cp.asyncs of the
// current slice into a shared tile; `next()` moves to the following slice.
// ---------------------------------------------------------------------------------------------

template <Mode kMode, typename TileCfg, typename ALoader, typename BLoader>
__global__ void __launch_bounds__(TileCfg::kThreads)
gemm_kernel(typename ALoader::Params ap, typename BLoader::Params bp, Epilogue epi, int M, int N,
            int k_tiles, int per_split) {
  using T = typename ModeTraits<kMode>::T;
  using C = TileCfg;
  using ATile = typename ALoader::TileT;
  using BTile = typename BLoader::TileT;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = smem_addr(smem);
  auto a_tile = [&](int s) { return base + uint32_t(s * C::kStageBytes); };
  auto b_tile = [&](int s) { return base + uint32_t(s * C::kStageBytes + C::BM * kSliceBytes); };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int splits = gridDim.z / epi.groups;
  const int g = blockIdx.z / splits, split = blockIdx.z % splits;
  const int m0 = blockIdx.x * C::BM, n0 = blockIdx.y * C::BN;
  const int kt0 = split * per_split;
  const int kt1 = min(k_tiles, kt0 + per_split);
  const int nk = max(kt1 - kt0, 0);

  ALoader a(ap, m0, g, kt0, tid);
  BLoader b(bp, n0, g, kt0, tid);

  // Prologue: fill STAGES - 1 slices.
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < nk) {
      a.load(a_tile(s));
      b.load(b_tile(s));
      a.next();
      b.next();
    }
    cp_async_commit();
  }

  float acc[C::kMi][C::kNi][4] = {};
  const int wm = (warp / C::kWarpsN) * C::WM, wn = (warp % C::kWarpsN) * C::WN;

  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<C::STAGES - 2>();
    __syncthreads();  // slice kt landed for everyone; slice kt-1's buffer is free
    const int fill = kt + C::STAGES - 1;
    if (fill < nk) {
      a.load(a_tile(fill % C::STAGES));
      b.load(b_tile(fill % C::STAGES));
      a.next();
      b.next();
    }
    cp_async_commit();

    // Fragments are double-buffered: step ks + 1's ldmatrix is issued before step ks's mmas,
    // so shared-memory latency overlaps tensor-core work (asm volatile keeps program order).
    const uint32_t at = a_tile(kt % C::STAGES), bt = b_tile(kt % C::STAGES);
    constexpr int kSteps = C::BK / C::kStep;
    uint32_t af[2][C::kMi][4], bf[2][C::kNi / 2][4];
    load_frags<T, C, ALoader, BLoader>(af[0], bf[0], at, bt, wm, wn, 0);
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      if (ks + 1 < kSteps)
        load_frags<T, C, ALoader, BLoader>(af[(ks + 1) & 1], bf[(ks + 1) & 1], at, bt, wm, wn,
                                           ks + 1);
      auto& a_ = af[ks & 1];
      auto& b_ = bf[ks & 1];
      if constexpr (kMode == Mode::kTf32 || kMode == Mode::k3xTf32) {
        // Round to TF32 once per fragment; for 3xTF32 keep the rounding error as a second term.
        uint32_t al[C::kMi][4], bl[C::kNi / 2][4];
        split_tf32<kMode>(a_, al);
        split_tf32<kMode>(b_, bl);
        if constexpr (kMode == Mode::k3xTf32) mma_block_3x<C>(acc, a_, al, b_, bl);
        else mma_block<kMode, C>(acc, a_, b_);
      } else {
        mma_block<kMode, C>(acc, a_, b_);
      }
    }
  }
  cp_async_wait<0>();

  // C fragment: c0,c1 at (row lane/4, cols 2*(lane%4) + {0,1}); c2,c3 eight rows below.
  const int r = lane >> 2, c = (lane & 3) * 2;
#pragma unroll
  for (int i = 0; i < C::kMi; ++i)
#pragma unroll
    for (int j = 0; j < C::kNi; ++j) {
      const int m = m0 + wm + i * 16 + r, n = n0 + wn + j * 8 + c;
      store_pair<T>(epi, M, N, g, split, m, n, acc[i][j][0], acc[i][j][1]);
      store_pair<T>(epi, M, N, g, split, m + 8, n, acc[i][j][2], acc[i][j][3]);
    }
}

}  // namespace jaxdnn::conv::gemm
