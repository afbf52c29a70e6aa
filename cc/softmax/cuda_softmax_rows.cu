// Row-in-registers softmax: a group of G threads owns a row, each thread holding K packs of it
// (of y and c for the backward) in registers (cc/common/cuda_rows.h), so HBM is read once and
// written once:
//   forward   max (group reduce) -> sum of exp(x - max) (group reduce) -> y -> store
//   backward  sum of summand(y, c) (group reduce) -> output(y, c, r) -> store
//
// Shapes (cuda::with_row_shape): a warp per row (G = 32, four rows per 128-thread block) with
// K = 1, 2, 4 or 8 packs per thread, else one block of G = 64 .. 512 threads per row with
// K = kRowPacks / operands packs per thread (8 forward, 4 backward). The grid is flat, one
// group per row (cuda_rows.h says why). A 4096-wide row: float32 forward 128
// threads x 8 packs (89-96 registers, 5 blocks per SM, 5 x 16 KiB in flight per SM), bfloat16
// forward 64 x 8 (80-95 registers, 10-12 blocks, 80-96 KiB), backward 256 (float32) or 128
// (bfloat16) threads x 4 packs of y and c (2 x 32 KiB or 5 x 16 KiB). Backward rows of 32- and
// 64-bit types longer than 512 x 4 packs take 512 x 8.
//
// Limits (rows_fit): rows of up to 512 threads x 32 elements (16 doubles), i.e. 16384 (8192)
// elements, 16-byte aligned (aligned pointers and cols * sizeof(T) a multiple of 16); unaligned
// rows of up to 256 elements run warp rows of single elements. Longer or unaligned rows go to
// the online kernel.
//
// Traffic: forward rows*cols read + written once; backward 2x read + 1x written, with plain
// loads and stores. Sums in float (double for float64), in a fixed order: deterministic.

#include <cmath>
#include <limits>

#include "cc/common/cuda_reduce.h"
#include "cc/common/cuda_rows.h"
#include "cc/softmax/cuda_softmax_kernels.h"

namespace jaxdnn::softmax {
namespace {

using cuda::dev_acc_t;
using cuda::device_t;

template <typename A> constexpr int kMaxElems = sizeof(A) == 8 ? 16 : 32;

template <Kind kKind> constexpr int kOperands = is_backward(kKind) ? 2 : 1;

template <Kind kKind, typename T, int G, int K, bool kVector>
__global__ void __launch_bounds__(cuda::row_block_threads<G>())
softmax_rows_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                    int64_t rows, int64_t cols) {
  using A = dev_acc_t<T>;
  using Slice = cuda::RowSlice<T, K, kVector>;
  constexpr int kN = Slice::kN, kRowsPerBlock = cuda::rows_per_block<G>();
  constexpr A kInf = std::numeric_limits<A>::infinity();
  __shared__ A scratch[32];
  cuda::await_prior_grids();
  const cuda::RowMap<G, K, kN> map{int(threadIdx.x % G), int(cols)};

  struct Slices {
    Slice a, b;  // b: backward only
  };
  const auto load = [&](int64_t row) {
    Slices s;
    s.a.load(a + row * cols, map);
    if constexpr (is_backward(kKind)) s.b.load(b + row * cols, map);
    return s;
  };
  const auto body = [&](int64_t row, Slices& s) {
    T* y = out + row * cols;
    if constexpr (!is_backward(kKind)) {
      Slice& x = s.a;
      A m = map.fold(-kInf, [&](A acc, int k, int e) { return CudaMath::max(acc, x(k, e)); });
      m = cuda::group_reduce<G>(m, cuda::MaxOp(), -kInf, scratch);
      x.fence();
      A sum = map.fold(A(0), [&](A acc, int k, int e) { return acc + CudaMath::exp(x(k, e) - m); });
      sum = cuda::group_reduce<G>(sum, cuda::SumOp(), A(0), scratch);
      x.fence();
      // softmax: y = exp(x - m) / sum;  log_softmax: y = (x - m) - log(sum). Both recompute
      // from the slice: holding the exps as floats would double a 16-bit row's registers
      // (148 against 80 for a 4096-wide bfloat16 row on 64 threads), halving the rows in
      // flight, for one exp (1 MUFU + 4 FP32 instructions) per element.
      const A inv = A(1) / sum, log_sum = CudaMath::log(sum);
      map.for_packs([&](int k, int c) {
        A v[kN];
#pragma unroll
        for (int e = 0; e < kN; ++e)
          v[e] = kKind == Kind::kSoftmax ? CudaMath::exp(x(k, e) - m) * inv
                                         : (x(k, e) - m) - log_sum;
        cuda::store_acc<T, kVector>(y + c, v);
      });
    } else {
      constexpr Linear kLinear = linear_of(kKind);
      A r = map.fold(A(0), [&](A acc, int k, int e) {
        return acc + summand<kLinear, CudaMath>(s.a(k, e), s.b(k, e));
      });
      r = cuda::group_reduce<G>(r, cuda::SumOp(), A(0), scratch);
      s.a.fence();
      s.b.fence();
      map.for_packs([&](int k, int c) {
        A v[kN];
#pragma unroll
        for (int e = 0; e < kN; ++e) v[e] = output<kLinear, CudaMath>(s.a(k, e), s.b(k, e), r);
        cuda::store_acc<T, kVector>(y + c, v);
      });
    }
  };
  cuda::for_each_row(int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / G,
                     int64_t(gridDim.x) * kRowsPerBlock, rows, load, body);
}

// The row lengths launch_typed takes (with 16-byte aligned operands, as XLA allocates them).
template <typename T>
bool rows_fit(int64_t cols) {
  constexpr int kVecN = cuda::Vec<T>::kN;
  constexpr int kMaxK = kMaxElems<dev_acc_t<T>> / kVecN;
  return cols % kVecN == 0 ? cols / kVecN <= cuda::kMaxRowThreads * kMaxK : cols <= 256;
}

template <Kind kKind, typename T>
bool launch_typed(const Problem& p, const Operands& io, cudaStream_t stream, Status* status) {
  constexpr int kVecN = cuda::Vec<T>::kN;
  constexpr int kMaxK = kMaxElems<dev_acc_t<T>> / kVecN;  // 4 (16-bit) or 8 packs
  constexpr int kSliceK = cuda::kRowPacks / kOperands<kKind>;
  if (!rows_fit<T>(p.cols)) return false;
  const bool aligned = p.cols % kVecN == 0 && cuda::vec_aligned(io.a) &&
                       cuda::vec_aligned(io.out) && (io.b == nullptr || cuda::vec_aligned(io.b));
  const T* a = static_cast<const T*>(io.a);
  const T* b = static_cast<const T*>(io.b);
  T* out = static_cast<T*>(io.out);
  auto run = [&](auto group, auto k, auto vector) {
    constexpr int G = decltype(group)::value, threads = cuda::row_block_threads<G>();
    constexpr auto kernel =
        softmax_rows_kernel<kKind, T, G, decltype(k)::value, decltype(vector)::value>;
    *status = cuda::launch("softmax_rows_kernel", kernel,
                           cuda::grid_for(p.rows, cuda::rows_per_block<G>()), threads, 0, stream,
                           a, b, out, p.rows, p.cols);
  };
  using std::integral_constant;
  if (!aligned)  // single elements, warp rows only (rows_fit: at most 256)
    return cuda::with_row_shape<8, 32>(p.cols, [&](auto g, auto k) {
      run(g, k, integral_constant<bool, false>{});
    });
  const integral_constant<bool, true> vec;
  if (cuda::with_row_shape<kSliceK, cuda::kMaxRowThreads>(
          p.cols / kVecN, [&](auto g, auto k) { run(g, k, vec); }))
    return true;
  if constexpr (kSliceK < kMaxK) {  // long backward rows: 512 threads x kMaxK packs
    run(integral_constant<int, cuda::kMaxRowThreads>{}, integral_constant<int, kMaxK>{}, vec);
    return true;
  }
  return false;  // rows_fit bounds the row: not reached
}

}  // namespace

Support rows_support(const Problem& p) {
  bool fit = false;
  int64_t limit = 0;
  dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
    using T = device_t<decltype(tag)>;
    fit = rows_fit<T>(p.cols);
    limit = int64_t(cuda::kMaxRowThreads) * kMaxElems<dev_acc_t<T>>;
  });
  if (fit) return Support::Yes();
  return Support::No("a row of " + std::to_string(p.cols) + " does not fit in registers (at " +
                     "most " + std::to_string(limit) + " elements, 256 when not a multiple " +
                     "of 16 bytes)");
}

bool launch_rows(Kind kind, const Problem& p, const Operands& io, cudaStream_t stream,
                 Status* status) {
  bool launched = false;
  dispatch_kind(kind, [&](auto k) {
    dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
      launched = launch_typed<decltype(k)::value, device_t<decltype(tag)>>(p, io, stream, status);
    });
  });
  return launched;
}

}  // namespace jaxdnn::softmax
