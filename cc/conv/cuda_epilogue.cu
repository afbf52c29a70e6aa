// The fused epilogue's pass on the GPU (epilogue.h): y = act(c + bias + residual), a flat grid of
// one thread per vector of kV elements (16 bytes: cuda_vec.h) when K is a multiple of kV and
// the tensors are 16-byte aligned (XLA's buffers are), else of one element; the vector's
// channel k by a multiply-high division (FastDiv: each launch covers fewer than 2^31 vectors).
// The arithmetic is apply_epilogue's (cuda_epilogue.cuh), the wgmma GEMMs' too; the activation
// is a run-time code (a uniform branch per vector), so one kernel serves every activation.
//
// Budget: at the H100's ~3 TB/s each SM retires a 16-byte vector per ~1.4 ns, ~180 thread
// instructions at 1.98 GHz; a 64-bit division costs ~100 of them, GELU's ~20 per element. A
// first version ran one 2-byte element per thread with a 64-bit modulo and lost to XLA's
// bias + GELU fusion by 2x on the same bytes (bench_fused.py, 1x1 + bias + GELU, bfloat16).
// Traffic: read c (in y, or its own buffer) and the residual, write y.

#include <algorithm>

#include "cc/common/cuda_util.h"
#include "cc/common/cuda_vec.h"
#include "cc/conv/cuda_algorithms.h"
#include "cc/conv/cuda_epilogue.cuh"

namespace jaxdnn::conv {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxVectors = int64_t(1) << 30;  // per launch: FastDiv's dividends

template <int kV, typename T>
__device__ __forceinline__ void load_n(const T* p, T (&v)[kV]) {
  if constexpr (kV == 1) {
    v[0] = p[0];
  } else {
    const auto w = cuda::Vec<T>::load_stream(p);
#pragma unroll
    for (int i = 0; i < kV; ++i) v[i] = w.v[i];
  }
}

// One thread: elements [kV iv, kV iv + kV) of y (rows x K), channels k.. k + kV - 1 of one row.
// src is c, or y itself (read, then written by the same thread: no __restrict__ on either).
template <typename T, int kV>
__global__ void __launch_bounds__(kThreads)
    epilogue_kernel(T* y, const T* src, const cuda::dev_acc_t<T>* __restrict__ bias,
                    const T* __restrict__ res, int nv, cuda::FastDiv kv, int act,
                    cuda::dev_acc_t<T> alpha) {
  cuda::await_prior_grids();
  const int iv = blockIdx.x * kThreads + threadIdx.x;
  if (iv >= nv) return;
  const int64_t i = int64_t(iv) * kV;
  const int k = (iv - kv.div(iv) * int(kv.d)) * kV;
  T v[kV], r[kV];
  load_n<kV>(src + i, v);
  if (res) load_n<kV>(res + i, r);
  apply_epilogue(v, bias, k, res ? r : nullptr, act, alpha);
  if constexpr (kV == 1) {
    y[i] = v[0];
  } else {
    cuda::Vec<T> out;
#pragma unroll
    for (int j = 0; j < kV; ++j) out.v[j] = v[j];
    out.store_stream(y + i);
  }
}

// Launches over y in pieces of whole rows, each fewer than kMaxVectors vectors.
template <typename T, int kV>
Status launch_epilogue(const Epilogue& e, const EpilogueBuffers& b, cudaStream_t stream) {
  using A = cuda::dev_acc_t<T>;
  const int64_t kv = e.K / kV, rows_per_launch = std::max<int64_t>(1, kMaxVectors / kv);
  if (kv >= kMaxVectors) return Status::Error("conv epilogue: more than 2^30 vectors per row");
  for (int64_t r0 = 0; r0 < e.rows; r0 += rows_per_launch) {
    const int64_t off = r0 * e.K, nv = std::min(rows_per_launch, e.rows - r0) * kv;
    const T* src = static_cast<const T*>(b.c ? b.c : b.y) + off;
    const T* res = b.residual ? static_cast<const T*>(b.residual) + off : nullptr;
    const Status s = cuda::launch(
        "conv epilogue_kernel", epilogue_kernel<T, kV>, cuda::grid_for(nv, kThreads), kThreads,
        0, stream, static_cast<T*>(b.y) + off, src, static_cast<const A*>(b.bias), res, int(nv),
        cuda::FastDiv(uint32_t(kv)), e.act ? int(e.op) : -1, A(e.alpha));
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

Status cuda_epilogue(const Epilogue& e, const EpilogueBuffers& b, cudaStream_t stream) {
  if (e.rows * e.K == 0) return Status::Ok();
  if (e.act && (int(e.op) < 0 || int(e.op) >= activation::kNumOps))
    return Status::Error("conv epilogue: unknown activation code");
  Status status = Status::Error(std::string("conv epilogue: unsupported dtype ") +
                                dtype_name(e.dtype));
  dispatch_io(e.dtype, e.dtype, [&](auto tag, auto) {
    using T = cuda::device_t<decltype(tag)>;
    constexpr int kV = cuda::Vec<T>::kN;
    const bool vec = e.K % kV == 0 && cuda::vec_aligned(b.y) && (!b.c || cuda::vec_aligned(b.c)) &&
                     (!b.residual || cuda::vec_aligned(b.residual));
    status = vec ? launch_epilogue<T, kV>(e, b, stream) : launch_epilogue<T, 1>(e, b, stream);
  });
  return status;
}

}  // namespace jaxdnn::conv
