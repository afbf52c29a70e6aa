// Hopper warpgroup-MMA form of the GEMM core (cuda_gemm_core.cuh), for 16-bit inputs and for
// TF32 when both operands are k-major.
//
// Same operand loaders, same shared tiles, same epilogue as gemm_kernel; what changes is the
// math: instead of ldmatrix into registers and one mma.sync per 16x8x16 block, each warpgroup
// (4 consecutive warps, 128 threads) issues wgmma.mma_async m64nBNk16 (k8 for TF32: the same
// 32 bytes of k) reading both operands straight from shared memory through 64-bit matrix
// descriptors. The tensor core then works on a 64 x BN x 32-byte block per instruction
// (BN = 64 or 128), asynchronously: while it runs, the same threads issue the cp.async gathers
// of later k-slices. This removes the ldmatrix traffic and the register-file round trip that
// left the mma.sync kernel issue-bound (NOTES.md). TF32 operands go to the tensor core as
// stored, without the cvt.rna rounding that the mma.sync path applies to its fragments.
//
// Shared layouts. The core's tiles already use the 128-byte swizzle that wgmma understands:
//   k-major tile  rows of 128 bytes (64 elements of k), 16-byte chunk c of row r stored at
//                 chunk c ^ (r % 8); 8-row groups 1024 bytes apart (descriptor SBO)
//   mn-major tile blocks of 64 mn-elements: [BMN / 64][BK rows of k][128 bytes], same XOR;
//                 blocks BK * 128 bytes apart (LBO), 8-row groups of k 1024 bytes apart (SBO)
// Every tile starts on a 1024-byte boundary (the swizzle pattern repeats every 1024 bytes and
// the hardware applies it to absolute address bits). Stepping k by 16 elements moves the
// descriptor's start address by 32 bytes inside the rows (k-major) or by 16 rows (mn-major).
//
// Persistent CTAs, one continuous pipeline. The grid is as many CTAs as fit on the GPU; CTA b
// runs output tiles b, b + grid, ... Its k-slices, over all its tiles, form one stream
// q = 0, 1, 2, ... through a ring of kStages = 4 shared buffers of (BM + BN) x 128 bytes, with all
// threads both loading and computing:
//   slice q: wait for its cp.asyncs; fence them into the async proxy (wgmma reads shared
//   memory through it); barrier; issue the loads of slice q + 2 (the next tile's first
//   slices when this tile's are done) into the buffer of slice q - 2; issue slice q's wgmmas
//   and leave them in flight (wait_group 1), so slice q - 1's finish before the next barrier
//   releases its buffer. After a tile's last slice: drain, store, zero the accumulators.
// A B loader with kTma (TmaMn) is issued by thread 0 alone as TMA boxes completing on the
// slot's mbarrier, which every thread waits for next to its cp.async wait for A.
// So a tile's start-up latency and its epilogue overlap the neighbouring tiles' loads: with
// 9-36 slices per tile on ResNet's 3x3 layers (and 1-8 on the 1x1 ones) a CTA per tile would
// spend much of its life filling and draining the pipeline.
#pragma once

#include <new>

#include "cc/conv/cuda_epilogue.cuh"
#include "cc/conv/cuda_gemm_core.cuh"
#include "cc/conv/cuda_tma.cuh"

namespace jaxdnn::conv::gemm {

// CTA tile of the wgmma kernel: BM / 64 warpgroups, each owning 64 rows x all BN columns. A
// ring of 4 slices: 97 KB narrow (two CTAs per SM), 129 KB wide (one). Depths of 3, 4 and 6
// measured the same; a 3-slice wide tile (two CTAs per SM) won on one layer and lost on
// others (NOTES.md). T is 16-bit, or float read as TF32 (k-major operands only: wgmma has no
// transposed form for 32-bit inputs).
template <typename T, int BM_, int BN_>
struct WgTile {
  static constexpr bool kWgmma = true, kWs = false;
  static constexpr int BM = BM_, BN = BN_, kStages = 4;
  static constexpr int kThreads = 128 * (BM / 64);
  static constexpr int kLaunchThreads = kThreads;
  static constexpr int BK = Elems<T>::kBK;
  static constexpr int kStageBytes = (BM + BN) * kSliceBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment slack
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "wgmma path: 16-bit or TF32 inputs");
  static_assert(BM % 64 == 0 && (BN == 64 || BN == 128), "tile shape");
};

// CTA tile of the warp-specialised kernel (wgmma_ws_kernel): two producer warpgroups (the
// loaders' kThreads: one warp per scheduler could not issue the gathers fast enough) and
// BM / 64 consumer warpgroups of 64 x BN; a ring of 5 slices and a
// staging area of its own for the epilogue (float results: 64 x BN x 4 bytes per consumer),
// 225 KB wide, 153 KB narrow: one CTA per SM.
// 256 columns (both operands by TMA: kTmaOnly): one producer warpgroup (thread 0
// issues every copy), a ring of 4 slices of 48 KB, and the results staged 64 columns at a
// time (kStageCols): 225 KB. Per slice it reads 48 KB for 4.2 MFLOP where the 128-column tile
// reads 32 KB for 2.1: A is fetched from L2 once per 256 columns instead of twice.
template <typename T, int BM_, int BN_>
struct WsTile {
  static constexpr bool kWgmma = true, kWs = true;
  static constexpr int BM = BM_, BN = BN_;
  static constexpr bool kTmaOnly = BN == 256;
  static constexpr int kStages = kTmaOnly ? 4 : 5;
  static constexpr int kThreads = kTmaOnly ? 128 : 256;
  static constexpr int kLaunchThreads = kThreads + 128 * (BM / 64);
  static constexpr int BK = Elems<T>::kBK;
  static constexpr int kStageBytes = (BM + BN) * kSliceBytes;
  static constexpr int kStageCols = kTmaOnly ? 64 : BN;  // result columns per staging round
  static constexpr int kStagingBytes = BM * kStageCols * 4;
  static constexpr int kSmemBytes = kStages * kStageBytes + kStagingBytes + 1024;
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "wgmma path: 16-bit or TF32 inputs");
  static_assert(BM % 64 == 0 && (BN == 64 || BN == 128 || BN == 256), "tile shape");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
};

// Whether the wgmma kernel can take these operands: TF32 needs both k-major.
template <typename T, typename AL, typename BL>
constexpr bool kWgmmaOperands = sizeof(T) == 2 || (AL::kKMajor && BL::kKMajor);

__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) |
         (uint64_t(sbo >> 4) << 32) | (uint64_t(1) << 62);  // 1 = 128-byte swizzle
}

// Descriptor of k step ks (32 bytes: 16 elements of 16 bits, or 8 TF32) of an operand tile
// whose first row/block is `tile`; mn-major tiles are 16-bit only.
template <bool kKMajor>
__device__ __forceinline__ uint64_t operand_desc(uint32_t tile, int ks) {
  constexpr int BK = kSliceBytes / 2;
  if constexpr (kKMajor) return smem_desc(tile + ks * 32, 16, 1024);
  else return smem_desc(tile + ks * 16 * kSliceBytes, BK * kSliceBytes, 1024);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#define JD_WG_REGS32                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define JD_WG_REGS64                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define JD_WG_REGS128                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "  \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "  \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "     \
  "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "  \
  "%123, %124, %125, %126, %127}"
#define JD_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define JD_F16(i) JD_F4(i), JD_F4(i + 4), JD_F4(i + 8), JD_F4(i + 12)
#define JD_F64(i) JD_F16(i), JD_F16(i + 16), JD_F16(i + 32), JD_F16(i + 48)
// d += A * B for a 64 x N x 16 block; A, B in shared memory, transposed (mn-major) when TA/TB.
#define JD_WGMMA(N, NREG, TY, REGS, ...)                                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " REGS ", %" #NREG \
               ", %" JD_NEXT_##NREG ", p, 1, 1, %" JD_NEXT2_##NREG ", %" JD_NEXT3_##NREG ";\n}\n" \
               : __VA_ARGS__                                                                 \
               : "l"(da), "l"(db), "n"(int(kTA)), "n"(int(kTB)))
#define JD_NEXT_32 "33"
#define JD_NEXT2_32 "34"
#define JD_NEXT3_32 "35"
#define JD_NEXT_64 "65"
#define JD_NEXT2_64 "66"
#define JD_NEXT3_64 "67"
#define JD_NEXT_128 "129"
#define JD_NEXT2_128 "130"
#define JD_NEXT3_128 "131"

// d += A * B for a 64 x N x 8 block of TF32 (both operands k-major).
#define JD_WGMMA_TF32(N, NREG, REGS, ...)                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                   \
               "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 " REGS ", %" #NREG   \
               ", %" JD_NEXT_##NREG ", p, 1, 1;\n}\n"                                        \
               : __VA_ARGS__                                                                 \
               : "l"(da), "l"(db))

template <int BN, Mode kMode, bool kTA, bool kTB>
__device__ __forceinline__ void wgmma(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (kMode == Mode::kTf32) {
    static_assert(!kTA && !kTB, "TF32 wgmma reads k-major operands only");
    if constexpr (BN == 64) JD_WGMMA_TF32(64, 32, JD_WG_REGS32, JD_F16(0), JD_F16(16));
    else if constexpr (BN == 128) JD_WGMMA_TF32(128, 64, JD_WG_REGS64, JD_F16(0), JD_F16(16), JD_F16(32), JD_F16(48));
    else JD_WGMMA_TF32(256, 128, JD_WG_REGS128, JD_F64(0), JD_F64(64));
  } else if constexpr (BN == 64) {
    if constexpr (kMode == Mode::kF16) JD_WGMMA(64, 32, "f16", JD_WG_REGS32, JD_F16(0), JD_F16(16));
    else JD_WGMMA(64, 32, "bf16", JD_WG_REGS32, JD_F16(0), JD_F16(16));
  } else if constexpr (BN == 128) {
    if constexpr (kMode == Mode::kF16) JD_WGMMA(128, 64, "f16", JD_WG_REGS64, JD_F16(0), JD_F16(16), JD_F16(32), JD_F16(48));
    else JD_WGMMA(128, 64, "bf16", JD_WG_REGS64, JD_F16(0), JD_F16(16), JD_F16(32), JD_F16(48));
  } else {
    static_assert(BN == 256, "wgmma widths 64, 128, 256");
    if constexpr (kMode == Mode::kF16) JD_WGMMA(256, 128, "f16", JD_WG_REGS128, JD_F64(0), JD_F64(64));
    else JD_WGMMA(256, 128, "bf16", JD_WG_REGS128, JD_F64(0), JD_F64(64));
  }
}

#undef JD_WGMMA
#undef JD_WGMMA_TF32
#undef JD_F64
#undef JD_F16
#undef JD_F4
#undef JD_WG_REGS32
#undef JD_WG_REGS64
#undef JD_WG_REGS128
#undef JD_NEXT_32
#undef JD_NEXT2_32
#undef JD_NEXT3_32
#undef JD_NEXT_64
#undef JD_NEXT2_64
#undef JD_NEXT3_64
#undef JD_NEXT_128
#undef JD_NEXT2_128
#undef JD_NEXT3_128

// One output tile of the persistent schedule: tile t -> (n tile fastest, then m tile, then
// group x split), so the CTAs running together share rows of A in L2.
struct TileJob {
  int m0, n0, g, split, kt0, nk;
};

template <typename C>
__device__ __forceinline__ TileJob tile_job(int t, int tiles_m, int tiles_n, int splits,
                                            int k_tiles, int per_split) {
  TileJob j;
  const int nt = t % tiles_n, r = t / tiles_n;
  const int z = r / tiles_m;
  j.m0 = (r % tiles_m) * C::BM;
  j.n0 = nt * C::BN;
  j.g = z / splits;
  j.split = z % splits;
  j.kt0 = j.split * per_split;
  j.nk = max(min(k_tiles, j.kt0 + per_split) - j.kt0, 0);
  return j;
}

// Issues one k-slice of wgmmas (kSliceBytes of k: four 32-byte steps) with descriptors
// a_desc(ks), b_desc(ks), and leaves it in flight behind the previous slice's (wait_group 1):
// the barrier before the next slice's loads then finds the slice two back retired.
template <int BN, Mode kMode, bool kTA, bool kTB, typename ADesc, typename BDesc>
__device__ __forceinline__ void mma_slice(float (&acc)[BN / 2], ADesc a_desc, BDesc b_desc) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kSliceBytes / 32; ++ks)
    wgmma<BN, kMode, kTA, kTB>(acc, a_desc(ks), b_desc(ks));
  wgmma_commit();
  wgmma_wait<1>();
}

// After a tile, with `next` the ring slot of the next slice: the slot where warpgroup wg
// stages its results, one of the tile's last two slices' (idle until the loads issued after
// the next barrier).
template <int kStages>
__device__ __forceinline__ int staging_slot(int next, int wg) {
  const int last = next == 0 ? kStages - 1 : next - 1;
  return wg == 0 ? last : (last == 0 ? kStages - 1 : last - 1);
}

// Stores 16 bytes of result row r from column col on: where rows.at(r) points.
template <typename Rows>
__device__ __forceinline__ void put_chunk(const Rows& rows, int r, int col, uint4 v) {
  *reinterpret_cast<uint4*>(rows.at(r) + col) = v;
}

// Rows r < n of a dense block whose element (r, col) sits at at0 + r * ld + col in y, the
// residual and out, under the fused forward's epilogue (Epilogue::y): each chunk leaves as
// act(C + bias + residual), and as C to `out` when the call keeps it (out != y).
template <typename O>
struct FusedRows {
  O* y;
  O* out;  // or null
  const float* bias;  // or null
  const O* residual;  // or null
  int64_t at0, ld;
  int n, col0;  // rows; the result column of the block's column 0 (bias index)
  int act;
  float alpha;
  __device__ __forceinline__ bool ok(int r) const { return r < n; }
};

template <typename O>
__device__ __forceinline__ void put_chunk(const FusedRows<O>& f, int r, int col, uint4 v) {
  constexpr int kN = int(sizeof(uint4) / sizeof(O));
  const int64_t at = f.at0 + r * f.ld + col;
  if (f.out) *reinterpret_cast<uint4*>(f.out + at) = v;
  O c[kN], res[kN];
  memcpy(c, &v, sizeof(v));
  if (f.residual) {
    const uint4 rv = *reinterpret_cast<const uint4*>(f.residual + at);
    memcpy(res, &rv, sizeof(rv));
  }
  apply_epilogue(c, f.bias, f.col0 + col, f.residual ? res : nullptr, f.act, f.alpha);
  memcpy(&v, c, sizeof(v));
  *reinterpret_cast<uint4*>(f.y + at) = v;
}

// Epilogue of one warpgroup's 64 x BN accumulators. Stored straight from the fragments, a
// warp's store would touch 8 rows x 16 bytes; instead the fragments go through shared memory
// (row-major, 16-byte chunks XOR-swizzled by row: conflict-free) and leave as 16-byte stores
// that cover whole rows, so the 1x1 layers, whose time is mostly the output, write at full
// sectors. Partial sums (split-K) and float32 results stage as float; atomics go direct.
// Row r (< 64) of this warpgroup's block goes to rows.at(r) if rows.ok(r) (DenseRows, or the
// halo path's pixel rows).
template <typename O, int BN, typename Rows>
__device__ __forceinline__ void stage_rows(const float (&acc)[BN / 2], unsigned char* stg, int wq,
                                           int lane, int t, int wg, const Rows& rows, int cols) {
  constexpr int kRowBytes = BN * int(sizeof(O)), kCpr = kRowBytes / kChunk;
  constexpr int kEpc = kChunk / int(sizeof(O));
  auto at = [&](int r, int col) {  // byte offset of element col of row r
    const int b = col * int(sizeof(O));
    return r * kRowBytes + (((b / kChunk) ^ (r & 7)) * kChunk) + b % kChunk;
  };
#pragma unroll
  for (int i = 0; i < BN / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wq * 16 + (lane >> 2) + 8 * h, col = i * 8 + (lane & 3) * 2;
      const float v0 = acc[4 * i + 2 * h], v1 = acc[4 * i + 2 * h + 1];
      if constexpr (sizeof(O) == 4) {
        *reinterpret_cast<float2*>(stg + at(r, col)) = make_float2(v0, v1);
      } else {
        // The pair as one 4-byte store: as two 2-byte stores, ptxas serialised every wgmma of
        // the halo kernel (C7514, "non wgmma instructions reading accumulator registers").
        const O pair[2] = {cuda::from_acc<O>(v0), cuda::from_acc<O>(v1)};
        uint32_t packed;
        memcpy(&packed, pair, sizeof(packed));
        *reinterpret_cast<uint32_t*>(stg + at(r, col)) = packed;
      }
    }
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");  // this warpgroup's rows staged
  for (int e = t; e < 64 * kCpr; e += 128) {
    const int r = e / kCpr, ch = e % kCpr;
    if (rows.ok(r) && ch * kEpc < cols)
      put_chunk(rows, r, ch * kEpc,
                *reinterpret_cast<const uint4*>(stg + r * kRowBytes + ((ch ^ (r & 7)) * kChunk)));
  }
}

// Rows r < n of a dense block at `out`, `ld` elements apart.
template <typename O>
struct DenseRows {
  O* out;
  int64_t ld;
  int n;
  __device__ __forceinline__ bool ok(int r) const { return r < n; }
  __device__ __forceinline__ O* at(int r) const { return out + r * ld; }
};

// Rows r < n of a block whose row r is result row rows.row(m0 + r), `ld` elements apart, at
// column offset `col0` (ResultRows: a residue class's rows in dx).
template <typename O>
struct MappedRows {
  O* out;
  int64_t ld;
  int m0, n;
  const ResultRows& rows;
  __device__ __forceinline__ bool ok(int r) const { return r < n; }
  __device__ __forceinline__ O* at(int r) const { return out + int64_t(rows.row(m0 + r)) * ld; }
};

// kFuse: the fused forward's dense store (Epilogue::y set; its own kernel instantiation, so that
// the epilogue's registers never weigh on the plain kernels), else the store `epi` selects.
template <typename T, int BN, bool kFuse>
__device__ __forceinline__ void store_tile(const Epilogue& epi, const float (&acc)[BN / 2],
                                           unsigned char* stg, int M, int N, const TileJob& j,
                                           int row0, int wq, int lane, int t, int wg) {
  const int m0 = j.m0 + row0, rows = min(64, M - m0), cols = N - j.n0;
  if constexpr (kFuse) {
    const int64_t at = int64_t(m0) * epi.ldo + int64_t(j.g) * N + j.n0;
    const int col0 = j.g * N + j.n0;
    if (epi.out_f32)
      stage_rows<float, BN>(acc, stg, wq, lane, t, wg,
                            FusedRows<float>{static_cast<float*>(epi.y),
                                             epi.out == epi.y ? nullptr
                                                              : static_cast<float*>(epi.out),
                                             epi.bias, static_cast<const float*>(epi.residual),
                                             at, epi.ldo, rows, col0, epi.act, epi.alpha},
                            cols);
    else
      stage_rows<T, BN>(acc, stg, wq, lane, t, wg,
                        FusedRows<T>{static_cast<T*>(epi.y),
                                     epi.out == epi.y ? nullptr : static_cast<T*>(epi.out),
                                     epi.bias, static_cast<const T*>(epi.residual), at, epi.ldo,
                                     rows, col0, epi.act, epi.alpha},
                        cols);
  } else if (epi.store == Store::kAtomic) {
    // Fragment layout of m64nN: warp wq holds rows 16 wq.. 16 wq + 15; per n8 block i, d[4i],
    // d[4i+1] at (row lane / 4, cols 2 (lane % 4) + {0, 1}), d[4i+2], d[4i+3] 8 rows below.
    const int m = m0 + wq * 16 + (lane >> 2), c = (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
      const int n = j.n0 + i * 8 + c;
      store_pair<T>(epi, M, N, j.g, j.split, m, n, acc[4 * i], acc[4 * i + 1]);
      store_pair<T>(epi, M, N, j.g, j.split, m + 8, n, acc[4 * i + 2], acc[4 * i + 3]);
    }
  } else if (epi.store == Store::kPartial) {
    float* ws = static_cast<float*>(epi.out) +
                ((int64_t(j.split) * epi.groups + j.g) * M + m0) * N + j.n0;
    stage_rows<float, BN>(acc, stg, wq, lane, t, wg, DenseRows<float>{ws, N, rows}, cols);
  } else if (epi.rows.mapped()) {
    const int64_t col0 = int64_t(j.g) * N + j.n0;
    if (epi.out_f32)
      stage_rows<float, BN>(acc, stg, wq, lane, t, wg,
                            MappedRows<float>{static_cast<float*>(epi.out) + col0, epi.ldo, m0,
                                              rows, epi.rows},
                            cols);
    else
      stage_rows<T, BN>(acc, stg, wq, lane, t, wg,
                        MappedRows<T>{static_cast<T*>(epi.out) + col0, epi.ldo, m0, rows,
                                      epi.rows},
                        cols);
  } else {
    const int64_t at = int64_t(m0) * epi.ldo + int64_t(j.g) * N + j.n0;
    if (epi.out_f32)
      stage_rows<float, BN>(acc, stg, wq, lane, t, wg,
                            DenseRows<float>{static_cast<float*>(epi.out) + at, epi.ldo, rows},
                            cols);
    else
      stage_rows<T, BN>(acc, stg, wq, lane, t, wg,
                        DenseRows<T>{static_cast<T*>(epi.out) + at, epi.ldo, rows}, cols);
  }
}

// store_tile over blocks of BC columns (the staging area holds BC columns of the warpgroup's
// 64 rows): block cb's fragments are acc[cb * BC / 2 ..], by m64nN's layout (n8 block i in
// acc[4i .. 4i + 3]).
template <typename T, int BN, int BC, bool kFuse>
__device__ __forceinline__ void store_tile_blocks(const Epilogue& epi, const float (&acc)[BN / 2],
                                                  unsigned char* stg, int M, int N, TileJob j,
                                                  int row0, int wq, int lane, int t, int wg) {
#pragma unroll
  for (int cb = 0; cb < BN / BC; ++cb) {
    if (cb > 0)  // the previous block's staged rows have been read back
      asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
    store_tile<T, BC, kFuse>(epi,
                             *reinterpret_cast<const float(*)[BC / 2]>(&acc[cb * (BC / 2)]),
                             stg, M, N, j, row0, wq, lane, t, wg);
    j.n0 += BC;
  }
}

// Whether B is a TMA loader (then its arrive.expect_tx completes a slot's phase); a TMA A
// rides on that arrival, so it needs a TMA B.
template <typename AL, typename BL>
constexpr bool tma_b_loader() {
  static_assert(!AL::kTma || BL::kTma, "a TMA A rides on B's barrier arrival");
  return BL::kTma;
}

// Issues one slice's loads into the tiles at `at`, `bt` and moves both loaders on: cp.async
// loaders by all their threads, TMA loaders by thread 0 onto `bar` (a TMA A first: B's
// arrival is the one that can complete the phase).
template <typename AL, typename BL>
__device__ __forceinline__ void load_slice(AL& a, BL& b, uint32_t at, uint32_t bt, uint32_t bar,
                                           int tid) {
  if constexpr (AL::kTma) {
    if (tid == 0) a.load(at, bar);
  } else {
    a.load(at);
  }
  if constexpr (BL::kTma) {
    if (tid == 0) b.load(bt, bar);
  } else {
    b.load(bt);
  }
  a.next();
  b.next();
}

// Loader contract as gemm_kernel (cuda_gemm_core.cuh); `splits` ranges of `per_split` slices
// per group.
template <Mode kMode, typename C, typename ALoader, typename BLoader, bool kFuse>
__global__ void __launch_bounds__(C::kThreads, 2)
wgmma_kernel(const __grid_constant__ typename ALoader::Params ap,
             const __grid_constant__ typename BLoader::Params bp, Epilogue epi, int M, int N,
             int k_tiles, int per_split, int splits) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename ModeTraits<kMode>::T;
  constexpr bool kTmaB = tma_b_loader<ALoader, BLoader>();
  extern __shared__ unsigned char smem[];
  // B (and A) through TMA: one barrier per ring slot, completed by the slot's copy bytes; the
  // k-th use of slot s completes phase k % 2 (bit s of `phases` is the next one to wait for).
  __shared__ alignas(8) uint64_t bars[C::kStages];
  auto bar = [&](int s) { return smem_addr(&bars[s]); };
  uint32_t phases = 0;
  if constexpr (kTmaB) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < C::kStages; ++s) mbar_init(bar(s), 1);
      mbar_init_fence();
    }
    __syncthreads();
  }
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  auto a_tile = [&](int s) { return base + uint32_t(s * C::kStageBytes); };
  auto b_tile = [&](int s) { return base + uint32_t(s * C::kStageBytes + C::BM * kSliceBytes); };

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid >> 7, wq = (tid >> 5) & 3;  // warpgroup, warp within it
  const int tiles_m = (M + C::BM - 1) / C::BM, tiles_n = (N + C::BN - 1) / C::BN;
  const int tiles = tiles_m * tiles_n * epi.groups * splits;
  auto job = [&](int t) { return tile_job<C>(t, tiles_m, tiles_n, splits, k_tiles, per_split); };

  // Producer cursor: tile pt, its slice pk; the loaders sit at that slice.
  int pt = blockIdx.x, pk = 0;
  TileJob pj = job(pt);
  ALoader a(ap, pj.m0, pj.g, pj.kt0, tid);
  BLoader b(bp, pj.n0, pj.g, pj.kt0, tid);
  int fill_slot = 0;
  // Issues the loads of the next slice of the stream (or nothing past its end) as one group.
  auto produce = [&] {
    while (pt < tiles && pk == pj.nk) {
      pt += gridDim.x;
      if (pt >= tiles) break;
      pj = job(pt);
      pk = 0;
      new (&a) ALoader(ap, pj.m0, pj.g, pj.kt0, tid);
      new (&b) BLoader(bp, pj.n0, pj.g, pj.kt0, tid);
    }
    if (pt < tiles) {
      load_slice(a, b, a_tile(fill_slot), b_tile(fill_slot), bar(fill_slot), tid);
      ++pk;
      fill_slot = fill_slot + 1 == C::kStages ? 0 : fill_slot + 1;
    }
    cp_async_commit();
  };

  constexpr int kAhead = C::kStages - 2;  // slices loading while one computes, one drains
  for (int s = 0; s < kAhead; ++s) produce();

  // Warpgroup wg's 64 rows of A: rows 64 wg.. of a k-major tile, block wg of an mn-major one;
  // both start 64 * 128 bytes further per warpgroup.
  const uint32_t a_wg = uint32_t(wg * 64 * kSliceBytes);
  float acc[C::BN / 2];
  int slot = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const TileJob j = job(t);
#pragma unroll
    for (int i = 0; i < C::BN / 2; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < j.nk; ++kt) {
      cp_async_wait<kAhead - 1>();
      if constexpr (kTmaB) {
        mbar_wait(bar(slot), (phases >> slot) & 1u);
        phases ^= 1u << slot;
      }
      fence_proxy_async();
      __syncthreads();  // slice landed for all; the slice two back retired in every warpgroup
      produce();
      const uint32_t at = a_tile(slot) + a_wg, bt = b_tile(slot);
      slot = slot + 1 == C::kStages ? 0 : slot + 1;
      mma_slice<C::BN, kMode, !ALoader::kKMajor, !BLoader::kKMajor>(
          acc, [&](int ks) { return operand_desc<ALoader::kKMajor>(at, ks); },
          [&](int ks) { return operand_desc<BLoader::kKMajor>(bt, ks); });
    }
    wgmma_wait<0>();
    __syncthreads();  // every warpgroup's last wgmmas retired
    const int stage = staging_slot<C::kStages>(slot, wg);
    unsigned char* stg = smem + (a_tile(stage) - smem_addr(smem));
    store_tile<T, C::BN, kFuse>(epi, acc, stg, M, N, j, wg * 64, wq, lane, tid & 127, wg);
  }
  cp_async_wait<0>();
#endif
}

// The warp-specialised form of wgmma_kernel (same loaders, tiles, descriptors and epilogue).
// In wgmma_kernel every thread both gathers and issues wgmmas, two warps per scheduler: ncu on
// ResNet's l2 3x3 forward shows ~270 issued instructions per warp and k-slice (table lookups,
// addresses, cp.asyncs, barriers) at ~4.9 cycles each, 1384 cycles per slice against 512 of
// tensor work, and issuing a slice's wgmmas before its loads made it slower (the wgmma issue
// blocks while the tensor pipe is busy, delaying the loads). Here the roles are split:
//   producers (warpgroups 0 and 1, the loaders' 256 threads): for each slice q of the CTA's stream,
//     wait until its ring slot is empty (the consumers released slice q - kStages), issue its
//     cp.asyncs (and thread 0 its TMA boxes on full[slot]); once the cp.asyncs of slice q - 2
//     have landed, fence them into the async proxy and arrive on that slice's full barrier.
//   consumers (the next BM / 64 warpgroups, 64 rows each): wait for full[slot], issue the slice's
//     wgmmas, wait for the previous slice's (wait_group 1) and release its slot (one arrival
//     per warp on empty[slot]); after a tile, drain and store through their own staging rows.
// So the loads of later slices (and tiles) run while the consumers issue nothing but wgmmas
// and barrier waits, and a tile's epilogue overlaps the next tile's loads.
template <Mode kMode, typename C, typename ALoader, typename BLoader, bool kFuse>
__global__ void __launch_bounds__(C::kLaunchThreads, 1)
wgmma_ws_kernel(const __grid_constant__ typename ALoader::Params ap,
                const __grid_constant__ typename BLoader::Params bp, Epilogue epi, int M, int N,
                int k_tiles, int per_split, int splits) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename ModeTraits<kMode>::T;
  constexpr bool kTmaB = tma_b_loader<ALoader, BLoader>();
  // Both operands by TMA: thread 0 alone produces, and B's arrive.expect_tx is the only
  // arrival on a full barrier.
  constexpr bool kAllTma = ALoader::kTma && kTmaB;
  static_assert(kAllTma || !C::kTmaOnly, "one producer warpgroup issues TMA copies only");
  constexpr int S = C::kStages, kLag = 2;  // slices whose cp.asyncs may still be in flight
  static_assert(kLag <= S - 2, "a consumer releases slice q once slice q + 1 is full");
  extern __shared__ unsigned char smem[];
  __shared__ alignas(8) uint64_t full[S], empty[S];
  auto full_bar = [&](int s) { return smem_addr(&full[s]); };
  auto empty_bar = [&](int s) { return smem_addr(&empty[s]); };
  const int tid = threadIdx.x, wg = tid >> 7;
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full_bar(s), kAllTma ? 1 : C::kThreads + (kTmaB ? 1 : 0));  // + expect_tx
      mbar_init(empty_bar(s), 4 * (C::BM / 64));              // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();
  const uint32_t base = (smem_addr(smem) + 1023u) & ~1023u;
  auto a_tile = [&](int s) { return base + uint32_t(s * C::kStageBytes); };
  auto b_tile = [&](int s) { return base + uint32_t(s * C::kStageBytes + C::BM * kSliceBytes); };
  const int tiles_m = (M + C::BM - 1) / C::BM, tiles_n = (N + C::BN - 1) / C::BN;
  const int tiles = tiles_m * tiles_n * epi.groups * splits;
  auto job = [&](int t) { return tile_job<C>(t, tiles_m, tiles_n, splits, k_tiles, per_split); };

  constexpr int kProducerWgs = C::kThreads / 128;
  if (wg < kProducerWgs) {  // producers; the loaders index their chunks by threadIdx.x
    // One producer warpgroup beside 64 x 256 accumulators: it gives its registers to the
    // consumers (40 + 2 x 232 per lane of the 3 warpgroups: 64512 of 65536).
    if constexpr (C::kTmaOnly) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (kAllTma && tid != 0) return;
    int q = 0;    // slices issued so far
    auto signal = [&](int done) {  // slice `done`'s cp.asyncs have landed (this thread's)
      fence_proxy_async();
      mbar_arrive(full_bar(done % S));
    };
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileJob j = job(t);
      ALoader a(ap, j.m0, j.g, j.kt0, tid);
      BLoader b(bp, j.n0, j.g, j.kt0, tid);
      for (int kt = 0; kt < j.nk; ++kt, ++q) {
        const int s = q % S;
        if (q >= S) mbar_wait(empty_bar(s), (q / S - 1) & 1);
        load_slice(a, b, a_tile(s), b_tile(s), full_bar(s), tid);
        if constexpr (!kAllTma) {
          cp_async_commit();
          if (q >= kLag) {
            cp_async_wait<kLag>();
            signal(q - kLag);
          }
        }
      }
    }
    if constexpr (!kAllTma) {
      cp_async_wait<0>();
      for (int done = q > kLag ? q - kLag : 0; done < q; ++done) signal(done);
    }
  } else {  // consumer warpgroup cw: rows 64 cw.. of each tile
    if constexpr (C::kTmaOnly) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int cw = wg - kProducerWgs, ct = tid & 127, lane = tid & 31, wq = ct >> 5;
    const uint32_t a_wg = uint32_t(cw * 64 * kSliceBytes);
    unsigned char* stg =
        smem + (base - smem_addr(smem)) + S * C::kStageBytes + cw * 64 * C::kStageCols * 4;
    float acc[C::BN / 2];
    int q = 0;  // slices consumed so far
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileJob j = job(t);
#pragma unroll
      for (int i = 0; i < C::BN / 2; ++i) acc[i] = 0.f;
      for (int kt = 0; kt < j.nk; ++kt, ++q) {
        const int s = q % S;
        mbar_wait(full_bar(s), (q / S) & 1);
        const uint32_t at = a_tile(s) + a_wg, bt = b_tile(s);
        mma_slice<C::BN, kMode, !ALoader::kKMajor, !BLoader::kKMajor>(
            acc, [&](int ks) { return operand_desc<ALoader::kKMajor>(at, ks); },
            [&](int ks) { return operand_desc<BLoader::kKMajor>(bt, ks); });
        if (kt > 0 && lane == 0) mbar_arrive(empty_bar((q - 1) % S));  // slice q - 1 retired
      }
      wgmma_wait<0>();
      if (j.nk > 0 && lane == 0) mbar_arrive(empty_bar((q - 1) % S));
      store_tile_blocks<T, C::BN, C::kStageCols, kFuse>(epi, acc, stg, M, N, j, cw * 64, wq,
                                                        lane, ct, cw);
      // The staging rows are read back by other threads of the warpgroup: all done before the
      // next tile's fragments overwrite them.
      asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cw) : "memory");
    }
  }
#endif
}

}  // namespace jaxdnn::conv::gemm
