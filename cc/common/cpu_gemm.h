// Cache-blocked, packed GEMM for the CPU kernels:  C (m, n) = A (m, k) . B (k, n), or C += A . B.
//
// A and B are strided views (Mat), so row-major matrices with leading dimensions and their
// transposes are only strides. float16/bfloat16 sources are converted to float while packing.
// C is row-major T (float or double) with leading dimension ldc.
//
// Blocking (BLIS-style, for one core; numbers for float on AVX-512, see blocking()):
//   k is cut into balanced blocks of kc <= 256 (k_blocks). B is packed once (it can be shared by
//   every thread) block by block into (kc, NR) strips, zero-padded in n:
//       packed B = [k block][n strip] (kc, NR)            a (kc, nc) panel is 512 KB: L2
//   gemm_block() multiplies one k block: for each MR-row strip of A it packs the (MR, kc)
//   strip k-major (14 KB: L1) and sweeps it across the B panel one (MR, NR) = (14, 32)
//   register tile at a time. The microkernel holds the tile in 28 zmm accumulators; per k it
//   loads 2 vectors of B and broadcasts 14 elements of A: 28 FMAs for 184 bytes from L1/L2.
//
// Every element of C is a sum over k in a fixed order (k blocks in order, k in order within a
// block, each block's partial sum added to C), whatever the row chunking, tile position or
// thread count, so results are bitwise reproducible.
//
// The microkernel, the A packing and the 16-bit conversions are compiled for AVX-512, AVX2+FMA
// and baseline x86-64 (cpu_isa.h). Every function below that depends on the instruction set takes
// it as its first parameter: kGeneric, kAvx2 or kAvx512, one the CPU supports (best_isa()), the
// same for every call that works on one GEMM (the blocking and the packed layouts differ).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cc/common/cpu_isa.h"
#include "cc/common/dtype.h"

namespace jaxdnn::gemm {

// A read-only matrix view: element (i, j) is data[i * rs + j * cs].
template <typename Src>
struct Mat {
  const Src* data = nullptr;
  int64_t rs = 0, cs = 1;
  Mat sub(int64_t i, int64_t j) const { return {data + i * rs + j * cs, rs, cs}; }
};

// Row-major (m, n) with leading dimension ld, and the transpose of a row-major (n, m).
template <typename Src>
Mat<Src> row_major(const Src* p, int64_t ld) { return {p, ld, 1}; }
template <typename Src>
Mat<Src> transposed(const Src* p, int64_t ld) { return {p, 1, ld}; }

// The best instruction set this CPU supports (detected once; never kAuto).
CpuIsa best_isa();

// What `isa` needs of the CPU, in words.
const char* isa_requirements(CpuIsa isa);

// dst[i] = float(src[i]) for i < n, with the vector conversions of `isa` where it has them.
void to_float(CpuIsa isa, const f16_t* src, int64_t n, float* dst);
void to_float(CpuIsa isa, const bf16_t* src, int64_t n, float* dst);

// dst[i] = src[i] for i < n, converting 16-bit sources to float.
template <typename T, typename Src>
inline void convert(CpuIsa isa, const Src* src, int64_t n, T* dst) {
  if constexpr (!std::is_same_v<Src, T>) {
    to_float(isa, src, n, dst);
  } else if (n >= 16) {  // a library call only pays off for long runs
    std::memcpy(dst, src, size_t(n) * sizeof(T));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
  }
}

// Register tile and cache blocking of the microkernel of `isa` for T.
struct Blocking {
  int mr, nr;      // register tile of C
  int64_t kc_max;  // longest k block
  int64_t nc;      // widest B panel (a multiple of nr)
};
template <typename T>
const Blocking& blocking(CpuIsa isa);

// The k blocks: `count` blocks of `size` (the last one shorter), the same for every call with
// the same k and isa, so every caller that cuts k must use this.
struct KBlocks {
  int64_t count, size;
  int64_t begin(int64_t b) const { return b * size; }
  int64_t len(int64_t b, int64_t k) const { return std::min(size, k - b * size); }
};
template <typename T>
KBlocks k_blocks(CpuIsa isa, int64_t k);

// Packed B of shape (k, n): elements, and where the panel of (k block b, columns from j) is.
template <typename T>
int64_t packed_b_elems(CpuIsa isa, int64_t k, int64_t n);
template <typename T>
const T* packed_b_panel(CpuIsa isa, const T* packed, int64_t k, int64_t n, int64_t b, int64_t j);

// Packs n-strips [s0, s1) of B (strip s = columns [s*NR, s*NR + NR)) for every k block into
// `packed` (packed_b_elems(isa, k, n) elements). Strips are independent, so threads may pack
// different strips of one matrix at once.
template <typename T, typename Src>
void pack_b(CpuIsa isa, Mat<Src> b, int64_t k, int64_t n, int64_t s0, int64_t s1, T* packed);
inline int64_t b_strips(int64_t n, const Blocking& blk) { return (n + blk.nr - 1) / blk.nr; }

// One k block, single-threaded: C (m, n) (+)= A (m, kc) . B_panel (kc, n), where B_panel is a
// packed panel (packed_b_panel) with n <= nc. `accumulate` false overwrites C.
template <typename T, typename Src>
void gemm_block(CpuIsa isa, int64_t m, int64_t n, int64_t kc, Mat<Src> a, const T* b_panel, T* c,
                int64_t ldc, bool accumulate);

// Single-threaded C (m, nc) (+)= A (m, k) . B[:, j0 : j0 + nc], one panel of the packed B
// (k, n): j0 a multiple of blocking(isa).nr, nc <= blocking(isa).nc. A is supplied one k block at a
// time by a_block(k0, kc) -> Mat<Src> viewing columns [k0, k0 + kc) of A with (0, 0) at
// (0, k0), so a caller can build A block by block (im2col) instead of holding all of it.
// With k = 0 and accumulate false, C is zeroed.
template <typename T, typename Src, typename ABlock>
void gemm_panel(CpuIsa isa, int64_t m, int64_t n, int64_t k, int64_t j0, int64_t nc,
                ABlock&& a_block, const T* b_packed, T* c, int64_t ldc, bool accumulate) {
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + nc, T(0));
    return;
  }
  const KBlocks kb = k_blocks<T>(isa, k);
  for (int64_t b = 0; b < kb.count; ++b) {
    const Mat<Src> a = a_block(kb.begin(b), kb.len(b, k));
    gemm_block<T, Src>(isa, m, nc, kb.len(b, k), a, packed_b_panel(isa, b_packed, k, n, b, j0), c,
                       ldc, accumulate || b > 0);
  }
}

// Single-threaded C (m, n) (+)= A (m, k) . B with B packed: gemm_panel over every panel.
template <typename T, typename Src, typename ABlock>
void gemm_packed(CpuIsa isa, int64_t m, int64_t n, int64_t k, ABlock&& a_block,
                 const T* b_packed, T* c, int64_t ldc, bool accumulate) {
  const int64_t nc = blocking<T>(isa).nc;
  for (int64_t j0 = 0; j0 < n; j0 += nc)
    gemm_panel<T, Src>(isa, m, n, k, j0, std::min(nc, n - j0), a_block, b_packed, c + j0, ldc,
                       accumulate);
}

}  // namespace jaxdnn::gemm
