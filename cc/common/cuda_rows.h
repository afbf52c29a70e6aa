// Rows held in registers: the thread mapping, the row loop and the shape choice shared by the
// row kernels (softmax "rows", layer/RMS norm forward).
//
// Mapping: a group of G threads owns a row, a warp (G == 32, four rows per 128-thread block)
// or the whole block (G >= 64). Thread `lane` of the group holds the K packs lane, lane + G,
// ..., lane + (K-1)G of the row (RowSlice, placed by RowMap), so each load or store
// instruction of a warp covers 32 consecutive packs: 512 contiguous bytes with 16-byte packs.
//
// Bandwidth: a flat grid, one group per row (blocks = rows / rows per block), as XLA launches
// its row reductions. The previous persistent form (one wave of blocks, each group loading its
// next row before reducing the current one) measured 3-8% slower on the H200 at 32768x4096
// (layer_norm float32 forward 3.39 -> 3.64 TB/s, rms_norm 3.22 -> 3.50 with the flat grid,
// docs/perf/gpu-memory.md): the scheduler's fresh blocks keep more loads in flight than one wave's
// prefetch did. Slices stay in the storage type (a 16-byte pack is 4 registers whatever the
// dtype: 16-bit rows are not widened to float) and are converted on use, in each pass.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cc/common/cuda_pack.h"

namespace jaxdnn::cuda {

// Packs a thread holds per row over all operands (32 registers of row data in 16-byte packs),
// and the most threads of a row group.
constexpr int kRowPacks = 8;
constexpr int kMaxRowThreads = 512;

template <int G> constexpr int rows_per_block() { return G == 32 ? 4 : 1; }
template <int G> constexpr int row_block_threads() { return G * rows_per_block<G>(); }

// Where a thread's K packs of kN elements lie in a row of `cols` elements.
template <int G, int K, int kN>
struct RowMap {
  int lane;  // thread index in the group, threadIdx.x % G
  int cols;  // row length (a row held in registers is short: 32-bit index math)

  __device__ __forceinline__ int col(int k) const { return (k * G + lane) * kN; }
  __device__ __forceinline__ bool has(int k) const { return col(k) < cols; }

  // acc = f(acc, k, e) over the thread's elements (pack k, element e), in a fixed order.
  template <typename A, typename F>
  __device__ __forceinline__ A fold(A acc, F f) const {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (has(k))
#pragma unroll
        for (int e = 0; e < kN; ++e) acc = f(acc, k, e);
    return acc;
  }

  // f(k, col(k)) for each of the thread's packs.
  template <typename F>
  __device__ __forceinline__ void for_packs(F f) const {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (has(k)) f(k, col(k));
  }
};

// A thread's K packs of one row, in the storage type T (HeldPack: 16-bit packs as words).
template <typename T, int K, bool kVector>
struct RowSlice {
  using H = HeldPack<T, kVector>;
  static constexpr int kN = H::kN;
  H p[K];

  template <int G>
  __device__ __forceinline__ void load(const T* row, const RowMap<G, K, kN>& map) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (map.has(k)) p[k] = H::load(row + map.col(k));
  }
  // Element e of pack k in the accumulator type.
  __device__ __forceinline__ dev_acc_t<T> operator()(int k, int e) const { return p[k][e]; }
  // Between two passes over the row (HeldPack::fence).
  __device__ __forceinline__ void fence() {
#pragma unroll
    for (int k = 0; k < K; ++k) p[k].fence();
  }
};

// body(row, slices) with slices = load(row) (mutable: body may fence them), for row = first,
// first + stride, ... < rows (one row per group in the flat grid; the loop covers grids cut
// at the launch limit).
template <typename Load, typename Body>
__device__ __forceinline__ void for_each_row(int64_t first, int64_t stride, int64_t rows,
                                             Load load, Body body) {
  for (int64_t r = first; r < rows; r += stride) {
    auto cur = load(r);
    body(r, cur);
  }
}

namespace detail {
template <int G, int K, int kMaxK, int kMaxG, typename Fn>
bool with_row_shape(int64_t packs, Fn& fn) {
  if (packs <= int64_t(G) * K) {
    fn(std::integral_constant<int, G>{}, std::integral_constant<int, K>{});
    return true;
  }
  if constexpr (G == 32 && K < kMaxK) return with_row_shape<32, 2 * K, kMaxK, kMaxG>(packs, fn);
  else if constexpr (2 * G <= kMaxG) return with_row_shape<2 * G, kMaxK, kMaxK, kMaxG>(packs, fn);
  else return false;
}
}  // namespace detail

// The group shape of a row of `packs` packs: a warp holding the fewest packs per thread
// (1, 2, 4, ... kMaxK) that cover the row, else the fewest threads (64, 128, ... kMaxG) holding
// kMaxK packs each. Calls fn(integral_constant<int, G>, integral_constant<int, K>), or returns
// false when the row needs more than kMaxG threads.
template <int kMaxK, int kMaxG, typename Fn>
bool with_row_shape(int64_t packs, Fn&& fn) {
  return detail::with_row_shape<32, 1, kMaxK, kMaxG>(packs, fn);
}

}  // namespace jaxdnn::cuda
