// depthwise_3x3: a register-tiled kernel for the commonest depthwise layer (MobileNet's and
// EfficientNet's 3x3, stride 1, one output channel per input channel, channels-last), in all
// three directions. The general `depthwise` kernel stages a halo tile in shared memory and
// converts it to float; on this layer that staging, not memory, is its limit (~15% of the
// bandwidth bound, cuda_depthwise.cu). Here nothing is staged: neighbouring threads share the
// source rows through L1.
//
// Cost (64x56x56x144, bf16): 0.52 GFLOP against 116 MB of x and y, 28 us of HBM at 4 TB/s: a
// pure bandwidth problem (4.5 FLOP/byte). Each thread owns kCh = 4 channels (one 8-byte load
// in 16-bit types, 16 bytes in float32; 4 rather than 8 keeps the 9 filter taps, 36 floats, and
// the accumulators in ~90 registers, so 3 blocks of 256 threads fit per SM):
//   fwd / bwd_data  thread = (n, output column q, strip of TH = 4 output rows, kCh channels). The 9
//                   filter vectors sit in registers (as float); each of the strip's TH + 2
//                   source rows is loaded once (3 vectors: columns q-1..q+1) and feeds the up
//                   to 3 output rows that read it: 18 loads for 4 x 36 FMAs per thread. The
//                   column neighbours re-read the same rows from L1, the row strips overlap by
//                   2 rows (L2), so HBM sees x and y about once. bwd_data at stride 1 is the
//                   same correlation of dy with the flipped filter, padding 2 - pad.
//   bwd_filter      thread = (n, column q, a run of rows, kCh channels): dw(tap, c) partials for
//                   all 9 taps in 36 float registers, 1 dy + 9 x loads per output pixel (x rows
//                   from L1); the threads of a block that share channels are summed in a fixed
//                   order through shared memory into one partial per block, and a second
//                   kernel adds the block partials in block order (a warp per (tap, channel)):
//                   bitwise reproducible, no atomics.
// Channel groups are innermost across a warp, so every load or store instruction of a warp
// covers contiguous bytes of adjacent pixels.

#include <algorithm>
#include <cstdint>
#include <string>

#include "cc/common/cuda_util.h"
#include "cc/common/cuda_vec.h"
#include "cc/conv/cuda_algorithms.h"

namespace jaxdnn::conv {
namespace {

using cuda::device_t;

constexpr int kCh = 4;        // channels per thread
constexpr int kStrip = 4;     // output rows per thread (fwd / bwd_data)
constexpr int kThreads = 256;

// kCh consecutive channels at p (aligned to their size) as floats: one 16-byte load in
// float32, one 8-byte load in the 16-bit types.
template <typename T>
struct alignas(sizeof(T) * kCh) Chunk {
  T v[kCh];
};

template <typename T>
__device__ __forceinline__ void load_ch(const T* p, float (&v)[kCh]) {
  const Chunk<T> a = *reinterpret_cast<const Chunk<T>*>(p);
#pragma unroll
  for (int k = 0; k < kCh; ++k) v[k] = cuda::to_acc(a.v[k]);
}

template <typename T>
__device__ __forceinline__ void store_ch(T* p, const float (&v)[kCh]) {
  Chunk<T> a;
#pragma unroll
  for (int k = 0; k < kCh; ++k) a.v[k] = cuda::from_acc<T>(v[k]);
  *reinterpret_cast<Chunk<T>*>(p) = a;
}

// A correlation of src (n, hs, ws, C) with the 3x3 filter into dst (n, hd, wd, C), padding
// (ph, pw) before the first row/column; `flip` reads the filter rotated by 180 degrees.
struct Geo {
  int n, hs, ws, hd, wd, C, ph, pw;
  __host__ __device__ int cg() const { return C / kCh; }  // channel groups of kCh
};

template <typename In, typename Out>
__global__ void __launch_bounds__(kThreads)
depthwise3_conv_kernel(const In* __restrict__ src, const In* __restrict__ w, Out* __restrict__ dst,
                       Geo g, bool flip) {
  const int strips = (g.hd + kStrip - 1) / kStrip;
  const int64_t total = int64_t(g.n) * strips * g.wd * g.cg();
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int cgi = int(e % g.cg()), q = int(e / g.cg() % g.wd);
    const int strip = int(e / (int64_t(g.cg()) * g.wd) % strips);
    const int n = int(e / (int64_t(g.cg()) * g.wd * strips));
    const int c = cgi * kCh, p0 = strip * kStrip;
    float wt[9][kCh];
#pragma unroll
    for (int t = 0; t < 9; ++t) load_ch(w + int64_t(flip ? 8 - t : t) * g.C + c, wt[t]);
    float acc[kStrip][kCh] = {};
#pragma unroll
    for (int i = 0; i < kStrip + 2; ++i) {  // source row p0 - ph + i feeds output rows p0 + i - r
      const int h = p0 - g.ph + i;
      if (h < 0 || h >= g.hs) continue;
      float xv[3][kCh];
      const In* row = src + (int64_t(n) * g.hs + h) * g.ws * g.C + c;
#pragma unroll
      for (int s = 0; s < 3; ++s) {
        const int col = q - g.pw + s;
        if (col >= 0 && col < g.ws) load_ch(row + int64_t(col) * g.C, xv[s]);
        else
#pragma unroll
          for (int k = 0; k < kCh; ++k) xv[s][k] = 0.f;
      }
#pragma unroll
      for (int r = 0; r < 3; ++r) {
        const int t = i - r;
        if (t < 0 || t >= kStrip) continue;
#pragma unroll
        for (int s = 0; s < 3; ++s)
#pragma unroll
          for (int k = 0; k < kCh; ++k) acc[t][k] = fmaf(wt[r * 3 + s][k], xv[s][k], acc[t][k]);
      }
    }
#pragma unroll
    for (int t = 0; t < kStrip; ++t)
      if (p0 + t < g.hd) store_ch(dst + ((int64_t(n) * g.hd + p0 + t) * g.wd + q) * g.C + c, acc[t]);
  }
}

// bwd_filter, pass 1. Block = (qb columns) x (channel groups of kCh), thread (qi, cgi) with cgi
// fastest; block b covers image n = b / (col_blocks * row_blocks), columns
// [qb * (b / row_blocks % col_blocks), +qb), output rows [rows * (b % row_blocks), +rows).
// partial[b][tap][C] = the block's sum, its threads added in qi order.
struct FilterGeo {
  Geo g;  // src = x (hs, ws), the reduction runs over dy (hd = P, wd = Q)
  int qb, rows, col_blocks, row_blocks;
};

template <typename In>
__global__ void __launch_bounds__(kThreads)
depthwise3_filter_kernel(const In* __restrict__ x, const In* __restrict__ dy,
                         float* __restrict__ partial, FilterGeo f) {
  extern __shared__ float sums[];  // [qb][channel group][9 * kCh]
  const Geo& g = f.g;
  const int cgs = g.cg(), cgi = threadIdx.x % cgs, qi = threadIdx.x / cgs;
  const int b = blockIdx.x;
  const int n = b / (f.col_blocks * f.row_blocks);
  const int q = (b / f.row_blocks % f.col_blocks) * f.qb + qi;
  const int p_begin = (b % f.row_blocks) * f.rows, p_end = min(g.hd, p_begin + f.rows);
  const int c = cgi * kCh;
  float acc[9][kCh] = {};
  if (qi < f.qb && q < g.wd) {
    for (int p = p_begin; p < p_end; ++p) {
      float d[kCh];
      load_ch(dy + ((int64_t(n) * g.hd + p) * g.wd + q) * g.C + c, d);
#pragma unroll
      for (int r = 0; r < 3; ++r) {
        const int h = p - g.ph + r;
        if (h < 0 || h >= g.hs) continue;
        const In* row = x + (int64_t(n) * g.hs + h) * g.ws * g.C + c;
#pragma unroll
        for (int s = 0; s < 3; ++s) {
          const int col = q - g.pw + s;
          if (col < 0 || col >= g.ws) continue;
          float xv[kCh];
          load_ch(row + int64_t(col) * g.C, xv);
#pragma unroll
          for (int k = 0; k < kCh; ++k) acc[r * 3 + s][k] = fmaf(xv[k], d[k], acc[r * 3 + s][k]);
        }
      }
    }
  }
  if (qi < f.qb) {
    float* mine = sums + (qi * cgs + cgi) * 9 * kCh;
#pragma unroll
    for (int t = 0; t < 9; ++t)
#pragma unroll
      for (int k = 0; k < kCh; ++k) mine[t * kCh + k] = acc[t][k];
  }
  __syncthreads();
  // Fixed-order sum over qi of each (channel group, tap, channel): 72 values per group.
  for (int j = threadIdx.x; j < cgs * 9 * kCh; j += blockDim.x) {
    const int cg = j / (9 * kCh), tk = j % (9 * kCh);
    float s = 0.f;
    for (int i = 0; i < f.qb; ++i) s += sums[(i * cgs + cg) * 9 * kCh + tk];
    const int tap = tk / kCh, k = tk % kCh;
    partial[(int64_t(b) * 9 + tap) * g.C + cg * kCh + k] = s;
  }
}

// Pass 2: dw[tap][c] = sum over blocks in order; a warp per output, lanes take blocks
// lane, lane + 32, ... and combine in a fixed shuffle tree.
template <typename Out>
__global__ void depthwise3_filter_sum_kernel(const float* __restrict__ partial,
                                             Out* __restrict__ dw, int blocks, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t outputs = 9 * int64_t(C);
  for (int64_t o = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; o < outputs;
       o += int64_t(gridDim.x) * blockDim.x / 32) {
    float s = 0.f;
    for (int b = lane; b < blocks; b += 32) s += partial[int64_t(b) * outputs + o];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) dw[o] = cuda::from_acc<Out>(s);
  }
}

Support supports(const Args& a) {
  const Problem& p = a.p;
  if (a.in != DType::kBF16 && a.in != DType::kF16 && a.in != DType::kF32)
    return Support::No("bfloat16, float16 or float32 inputs only");
  if (a.out != a.in && a.out != DType::kF32)
    return Support::No("the result must have the input dtype or float32");
  if (p.G != p.C || p.K != p.C)
    return Support::No("needs groups == C == K (one output channel per input channel)");
  if (p.filt[0] != 1 || p.filt[1] != 3 || p.filt[2] != 3 || p.in[0] != 1)
    return Support::No("2-D 3x3 filters only");
  for (int i = 0; i < 3; ++i)
    if (p.stride[i] != 1 || p.rhs_dil[i] != 1 || p.lhs_dil[i] != 1)
      return Support::No("stride 1 and no dilation only");
  if (p.C % kCh != 0 || p.C / kCh > kThreads)
    return Support::No("C must be a multiple of " + std::to_string(kCh) + ", at most " +
                       std::to_string(kCh * kThreads));
  if (p.x_elems() >= (int64_t(1) << 31) || p.y_elems() >= (int64_t(1) << 31))
    return Support::No("tensors of 2^31 or more elements are not supported");
  return Support::Yes();
}

Geo conv_geo(const Problem& p) {  // fwd: x -> y
  return {int(p.N), int(p.in[1]), int(p.in[2]), int(p.out[1]), int(p.out[2]), int(p.C),
          int(p.pad_lo[1]), int(p.pad_lo[2])};
}

FilterGeo filter_geo(const Problem& p) {
  FilterGeo f;
  f.g = conv_geo(p);
  const int cgs = f.g.cg();
  f.qb = std::max(1, std::min(kThreads / cgs, f.g.wd));
  f.col_blocks = (f.g.wd + f.qb - 1) / f.qb;
  // Enough blocks to fill the GPU about twice (132 SMs), by cutting the rows.
  const int64_t base = int64_t(f.g.n) * f.col_blocks;
  f.row_blocks = int(std::min<int64_t>(f.g.hd, std::max<int64_t>(1, (264 + base - 1) / base)));
  f.rows = (f.g.hd + f.row_blocks - 1) / f.row_blocks;
  f.row_blocks = (f.g.hd + f.rows - 1) / f.rows;
  return f;
}

int64_t filter_blocks(const FilterGeo& f) {
  return int64_t(f.g.n) * f.col_blocks * f.row_blocks;
}

int64_t workspace_bytes(const Args& a) {
  if (a.dir != Direction::kBwdFilter) return 0;
  return align256(filter_blocks(filter_geo(a.p)) * 9 * a.p.C * int64_t(sizeof(float)));
}

template <typename In, typename Out>
Status run_typed(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  const Problem& p = a.p;
  const In* w = static_cast<const In*>(b.w);
  if (a.dir != Direction::kBwdFilter) {
    Geo g = conv_geo(p);
    const bool fwd = a.dir == Direction::kFwd;
    if (!fwd) {  // dx = dy correlated with the flipped filter, padding 2 - pad
      g = {int(p.N), int(p.out[1]), int(p.out[2]), int(p.in[1]), int(p.in[2]), int(p.C),
           2 - int(p.pad_lo[1]), 2 - int(p.pad_lo[2])};
    }
    const int64_t total =
        int64_t(g.n) * ((g.hd + kStrip - 1) / kStrip) * g.wd * g.cg();
    if (total == 0) return Status::Ok();
    depthwise3_conv_kernel<In, Out><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<const In*>(fwd ? b.x : b.y), w, static_cast<Out*>(b.result), g, !fwd);
    return cuda::check_launch("conv depthwise3_conv_kernel");
  }
  const FilterGeo f = filter_geo(p);
  const int64_t blocks = filter_blocks(f);
  float* partial = static_cast<float*>(ws);
  if (blocks > 0) {
    const int smem = f.qb * f.g.cg() * 9 * kCh * int(sizeof(float));
    auto kernel = depthwise3_filter_kernel<In>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
        cudaSuccess)
      return cuda::check_launch("conv depthwise3_filter_kernel");
    kernel<<<unsigned(blocks), f.qb * f.g.cg(), smem, stream>>>(
        static_cast<const In*>(b.x), static_cast<const In*>(b.y), partial, f);
    if (Status st = cuda::check_launch("conv depthwise3_filter_kernel"); !st.ok()) return st;
  }
  depthwise3_filter_sum_kernel<Out><<<cuda::grid_for(9 * p.C * 32, kThreads), kThreads, 0,
                                      stream>>>(partial, static_cast<Out*>(b.result),
                                                int(blocks), int(p.C));
  return cuda::check_launch("conv depthwise3_filter_sum_kernel");
}

Status run(const Args& a, const Buffers& b, void* ws, cudaStream_t stream) {
  Status status = Status::Error("conv depthwise_3x3: unsupported dtypes");
  dispatch_io(a.in, a.out, [&](auto in_tag, auto out_tag) {
    using In = device_t<decltype(in_tag)>;
    using Out = device_t<decltype(out_tag)>;
    if constexpr (sizeof(In) <= 4) status = run_typed<In, Out>(a, b, ws, stream);  // no f64
  });
  return status;
}

}  // namespace

const CudaAlgorithm kCudaDepthwise3x3 = {"depthwise_3x3", /*deterministic=*/true,
                                         /*tensor_cores=*/false, supports, workspace_bytes, run};

}  // namespace jaxdnn::conv
