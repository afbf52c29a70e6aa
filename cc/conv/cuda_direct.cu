// CUDA direct convolution: the GPU oracle for the fast algorithms.
//
// Every case of cc/conv/conv.h (stride, padding, lhs/rhs dilation, groups, 1-D/2-D/3-D, empty
// dims) in three gather kernels, no atomics, so results are bitwise reproducible:
//   fwd        one thread per y element; k fastest, so a warp reads one x element (broadcast)
//              and 32 consecutive w elements (coalesced).
//   bwd_data   one thread per dx element; c fastest.
//   bwd_filter a (32 x 8) block per 32 consecutive dw elements: the 8 rows split the N*Z*P*Q
//              reduction, then add their partial sums in a fixed order through shared memory.
// Accumulation in float (double for float64); integer inputs (int8 -> int8 or int32, int32,
// int64) sum exactly in the wrapping unsigned accumulator of dtype.h's IntAcc, as XLA does, and
// run here alone among the GPU algorithms (there is no int8 tensor-core path). Cost:
// N*Z*P*Q*K*T*R*S*Cg multiply-adds, no reuse through shared memory: correct first, fast
// elsewhere. fwd and bwd_filter multiply the
// zero that a tap reads on padding (conv.h), so 0 * inf = NaN there.

#include <type_traits>

#include "cc/common/cuda_util.h"
#include "cc/conv/cuda_algorithms.h"

namespace jaxdnn::conv {
namespace {

using cuda::dev_acc_t;
using cuda::device_t;
using cuda::from_acc;
using cuda::to_acc;

// How the sums of (device) input type In are kept: in float (double for float64), or in the
// wrapping unsigned accumulator for integers (dtype.h: IntAcc), whose low bits are the result.
template <typename In, typename = void>
struct Sum {
  using Acc = dev_acc_t<In>;
  static __device__ __forceinline__ Acc load(In v) { return Acc(to_acc(v)); }
  template <typename Out> static __device__ __forceinline__ Out store(Acc a) {
    return from_acc<Out>(a);
  }
};
template <typename In>
struct Sum<In, std::enable_if_t<std::is_integral_v<In>>> {
  using Acc = int_acc_t<In>;
  static __device__ __forceinline__ Acc load(In v) { return Acc(v); }
  template <typename Out> static __device__ __forceinline__ Out store(Acc a) { return Out(a); }
};

template <typename In, typename Out>
__global__ void direct_fwd_kernel(Problem p, const In* __restrict__ x, const In* __restrict__ w,
                                  Out* __restrict__ y) {
  using M = Sum<In>;
  using Acc = typename M::Acc;
  const int64_t total = p.y_elems(), Cg = p.Cg(), Kg = p.Kg(), K = p.K;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e % K, q = e / K % p.out[2], pp = e / (K * p.out[2]) % p.out[1];
    const int64_t z = e / (K * p.out[2] * p.out[1]) % p.out[0];
    const int64_t n = e / (K * p.out_spatial());
    const int64_t g = k / Kg;
    Acc acc = 0;
    for (int64_t t = 0; t < p.filt[0]; ++t) {
      const int64_t id = in_idx(p, 0, z, t);
      for (int64_t r = 0; r < p.filt[1]; ++r) {
        const int64_t ih = in_idx(p, 1, pp, r);
        for (int64_t s = 0; s < p.filt[2]; ++s) {
          const int64_t iw = in_idx(p, 2, q, s);
          const bool inside = id >= 0 && ih >= 0 && iw >= 0;  // else padding: x reads zero
          const int64_t pixel = inside ? ((n * p.in[0] + id) * p.in[1] + ih) * p.in[2] + iw : 0;
          const In* xp = x + pixel * p.C + g * Cg;
          const In* wp = w + ((t * p.filt[1] + r) * p.filt[2] + s) * Cg * K + k;
          for (int64_t c = 0; c < Cg; ++c)
            acc += (inside ? M::load(xp[c]) : Acc(0)) * M::load(wp[c * K]);
        }
      }
    }
    y[e] = M::template store<Out>(acc);
  }
}

template <typename In, typename Out>
__global__ void direct_bwd_data_kernel(Problem p, const In* __restrict__ dy,
                                       const In* __restrict__ w, Out* __restrict__ dx) {
  using M = Sum<In>;
  using Acc = typename M::Acc;
  const int64_t total = p.x_elems(), Cg = p.Cg(), Kg = p.Kg(), C = p.C, K = p.K;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % C, iw = e / C % p.in[2], h = e / (C * p.in[2]) % p.in[1];
    const int64_t d = e / (C * p.in[2] * p.in[1]) % p.in[0];
    const int64_t n = e / (C * p.in_spatial());
    const int64_t g = c / Cg, ci = c % Cg;
    Acc acc = 0;
    for (int64_t t = 0; t < p.filt[0]; ++t) {
      const int64_t oz = out_idx(p, 0, d, t);
      if (oz < 0) continue;
      for (int64_t r = 0; r < p.filt[1]; ++r) {
        const int64_t op = out_idx(p, 1, h, r);
        if (op < 0) continue;
        for (int64_t s = 0; s < p.filt[2]; ++s) {
          const int64_t oq = out_idx(p, 2, iw, s);
          if (oq < 0) continue;
          const In* dyp = dy + (((n * p.out[0] + oz) * p.out[1] + op) * p.out[2] + oq) * K + g * Kg;
          const In* wp = w + (((t * p.filt[1] + r) * p.filt[2] + s) * Cg + ci) * K + g * Kg;
          for (int64_t k = 0; k < Kg; ++k) acc += M::load(dyp[k]) * M::load(wp[k]);
        }
      }
    }
    dx[e] = M::template store<Out>(acc);
  }
}

constexpr int kFiltLanes = 32;  // consecutive dw elements per block (threadIdx.x)
constexpr int kFiltRows = 8;    // slices of the N*Z*P*Q reduction per block (threadIdx.y)

template <typename In, typename Out>
__global__ void __launch_bounds__(kFiltLanes * kFiltRows)
direct_bwd_filter_kernel(Problem p, const In* __restrict__ x, const In* __restrict__ dy,
                         Out* __restrict__ dw) {
  using M = Sum<In>;
  using Acc = typename M::Acc;
  __shared__ Acc partial[kFiltRows][kFiltLanes];  // (ROWS, LANES)
  const int64_t total = p.w_elems(), Cg = p.Cg(), Kg = p.Kg(), K = p.K;
  const int64_t positions = p.N * p.out_spatial();
  for (int64_t base = int64_t(blockIdx.x) * kFiltLanes; base < total;
       base += int64_t(gridDim.x) * kFiltLanes) {
    const int64_t e = base + threadIdx.x;
    Acc acc = 0;
    if (e < total) {
      const int64_t k = e % K, ci = e / K % Cg, s = e / (K * Cg) % p.filt[2];
      const int64_t r = e / (K * Cg * p.filt[2]) % p.filt[1];
      const int64_t t = e / (K * Cg * p.filt[2] * p.filt[1]);
      const int64_t c = (k / Kg) * Cg + ci;
      for (int64_t j = threadIdx.y; j < positions; j += kFiltRows) {
        const int64_t q = j % p.out[2], pp = j / p.out[2] % p.out[1];
        const int64_t z = j / (p.out[2] * p.out[1]) % p.out[0], n = j / p.out_spatial();
        const int64_t id = in_idx(p, 0, z, t), ih = in_idx(p, 1, pp, r), iw = in_idx(p, 2, q, s);
        const bool inside = id >= 0 && ih >= 0 && iw >= 0;  // else padding: x reads zero
        const Acc xv =
            inside ? M::load(x[(((n * p.in[0] + id) * p.in[1] + ih) * p.in[2] + iw) * p.C + c])
                   : Acc(0);
        acc += xv * M::load(dy[j * K + k]);
      }
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && e < total) {
      Acc sum = 0;
      for (int i = 0; i < kFiltRows; ++i) sum += partial[i][threadIdx.x];
      dw[e] = M::template store<Out>(sum);
    }
    __syncthreads();
  }
}

Support supports(const Args&) { return Support::Yes(); }
int64_t workspace_bytes(const Args&) { return 0; }

Status run(const Args& a, const Buffers& b, void*, cudaStream_t stream) {
  const Problem& p = a.p;
  Status status;
  auto launch = [&](auto in_tag, auto out_tag) {
    using In = device_t<decltype(in_tag)>;
    using Out = device_t<decltype(out_tag)>;
    constexpr int kThreads = 256;
    switch (a.dir) {
      case Direction::kFwd:
        direct_fwd_kernel<In, Out><<<cuda::grid_for(p.y_elems(), kThreads), kThreads, 0, stream>>>(
            p, static_cast<const In*>(b.x), static_cast<const In*>(b.w),
            static_cast<Out*>(b.result));
        status = cuda::check_launch("conv direct_fwd_kernel");
        break;
      case Direction::kBwdData:
        direct_bwd_data_kernel<In, Out>
            <<<cuda::grid_for(p.x_elems(), kThreads), kThreads, 0, stream>>>(
                p, static_cast<const In*>(b.y), static_cast<const In*>(b.w),
                static_cast<Out*>(b.result));
        status = cuda::check_launch("conv direct_bwd_data_kernel");
        break;
      case Direction::kBwdFilter:
        direct_bwd_filter_kernel<In, Out>
            <<<cuda::grid_for(p.w_elems(), kFiltLanes), dim3(kFiltLanes, kFiltRows), 0, stream>>>(
                p, static_cast<const In*>(b.x), static_cast<const In*>(b.y),
                static_cast<Out*>(b.result));
        status = cuda::check_launch("conv direct_bwd_filter_kernel");
        break;
    }
  };
  const bool ok = dispatch_io(a.in, a.out, launch) || dispatch_int_io(a.in, a.out, launch);
  if (!ok)
    return Status::Error(std::string("conv direct: unsupported dtypes ") + dtype_name(a.in) +
                         " -> " + dtype_name(a.out));
  return status;
}

}  // namespace

const CudaAlgorithm kCudaDirect = {"direct", /*deterministic=*/true, /*tensor_cores=*/false,
                                   supports, workspace_bytes, run};

}  // namespace jaxdnn::conv
