// Row-in-registers softmax: a group of G threads owns a row, each thread holding K packs of it
// (of y and c for the backward) in registers, so HBM is read once and written once:
//   forward   load -> max (group reduce) -> exp, sum (group reduce) -> scale or shift -> store
//   backward  load -> sum of summand (group reduce) -> output -> store
// Thread t of the group holds packs t, t + G, t + 2G, ...: each load instruction of a warp
// covers 32 consecutive packs (512 contiguous bytes with 16-byte packs).
//
//   G = 32   one warp per row, four rows per 128-thread block, reductions by warp shuffles;
//            rows of up to 32*K packs (K in 1, 2, 4, 8).
//   G >= 64  one block of G threads per row (G in 64 .. 512), reductions by
//            cuda::block_reduce; K is the most packs a thread holds (kMaxElems elements).
// kMaxElems = 32 floats (16 doubles) per thread and operand keeps a 4096-wide float32 or
// bfloat16 row in 128 threads; rows of up to 512 * 32 = 16384 elements fit (1024-thread
// blocks would have 64 registers per thread, too few: they spill). Packs are 16-byte vectors
// when every row starts 16-byte aligned (aligned pointers and cols * sizeof(T) a multiple of
// 16), otherwise single elements, for warp rows only. Longer or unaligned rows go to the
// online kernel.
//
// Traffic: forward rows*cols read + written once; backward 2x read + 1x written. Sums in float
// (double for float64), in a fixed order: deterministic.

#include <cmath>
#include <limits>

#include "cc/common/cuda_pack.h"
#include "cc/common/cuda_reduce.h"
#include "cc/softmax/cuda_softmax_kernels.h"

namespace jaxdnn::softmax {
namespace {

using cuda::dev_acc_t;
using cuda::device_t;
using cuda::from_acc;
using cuda::to_acc;

template <typename A> constexpr int kMaxElems = sizeof(A) == 8 ? 16 : 32;

constexpr int block_threads(int group) { return group == 32 ? 128 : group; }

template <int G, typename A, typename Op>
__device__ __forceinline__ A group_reduce(A v, Op op, A identity, A* scratch) {
  if constexpr (G == 32) return cuda::warp_reduce(v, op);
  else return cuda::block_reduce(v, op, identity, scratch);
}

template <Kind kKind, typename T, int G, int K, bool kVector>
__global__ void __launch_bounds__(block_threads(G))
softmax_rows_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                    int64_t rows, int64_t cols) {
  using A = dev_acc_t<T>;
  using P = cuda::Pack<T, kVector>;
  constexpr int kN = P::kN, kRowsPerBlock = block_threads(G) / G;
  constexpr A kInf = std::numeric_limits<A>::infinity();
  __shared__ A scratch[32];
  const int lane = threadIdx.x % G;
  auto col = [&](int k) { return (int64_t(k) * G + lane) * kN; };  // first column of pack k

  for (int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / G; row < rows;
       row += int64_t(gridDim.x) * kRowsPerBlock) {
    const int64_t offset = row * cols;
    A va[K][kN], vb[K][kN];  // (K, kN) of the thread's packs of a (and b)
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (col(k) < cols) {
        const P pa = P::load_stream(a + offset + col(k));
#pragma unroll
        for (int e = 0; e < kN; ++e) va[k][e] = to_acc(pa.v[e]);
        if constexpr (is_backward(kKind)) {
          const P pb = P::load_stream(b + offset + col(k));
#pragma unroll
          for (int e = 0; e < kN; ++e) vb[k][e] = to_acc(pb.v[e]);
        }
      }
    }

    if constexpr (!is_backward(kKind)) {
      A m = -kInf;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < cols)
#pragma unroll
          for (int e = 0; e < kN; ++e) m = cuda::MaxOp()(m, va[k][e]);
      m = group_reduce<G>(m, cuda::MaxOp(), -kInf, scratch);
      A s = 0;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < cols)
#pragma unroll
          for (int e = 0; e < kN; ++e) {
            const A ex = CudaMath::exp(va[k][e] - m);
            s += ex;
            if constexpr (kKind == Kind::kSoftmax) va[k][e] = ex;
          }
      s = group_reduce<G>(s, cuda::SumOp(), A(0), scratch);
      // softmax: y = e / s;  log_softmax: y = (x - m) - log(s)
      const A scale = kKind == Kind::kSoftmax ? A(1) / s : A(1);
      const A shift = kKind == Kind::kSoftmax ? A(0) : m;
      const A add = kKind == Kind::kSoftmax ? A(0) : -CudaMath::log(s);
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < cols) {
          P r;
#pragma unroll
          for (int e = 0; e < kN; ++e) r.v[e] = from_acc<T>((va[k][e] - shift) * scale + add);
          r.store_stream(out + offset + col(k));
        }
    } else {
      constexpr Linear kLinear = linear_of(kKind);
      A r = 0;
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < cols)
#pragma unroll
          for (int e = 0; e < kN; ++e) r += summand<kLinear, CudaMath>(va[k][e], vb[k][e]);
      r = group_reduce<G>(r, cuda::SumOp(), A(0), scratch);
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (col(k) < cols) {
          P o;
#pragma unroll
          for (int e = 0; e < kN; ++e)
            o.v[e] = from_acc<T>(output<kLinear, CudaMath>(va[k][e], vb[k][e], r));
          o.store_stream(out + offset + col(k));
        }
    }
  }
}

// Blocks for `rows`: one per row group, capped (the kernel loops over the rest).
unsigned grid_for_rows(int64_t rows, int rows_per_block) {
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  return unsigned(blocks < (int64_t(1) << 30) ? blocks : (int64_t(1) << 30));
}

template <Kind kKind, typename T>
bool launch_typed(const Problem& p, const Operands& io, cudaStream_t stream) {
  using A = dev_acc_t<T>;
  constexpr int kVecN = cuda::Vec<T>::kN;
  const bool aligned = p.cols % kVecN == 0 && cuda::vec_aligned(io.a) &&
                       cuda::vec_aligned(io.out) && (io.b == nullptr || cuda::vec_aligned(io.b));
  const T* a = static_cast<const T*>(io.a);
  const T* b = static_cast<const T*>(io.b);
  T* out = static_cast<T*>(io.out);
  auto run = [&](auto group, auto k, auto vector) {
    constexpr int G = decltype(group)::value, K = decltype(k)::value;
    softmax_rows_kernel<kKind, T, G, K, decltype(vector)::value>
        <<<grid_for_rows(p.rows, block_threads(G) / G), block_threads(G), 0, stream>>>(
            a, b, out, p.rows, p.cols);
  };
  using std::integral_constant;
  if (aligned) {
    constexpr int kMaxK = kMaxElems<A> / kVecN;  // 4 (16-bit) or 8 packs per thread
    const int64_t packs = p.cols / kVecN;
    const integral_constant<bool, true> vec;
    if (packs <= 32) run(integral_constant<int, 32>{}, integral_constant<int, 1>{}, vec);
    else if (packs <= 64) run(integral_constant<int, 32>{}, integral_constant<int, 2>{}, vec);
    else if (packs <= 128) run(integral_constant<int, 32>{}, integral_constant<int, 4>{}, vec);
    else if (packs <= 32 * kMaxK) run(integral_constant<int, 32>{}, integral_constant<int, kMaxK>{}, vec);
    else if (packs <= 64 * kMaxK) run(integral_constant<int, 64>{}, integral_constant<int, kMaxK>{}, vec);
    else if (packs <= 128 * kMaxK) run(integral_constant<int, 128>{}, integral_constant<int, kMaxK>{}, vec);
    else if (packs <= 256 * kMaxK) run(integral_constant<int, 256>{}, integral_constant<int, kMaxK>{}, vec);
    else if (packs <= 512 * kMaxK) run(integral_constant<int, 512>{}, integral_constant<int, kMaxK>{}, vec);
    else return false;
    return true;
  }
  // Unaligned rows: single elements, warp rows only.
  const integral_constant<bool, false> scalar;
  if (p.cols <= 32) run(integral_constant<int, 32>{}, integral_constant<int, 1>{}, scalar);
  else if (p.cols <= 64) run(integral_constant<int, 32>{}, integral_constant<int, 2>{}, scalar);
  else if (p.cols <= 128) run(integral_constant<int, 32>{}, integral_constant<int, 4>{}, scalar);
  else if (p.cols <= 256) run(integral_constant<int, 32>{}, integral_constant<int, 8>{}, scalar);
  else return false;
  return true;
}

}  // namespace

// The row lengths launch_typed takes (with 16-byte aligned operands, as XLA allocates them).
template <typename T>
bool rows_fit(int64_t cols) {
  constexpr int kVecN = cuda::Vec<T>::kN;
  constexpr int kMaxK = kMaxElems<dev_acc_t<T>> / kVecN;
  return cols % kVecN == 0 ? cols / kVecN <= 512 * kMaxK : cols <= 256;
}

Support rows_support(const Problem& p) {
  bool fit = false;
  int64_t limit = 0;
  dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
    using T = device_t<decltype(tag)>;
    fit = rows_fit<T>(p.cols);
    limit = int64_t(512) * kMaxElems<dev_acc_t<T>>;
  });
  if (fit) return Support::Yes();
  return Support::No("a row of " + std::to_string(p.cols) + " does not fit in registers (at " +
                     "most " + std::to_string(limit) + " elements, 256 when not a multiple " +
                     "of 16 bytes)");
}

bool launch_rows(Kind kind, const Problem& p, const Operands& io, cudaStream_t stream) {
  bool launched = false;
  dispatch_kind(kind, [&](auto k) {
    dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
      launched = launch_typed<decltype(k)::value, device_t<decltype(tag)>>(p, io, stream);
    });
  });
  return launched;
}

}  // namespace jaxdnn::softmax
