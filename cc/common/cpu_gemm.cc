// The GEMM of cpu_gemm.h: microkernels, packing, and what the CPU supports.
//
// The microkernel and A packing are written once with GCC vector extensions (a vector of W
// elements of T) and instantiated three times inside functions compiled for AVX-512, AVX2+FMA
// and baseline x86-64 (target attributes); the vector code takes the instruction set of the
// function it is inlined into. Each call names the instruction set it runs (its caller's
// choice, e.g. an im2col_gemm variant); __builtin_cpu_supports says which ones this CPU has.

#include "cc/common/cpu_gemm.h"

#include <immintrin.h>

#include <cstring>
#include <type_traits>

namespace jaxdnn::gemm {
namespace {

// Register tile (MR, NV vectors of W) and cache blocking per instruction set and type.
//   AVX-512 (32 zmm): float (14, 32), double (14, 16): 28 accumulators, 2 B vectors, 1
//     broadcast. kc * NR * sizeof(T) = 32 KB of B streamed per tile; (kc, nc) panel 512 KB.
//   AVX2 (16 ymm): (6, 2 vectors): 12 accumulators.   Generic (16 xmm): (4, 2 vectors).
template <CpuIsa I, typename T> struct Tile;
template <> struct Tile<CpuIsa::kAvx512, float> {
  static constexpr int W = 16, MR = 14, NV = 2, KC = 256, NC = 512;
};
template <> struct Tile<CpuIsa::kAvx512, double> {
  static constexpr int W = 8, MR = 14, NV = 2, KC = 256, NC = 256;
};
template <> struct Tile<CpuIsa::kAvx2, float> {
  static constexpr int W = 8, MR = 6, NV = 2, KC = 256, NC = 512;
};
template <> struct Tile<CpuIsa::kAvx2, double> {
  static constexpr int W = 4, MR = 6, NV = 2, KC = 256, NC = 256;
};
template <> struct Tile<CpuIsa::kGeneric, float> {
  static constexpr int W = 4, MR = 4, NV = 2, KC = 256, NC = 512;
};
template <> struct Tile<CpuIsa::kGeneric, double> {
  static constexpr int W = 2, MR = 4, NV = 2, KC = 256, NC = 256;
};

// Largest packed A strip and C tile over all instruction sets (stack buffers of gemm_block).
constexpr int64_t kMaxApackBytes = 14 * 256 * 8;
constexpr int64_t kMaxTileBytes = 14 * 32 * 4;

// C (MR, NR) (+)= A (MR, kc) . B_strip (kc, NR), NR = NV * W. B is packed k-major; A is read
// in place with strides (element (i, k) at a[i * ars + k * acs]): a packed strip (1, MR), the
// rows of a row-major matrix (lda, 1) or the columns of a transposed one (1, ld). The tile
// lives in MR * NV vector registers; per k: NV loads of B and MR broadcasts of A.
template <typename T, int W, int MR, int NV>
[[gnu::always_inline]] inline void kernel_body(int64_t kc, const T* __restrict a, int64_t ars,
                                               int64_t acs, const T* __restrict b,
                                               T* __restrict c, int64_t ldc, bool accumulate) {
  constexpr int NR = W * NV;
  typedef T V __attribute__((vector_size(sizeof(T) * W)));
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  for (int64_t k = 0; k < kc; ++k, a += acs, b += NR) {
    V bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) std::memcpy(&bv[j], b + j * W, sizeof(V));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V av = a[i * ars] - V{};  // broadcast (x - 0 is x for every x: folds away)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      T* cp = c + i * ldc + j * W;
      V out = acc[i][j];
      if (accumulate) {
        V old;
        std::memcpy(&old, cp, sizeof(V));
        out += old;
      }
      std::memcpy(cp, &out, sizeof(V));
    }
}

// Packs rows [0, mr) of A (mr, kc) k-major into dst (kc, MR), zero rows from mr to MR.
template <CpuIsa I, int MR, typename Src, typename T>
[[gnu::always_inline]] inline void pack_a_body(Mat<Src> a, int64_t mr, int64_t kc,
                                               T* __restrict dst) {
  if (a.rs == 1) {  // columns of A contiguous: a run of mr per k
    for (int64_t k = 0; k < kc; ++k) {
      convert(I, a.data + k * a.cs, mr, dst + k * MR);
      for (int64_t i = mr; i < MR; ++i) dst[k * MR + i] = T(0);
    }
    return;
  }
  if (mr == MR && a.cs == 1) {  // rows contiguous, full strip: a transpose
    for (int64_t k = 0; k < kc; ++k)
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) dst[k * MR + i] = T(load_acc(a.data[i * a.rs + k]));
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    for (int64_t i = 0; i < mr; ++i) dst[k * MR + i] = T(load_acc(a.data[i * a.rs + k * a.cs]));
    for (int64_t i = mr; i < MR; ++i) dst[k * MR + i] = T(0);
  }
}

#define JAXDNN_TARGET_AVX512 "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,bmi,bmi2,f16c"
#define JAXDNN_TARGET_AVX2 "avx2,fma,bmi,bmi2,f16c"

template <typename T>
[[gnu::target(JAXDNN_TARGET_AVX512)]] void kernel_avx512(int64_t kc, const T* a, int64_t ars,
                                                          int64_t acs, const T* b, T* c,
                                                          int64_t ldc, bool accumulate) {
  using K = Tile<CpuIsa::kAvx512, T>;
  kernel_body<T, K::W, K::MR, K::NV>(kc, a, ars, acs, b, c, ldc, accumulate);
}
template <typename T>
[[gnu::target(JAXDNN_TARGET_AVX2)]] void kernel_avx2(int64_t kc, const T* a, int64_t ars,
                                                      int64_t acs, const T* b, T* c, int64_t ldc,
                                                      bool accumulate) {
  using K = Tile<CpuIsa::kAvx2, T>;
  kernel_body<T, K::W, K::MR, K::NV>(kc, a, ars, acs, b, c, ldc, accumulate);
}
template <typename T>
void kernel_generic(int64_t kc, const T* a, int64_t ars, int64_t acs, const T* b, T* c,
                    int64_t ldc, bool accumulate) {
  using K = Tile<CpuIsa::kGeneric, T>;
  kernel_body<T, K::W, K::MR, K::NV>(kc, a, ars, acs, b, c, ldc, accumulate);
}

template <typename T, typename Src>
[[gnu::target(JAXDNN_TARGET_AVX512)]] void pack_a_avx512(Mat<Src> a, int64_t mr, int64_t kc,
                                                          T* dst) {
  pack_a_body<CpuIsa::kAvx512, Tile<CpuIsa::kAvx512, T>::MR>(a, mr, kc, dst);
}
template <typename T, typename Src>
[[gnu::target(JAXDNN_TARGET_AVX2)]] void pack_a_avx2(Mat<Src> a, int64_t mr, int64_t kc, T* dst) {
  pack_a_body<CpuIsa::kAvx2, Tile<CpuIsa::kAvx2, T>::MR>(a, mr, kc, dst);
}
template <typename T, typename Src>
void pack_a_generic(Mat<Src> a, int64_t mr, int64_t kc, T* dst) {
  pack_a_body<CpuIsa::kGeneric, Tile<CpuIsa::kGeneric, T>::MR>(a, mr, kc, dst);
}

// 16-bit to float: float16 with the F16C/AVX-512 conversion instructions, bfloat16 (a shift)
// vectorised by the compiler.
template <typename H>
[[gnu::always_inline]] inline void to_float_body(const H* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = jaxdnn::to_float(src[i]);
}
[[gnu::target(JAXDNN_TARGET_AVX512)]] void f16_to_float_avx512(const f16_t* src, int64_t n,
                                                                float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)  // (the zero-masked form: GCC 12 warns on the plain one)
    _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(
                                  0xffff, _mm256_loadu_si256(
                                              reinterpret_cast<const __m256i*>(src + i))));
  to_float_body(src + i, n - i, dst + i);
}
[[gnu::target(JAXDNN_TARGET_AVX2)]] void f16_to_float_avx2(const f16_t* src, int64_t n,
                                                            float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  to_float_body(src + i, n - i, dst + i);
}
[[gnu::target(JAXDNN_TARGET_AVX512)]] void bf16_to_float_avx512(const bf16_t* src, int64_t n,
                                                                 float* dst) {
  to_float_body(src, n, dst);
}
[[gnu::target(JAXDNN_TARGET_AVX2)]] void bf16_to_float_avx2(const bf16_t* src, int64_t n,
                                                             float* dst) {
  to_float_body(src, n, dst);
}
template <typename H>
void to_float_generic(const H* src, int64_t n, float* dst) {
  to_float_body(src, n, dst);
}

CpuIsa detect_isa() {
  __builtin_cpu_init();
  CpuIsa best = CpuIsa::kGeneric;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    best = CpuIsa::kAvx2;
  if (best == CpuIsa::kAvx2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq"))
    best = CpuIsa::kAvx512;
  return best;
}

template <CpuIsa I, typename T>
Blocking blocking_of() {
  using K = Tile<I, T>;
  static_assert(K::MR * K::KC * int64_t(sizeof(T)) <= kMaxApackBytes);
  static_assert(K::MR * K::W * K::NV * int64_t(sizeof(T)) <= kMaxTileBytes);
  static_assert(K::NC % (K::W * K::NV) == 0);
  return {K::MR, K::W * K::NV, K::KC, K::NC};
}

// The microkernel and A packing of one instruction set for (T, Src).
template <typename T, typename Src>
struct Impl {
  Blocking blk;
  void (*kernel)(int64_t, const T*, int64_t, int64_t, const T*, T*, int64_t, bool);
  void (*pack_a)(Mat<Src>, int64_t, int64_t, T*);
};

template <typename T, typename Src>
const Impl<T, Src>& impl(CpuIsa isa) {
  static const Impl<T, Src> avx512{blocking_of<CpuIsa::kAvx512, T>(), kernel_avx512<T>,
                                   pack_a_avx512<T, Src>};
  static const Impl<T, Src> avx2{blocking_of<CpuIsa::kAvx2, T>(), kernel_avx2<T>,
                                 pack_a_avx2<T, Src>};
  static const Impl<T, Src> generic{blocking_of<CpuIsa::kGeneric, T>(), kernel_generic<T>,
                                    pack_a_generic<T, Src>};
  switch (isa) {
    case CpuIsa::kAvx512: return avx512;
    case CpuIsa::kAvx2: return avx2;
    default: return generic;
  }
}

}  // namespace

CpuIsa best_isa() {
  static const CpuIsa isa = detect_isa();
  return isa;
}

const char* isa_requirements(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return "AVX-512 F, VL, BW and DQ, AVX2, FMA and F16C";
    case CpuIsa::kAvx2: return "AVX2, FMA and F16C";
    default: return "x86-64";
  }
}

void to_float(CpuIsa isa, const f16_t* src, int64_t n, float* dst) {
  switch (isa) {
    case CpuIsa::kAvx512: return f16_to_float_avx512(src, n, dst);
    case CpuIsa::kAvx2: return f16_to_float_avx2(src, n, dst);
    default: return to_float_generic(src, n, dst);
  }
}

void to_float(CpuIsa isa, const bf16_t* src, int64_t n, float* dst) {
  switch (isa) {
    case CpuIsa::kAvx512: return bf16_to_float_avx512(src, n, dst);
    case CpuIsa::kAvx2: return bf16_to_float_avx2(src, n, dst);
    default: return to_float_generic(src, n, dst);
  }
}

template <typename T>
const Blocking& blocking(CpuIsa isa) {
  return impl<T, T>(isa).blk;
}

template <typename T>
KBlocks k_blocks(CpuIsa isa, int64_t k) {
  if (k <= 0) return {0, 1};
  const int64_t kc_max = blocking<T>(isa).kc_max;
  const int64_t count = (k + kc_max - 1) / kc_max;
  return {count, (k + count - 1) / count};
}

template <typename T>
int64_t packed_b_elems(CpuIsa isa, int64_t k, int64_t n) {
  const int64_t nr = blocking<T>(isa).nr;
  return k * ((n + nr - 1) / nr * nr);
}

template <typename T>
const T* packed_b_panel(CpuIsa isa, const T* packed, int64_t k, int64_t n, int64_t b, int64_t j) {
  const int64_t nr = blocking<T>(isa).nr;
  const KBlocks kb = k_blocks<T>(isa, k);
  return packed + kb.begin(b) * ((n + nr - 1) / nr * nr) + (j / nr) * kb.len(b, k) * nr;
}

template <typename T, typename Src>
void pack_b(CpuIsa isa, Mat<Src> b, int64_t k, int64_t n, int64_t s0, int64_t s1, T* packed) {
  const int64_t NR = blocking<T>(isa).nr, npad = (n + NR - 1) / NR * NR;
  const KBlocks kb = k_blocks<T>(isa, k);
  for (int64_t blk = 0; blk < kb.count; ++blk) {
    const int64_t k0 = kb.begin(blk), kc = kb.len(blk, k);
    T* dst = packed + k0 * npad;  // strip s of this block: dst + s*kc*NR, (kc, NR)
    if (b.cs == 1) {  // rows of B contiguous: read each row once, across the strips
      for (int64_t kk = 0; kk < kc; ++kk) {
        const Src* row = b.data + (k0 + kk) * b.rs;
        for (int64_t s = s0; s < s1; ++s) {
          T* d = dst + (s * kc + kk) * NR;
          const int64_t nr = std::min(NR, n - s * NR);
          convert(isa, row + s * NR, nr, d);
          for (int64_t q = nr; q < NR; ++q) d[q] = T(0);
        }
      }
      continue;
    }
    for (int64_t s = s0; s < s1; ++s)  // read each column of B along k
      for (int64_t q = 0; q < NR; ++q) {
        T* d = dst + s * kc * NR + q;
        const int64_t j = s * NR + q;
        if (j >= n) {
          for (int64_t kk = 0; kk < kc; ++kk) d[kk * NR] = T(0);
          continue;
        }
        const Src* col = b.data + k0 * b.rs + j * b.cs;
        for (int64_t kk = 0; kk < kc; ++kk) d[kk * NR] = T(load_acc(col[kk * b.rs]));
      }
  }
}

template <typename T, typename Src>
void gemm_block(CpuIsa isa, int64_t m, int64_t n, int64_t kc, Mat<Src> a, const T* b_panel, T* c,
                int64_t ldc, bool accumulate) {
  const Impl<T, Src>& im = impl<T, Src>(isa);
  const int64_t MR = im.blk.mr, NR = im.blk.nr;
  alignas(64) T apack[kMaxApackBytes / sizeof(T)];  // (kc, MR): this strip of A, k-major
  alignas(64) T tile[kMaxTileBytes / sizeof(T)];    // (MR, NR): an edge tile of C
  for (int64_t i = 0; i < m; i += MR) {
    const int64_t mr = std::min(MR, m - i);
    // A full strip of T is read in place (ars, acs) when it is rows of a row-major A (packing
    // them would be a transpose) or columns of a transposed one, unless its stride is a
    // multiple of 4 KB (its lines would all share one L1 set). Otherwise the strip is packed
    // (converted, zero-padded) into apack.
    const T* ap = apack;
    int64_t ars = 1, acs = MR;
    if constexpr (std::is_same_v<Src, T>) {
      const int64_t stride = a.cs == 1 ? a.rs : a.rs == 1 ? a.cs : 0;
      if (mr == MR && stride != 0 && stride * int64_t(sizeof(T)) % 4096 != 0) {
        ap = a.data + i * a.rs, ars = a.rs, acs = a.cs;
        if (a.cs == 1 && i + 2 * MR <= m)  // rows may come from memory: fetch the next strip's
          for (int64_t r = MR; r < 2 * MR; ++r)
            for (int64_t k = 0; k < kc; k += 64 / int64_t(sizeof(T)))
              __builtin_prefetch(ap + r * ars + k);
      }
    }
    if (ap == apack) im.pack_a(a.sub(i, 0), mr, kc, apack);
    for (int64_t j = 0; j < n; j += NR) {
      const int64_t nr = std::min(NR, n - j);
      const T* bs = b_panel + (j / NR) * kc * NR;
      T* cij = c + i * ldc + j;
      if (mr == MR && nr == NR) {
        for (int64_t r = 0; r < MR; ++r)  // the kernel ends storing (and reading) this tile
          for (int64_t q = 0; q < NR; q += 64 / int64_t(sizeof(T)))
            __builtin_prefetch(cij + r * ldc + q, 1);
        im.kernel(kc, ap, ars, acs, bs, cij, ldc, accumulate);
        continue;
      }
      im.kernel(kc, ap, ars, acs, bs, tile, NR, false);
      for (int64_t r = 0; r < mr; ++r)
        for (int64_t q = 0; q < nr; ++q)
          cij[r * ldc + q] = accumulate ? cij[r * ldc + q] + tile[r * NR + q] : tile[r * NR + q];
    }
  }
}

// Instantiations: float GEMMs read float, bfloat16 or float16 sources; double GEMMs double.
#define JAXDNN_GEMM_TYPE(T)                                                        \
  template const Blocking& blocking<T>(CpuIsa);                                    \
  template KBlocks k_blocks<T>(CpuIsa, int64_t);                                   \
  template int64_t packed_b_elems<T>(CpuIsa, int64_t, int64_t);                    \
  template const T* packed_b_panel<T>(CpuIsa, const T*, int64_t, int64_t, int64_t, int64_t);
#define JAXDNN_GEMM_SRC(T, Src)                                                                \
  template void pack_b<T, Src>(CpuIsa, Mat<Src>, int64_t, int64_t, int64_t, int64_t, T*);    \
  template void gemm_block<T, Src>(CpuIsa, int64_t, int64_t, int64_t, Mat<Src>, const T*, T*, \
                                   int64_t, bool);
JAXDNN_GEMM_TYPE(float)
JAXDNN_GEMM_TYPE(double)
JAXDNN_GEMM_SRC(float, float)
JAXDNN_GEMM_SRC(float, bf16_t)
JAXDNN_GEMM_SRC(float, f16_t)
JAXDNN_GEMM_SRC(double, double)
#undef JAXDNN_GEMM_TYPE
#undef JAXDNN_GEMM_SRC

}  // namespace jaxdnn::gemm
