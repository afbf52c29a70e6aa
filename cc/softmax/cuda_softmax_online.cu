// Softmax for rows of any length: one 512-thread block per row, two passes over it.
//   forward   pass 1: each thread folds its elements into an online (max, sum of exp(x - max))
//             pair (Milakov & Gimelshein, arXiv:1805.02867), pairs combined across the block;
//             pass 2: y = exp(x - max) / sum or (x - max) - log(sum)
//   backward  pass 1: r = sum of summand(y, c); pass 2: output(y, c, r)
// Thread t reads packs t, t + 512, ...; packs are 16-byte vectors when rows start 16-byte
// aligned, else single elements.
//
// Traffic: forward reads the input twice (the second pass often from L2) and writes once;
// backward reads 2x twice and writes once. It serves rows too long to keep in registers (more
// than 1024 threads x 32 floats) and long unaligned rows; cuda_softmax_rows.cu serves the rest.

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

constexpr int kThreads = 512;

// The softmax statistics of a set of values: m = max, s = sum of exp(x - m). A set of only
// -inf has m = -inf and s = 0; +inf or NaN in the set makes s NaN (and so the whole row).
template <typename A>
struct MaxSum {
  A m, s;
};

template <typename A>
__device__ __forceinline__ MaxSum<A> combine(MaxSum<A> p, MaxSum<A> q) {
  const A m = p.m > q.m ? p.m : q.m;
  if (m == -std::numeric_limits<A>::infinity()) return {m, A(0)};  // exp(-inf - -inf) is NaN
  return {m, p.s * CudaMath::exp(p.m - m) + q.s * CudaMath::exp(q.m - m)};
}

// combine() across the block (fixed order: deterministic); every thread gets the result.
template <typename A>
__device__ MaxSum<A> block_combine(MaxSum<A> v, A* sm, A* ss) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.m, offset),
                    __shfl_xor_sync(0xffffffffu, v.s, offset)});
  __syncthreads();  // sm/ss may still be read by the previous row
  if (lane == 0) { sm[warp] = v.m; ss[warp] = v.s; }
  __syncthreads();
  v = lane < kThreads / 32 ? MaxSum<A>{sm[lane], ss[lane]}
                           : MaxSum<A>{-std::numeric_limits<A>::infinity(), A(0)};
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.m, offset),
                    __shfl_xor_sync(0xffffffffu, v.s, offset)});
  return v;
}

template <Kind kKind, typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
softmax_online_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                      int64_t rows, int64_t cols) {
  using A = dev_acc_t<T>;
  using P = cuda::Pack<T, kVector>;
  constexpr int kN = P::kN;
  __shared__ A sm[32], ss[32];
  cuda::await_prior_grids();
  const int64_t packs = cols / kN;  // kVector only when kN divides cols
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* ar = a + row * cols;
    const T* br = b + row * cols;
    T* orow = out + row * cols;
    if constexpr (!is_backward(kKind)) {
      MaxSum<A> st{-std::numeric_limits<A>::infinity(), A(0)};
      for (int64_t j = threadIdx.x; j < packs; j += kThreads) {
        const P p = P::load(ar + j * kN);
#pragma unroll
        for (int e = 0; e < kN; ++e) st = combine(st, {A(to_acc(p.v[e])), A(1)});
      }
      st = block_combine(st, sm, ss);
      const A inv = A(1) / st.s, log_s = CudaMath::log(st.s);
      for (int64_t j = threadIdx.x; j < packs; j += kThreads) {
        const P p = P::load_stream(ar + j * kN);
        P r;
#pragma unroll
        for (int e = 0; e < kN; ++e) {
          const A d = A(to_acc(p.v[e])) - st.m;
          r.v[e] = from_acc<T>(kKind == Kind::kSoftmax ? CudaMath::exp(d) * inv : d - log_s);
        }
        r.store_stream(orow + j * kN);
      }
    } else {
      constexpr Linear kLinear = linear_of(kKind);
      A r = 0;
      for (int64_t j = threadIdx.x; j < packs; j += kThreads) {
        const P py = P::load(ar + j * kN), pc = P::load(br + j * kN);
#pragma unroll
        for (int e = 0; e < kN; ++e)
          r += summand<kLinear, CudaMath>(A(to_acc(py.v[e])), A(to_acc(pc.v[e])));
      }
      r = cuda::block_reduce(r, cuda::SumOp(), A(0), sm);
      for (int64_t j = threadIdx.x; j < packs; j += kThreads) {
        const P py = P::load_stream(ar + j * kN), pc = P::load_stream(br + j * kN);
        P o;
#pragma unroll
        for (int e = 0; e < kN; ++e)
          o.v[e] = from_acc<T>(
              output<kLinear, CudaMath>(A(to_acc(py.v[e])), A(to_acc(pc.v[e])), r));
        o.store_stream(orow + j * kN);
      }
    }
  }
}

template <Kind kKind, typename T>
Status launch_typed(const Problem& p, const Operands& io, cudaStream_t stream) {
  const bool aligned = p.cols % cuda::Vec<T>::kN == 0 && cuda::vec_aligned(io.a) &&
                       cuda::vec_aligned(io.out) && (io.b == nullptr || cuda::vec_aligned(io.b));
  const unsigned grid = unsigned(p.rows < (int64_t(1) << 30) ? p.rows : (int64_t(1) << 30));
  const T* a = static_cast<const T*>(io.a);
  const T* b = static_cast<const T*>(io.b);
  T* out = static_cast<T*>(io.out);
  return cuda::launch("softmax_online_kernel",
                      aligned ? softmax_online_kernel<kKind, T, true>
                              : softmax_online_kernel<kKind, T, false>,
                      grid, kThreads, 0, stream, a, b, out, p.rows, p.cols);
}

}  // namespace

Status launch_online(Kind kind, const Problem& p, const Operands& io, cudaStream_t stream) {
  Status status;
  dispatch_kind(kind, [&](auto k) {
    dispatch_io(p.dtype, p.dtype, [&](auto tag, auto) {
      status = launch_typed<decltype(k)::value, device_t<decltype(tag)>>(p, io, stream);
    });
  });
  return status;
}

}  // namespace jaxdnn::softmax
