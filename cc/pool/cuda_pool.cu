// CUDA pooling kernels for any window, and the dispatcher of every pooling op.
//
//   window_fwd   max_fwd, max_fwd_index, avg_fwd: one thread per (output position, G vectors
//                of V channels); it walks the window's valid taps. Traffic: x read once from
//                DRAM (overlapping windows re-read taps from L1/L2), y (and idx) written once:
//                N*D*H*W*C + N*Z*P*Q*C elements (+ N*Z*P*Q*C index bytes).
//   window_bwd   max_scatter, avg_bwd, as a gather: one thread per (input position, G vectors
//                of V channels) visits the windows covering it (2.25 on average for 3x3
//                stride 2) and sums dy where the window selected it (max) or dy/divisor (avg).
//                No atomics: deterministic. Traffic: dy (and idx) read once, dx written once.
//   max_gather   the jvp of max pooling: t at each window's selected element, one thread per
//                output element (a per-channel gather; not a training hot path).
// Global windows (one window covering the whole input) go to cuda_global.cu, which splits the
// window across threads and blocks.
//
// Vectors: V = 16 bytes of channels when C allows and the buffers are aligned (V = 1 otherwise),
// and G = 2 vectors per thread when a position has at least 16 vectors, which halves the index
// arithmetic while each load instruction of a warp still covers contiguous 128-byte lines.

#include <type_traits>

#include "cc/pool/cuda_common.cuh"
#include "cc/pool/cuda_pool.h"

namespace jaxdnn::pool::gpu {
namespace {

// At least 3 resident blocks (768 threads) per SM: up to 85 registers, enough for the widest
// accumulators (2 vectors of 8 bf16 channels with their indices) without spilling, and enough
// loads in flight to cover the memory latency.
constexpr int kMinBlocks = 3;

template <typename T, int V, int G, Reduce R, typename Idx>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
window_fwd_kernel(Geom g, const T* __restrict__ x, T* __restrict__ y, Idx* __restrict__ idx,
                  bool include_pad) {
  using A = dev_acc_t<T>;
  const int32_t items = g.N * g.out_spatial() * g.lanes;
  for (int64_t i = blockIdx.x * kThreads + threadIdx.x; i < items; i += gridDim.x * kThreads) {
    const int32_t e = int32_t(i);  // (the 64-bit counter cannot overflow past `items`)
    int32_t lane, z, pp, q;
    const int32_t pos = g.lanes_div.divmod(e, &lane);  // output position (n, z, pp, q)
    const int32_t n = g.split(pos, g.out_div, &z, &pp, &q);
    int32_t zs, z0, z1, ps, p0, p1, qs, q0, q1;
    g.window_span(0, z, &zs, &z0, &z1);
    g.window_span(1, pp, &ps, &p0, &p1);
    g.window_span(2, q, &qs, &q0, &q1);
    const T* xn = x + n * g.in_spatial() * g.C + lane * V;
    WindowState<A, G * V, R> st;
    st.init();
    for (int32_t d = z0; d < z1; ++d)
      for (int32_t h = p0; h < p1; ++h) {
        const T* row = xn + (d * g.in[1] + h) * g.in[2] * g.C;
        const int32_t k0 = ((d - zs) * g.window[1] + (h - ps)) * g.window[2] - qs;
#pragma unroll 3
        for (int32_t w = q0; w < q1; ++w) {
          A v[G * V];
#pragma unroll
          for (int j = 0; j < G; ++j)
            load_channels<T, V>(row + w * g.C + j * g.lanes * V, v + j * V);
#pragma unroll
          for (int i = 0; i < G * V; ++i) st.add(i, v[i], k0 + w);
        }
      }
    A inv = A(1);
    if constexpr (R == Reduce::kAvg)  // 1/0 = inf for a window of only padding: NaN, as flax
      inv = A(1) / A(include_pad ? g.window_size() : (z1 - z0) * (p1 - p0) * (q1 - q0));
    const int32_t out = pos * g.C + lane * V;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int32_t o = out + j * g.lanes * V;
      st.template store<T, V, Idx>(j * V, y + o, R == Reduce::kMaxIndex ? idx + o : nullptr, inv);
    }
  }
}

template <typename T, int V, int G, bool kMax, typename Idx>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
window_bwd_kernel(Geom g, const T* __restrict__ dy, const Idx* __restrict__ idx,
                  T* __restrict__ dx, bool include_pad) {
  using A = dev_acc_t<T>;
  const int32_t items = g.N * g.in_spatial() * g.lanes;
  for (int64_t i = blockIdx.x * kThreads + threadIdx.x; i < items; i += gridDim.x * kThreads) {
    const int32_t e = int32_t(i);  // (the 64-bit counter cannot overflow past `items`)
    int32_t lane, d, h, w;
    const int32_t pos = g.lanes_div.divmod(e, &lane);  // input position (n, d, h, w)
    const int32_t n = g.split(pos, g.in_div, &d, &h, &w);
    int32_t z0, z1, p0, p1, q0, q1;
    g.covering(0, d, &z0, &z1);
    g.covering(1, h, &p0, &p1);
    g.covering(2, w, &q0, &q1);
    const int32_t yn = n * g.out[0];  // first output plane of image n
    A sum[G * V];
#pragma unroll
    for (int i = 0; i < G * V; ++i) sum[i] = A(0);
    for (int32_t z = z0; z < z1; ++z)
      for (int32_t pp = p0; pp < p1; ++pp)
#pragma unroll 2
        for (int32_t q = q0; q < q1; ++q) {
          const int32_t off = (((yn + z) * g.out[1] + pp) * g.out[2] + q) * g.C + lane * V;
          int32_t k = 0;  // this input's index inside window (z, pp, q)
          A scale = A(1);
          if constexpr (kMax) {
            k = ((d - z * g.stride[0] + g.pad_lo[0]) * g.window[1] +
                 (h - pp * g.stride[1] + g.pad_lo[1])) * g.window[2] +
                (w - q * g.stride[2] + g.pad_lo[2]);
          } else if (include_pad) {
            scale = A(1) / A(g.window_size());
          } else {
            int32_t s, a0, a1, b0, b1, c0, c1;
            g.window_span(0, z, &s, &a0, &a1);
            g.window_span(1, pp, &s, &b0, &b1);
            g.window_span(2, q, &s, &c0, &c1);
            scale = A(1) / A((a1 - a0) * (b1 - b0) * (c1 - c0));
          }
#pragma unroll
          for (int j = 0; j < G; ++j) {
            A v[V];
            load_channels<T, V>(dy + off + j * g.lanes * V, v);
            if constexpr (kMax) {
              const IdxVec<Idx, V> iv =
                  *reinterpret_cast<const IdxVec<Idx, V>*>(idx + off + j * g.lanes * V);
#pragma unroll
              for (int i = 0; i < V; ++i) sum[j * V + i] += int32_t(iv.v[i]) == k ? v[i] : A(0);
            } else {
#pragma unroll
              for (int i = 0; i < V; ++i) sum[j * V + i] += v[i] * scale;
            }
          }
        }
    const int32_t out = pos * g.C + lane * V;
#pragma unroll
    for (int j = 0; j < G; ++j) store_channels<T, V>(dx + out + j * g.lanes * V, sum + j * V);
  }
}

template <typename T, typename Idx>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
max_gather_kernel(Geom g, const T* __restrict__ t, const Idx* __restrict__ idx,
                  T* __restrict__ y) {
  const int32_t items = g.N * g.out_spatial() * g.C;  // lanes == C: one channel per thread
  const int32_t RS = g.window[1] * g.window[2];
  for (int64_t i = blockIdx.x * kThreads + threadIdx.x; i < items; i += gridDim.x * kThreads) {
    const int32_t e = int32_t(i);  // (the 64-bit counter cannot overflow past `items`)
    int32_t c, z, pp, q;
    const int32_t pos = g.lanes_div.divmod(e, &c);
    const int32_t n = g.split(pos, g.out_div, &z, &pp, &q);
    const Idx k = idx[e];
    if (k == kNoIndex<Idx>) {
      y[e] = from_acc<T>(0.0f);
      continue;
    }
    const int32_t kk = int32_t(k);
    const int32_t d = z * g.stride[0] - g.pad_lo[0] + kk / RS;
    const int32_t h = pp * g.stride[1] - g.pad_lo[1] + kk / g.window[2] % g.window[1];
    const int32_t w = q * g.stride[2] - g.pad_lo[2] + kk % g.window[2];
    y[e] = t[((n * g.in[0] + d) * g.in[1] + h) * g.in[2] * g.C + w * g.C + c];
  }
}

// ---- host side ----

struct Layout {
  int vec;     // channels per vector: the 16-byte width, or 1
  int groups;  // vectors per thread
};

template <typename T, typename Idx>
Layout choose_layout(const Problem& p, const Buffers& b) {
  constexpr int kN = cuda::Vec<T>::kN;
  const void* index = b.index_in != nullptr ? b.index_in : b.index_out;
  if (p.C % kN != 0 || !aligned(b.a, cuda::kVecBytes) || !aligned(b.result, cuda::kVecBytes) ||
      !aligned(index, alignof(IdxVec<Idx, kN>)))
    return {1, 1};
  // Two vectors per thread when a position has >= 16 (8+ lanes still read 128 contiguous
  // bytes); not with int32 indices, whose 32-byte index vectors would not fit the registers.
  const bool pair = p.C / kN >= 16 && (p.C / kN) % 2 == 0 && sizeof(Idx) == 1;
  return {kN, pair ? 2 : 1};
}

// Calls fn(integral_constant V, integral_constant G) for the layout (G = 2 only compiled
// where choose_layout can pick it).
template <int kN, bool kPairs, typename Fn>
void with_layout(Layout l, Fn&& fn) {
  using One = std::integral_constant<int, 1>;
  if (l.vec == 1) fn(One{}, One{});
  else if constexpr (kPairs) {
    if (l.groups == 2) fn(std::integral_constant<int, kN>{}, std::integral_constant<int, 2>{});
    else fn(std::integral_constant<int, kN>{}, One{});
  } else {
    fn(std::integral_constant<int, kN>{}, One{});
  }
}

template <typename T, typename Idx>
Status run_typed(const Args& a, const Buffers& b, cudaStream_t stream) {
  const Problem& p = a.p;
  constexpr int kN = cuda::Vec<T>::kN;
  const int64_t xi = p.in_spatial() * p.C, yi = p.out_spatial() * p.C;  // per image
  const T* in = static_cast<const T*>(b.a);
  T* out = static_cast<T*>(b.result);
  const Idx* idx_in = static_cast<const Idx*>(b.index_in);
  Idx* idx_out = static_cast<Idx*>(b.index_out);
  const bool inc = a.count_include_pad;
  Status status;

  if (a.op == Op::kMaxGather) {
    return over_batch_slices(p, int32_t(p.C), [&](const Geom& g, int64_t n0) {
      const int64_t items = g.N * p.out_spatial() * p.C;
      max_gather_kernel<T, Idx><<<cuda::grid_for(items, kThreads), kThreads, 0, stream>>>(
          g, in + n0 * xi, idx_in + n0 * yi, out + n0 * yi);
      return cuda::check_launch("pool max_gather_kernel");
    });
  }
  const bool bwd = a.op == Op::kMaxScatter || a.op == Op::kAvgBwd;
  const Layout layout = choose_layout<T, Idx>(p, b);
  with_layout<kN, sizeof(Idx) == 1>(layout, [&](auto v_c, auto g_c) {
    constexpr int V = decltype(v_c)::value, G = decltype(g_c)::value;
    const int32_t lanes = int32_t(p.C / (V * G));
    status = over_batch_slices(p, lanes, [&](const Geom& g, int64_t n0) {
      const int64_t items = g.N * (bwd ? p.in_spatial() : p.out_spatial()) * lanes;
      const unsigned blocks = cuda::grid_for(items, kThreads);
      switch (a.op) {
        case Op::kMaxFwd:
          window_fwd_kernel<T, V, G, Reduce::kMax, uint8_t><<<blocks, kThreads, 0, stream>>>(
              g, in + n0 * xi, out + n0 * yi, nullptr, inc);
          return cuda::check_launch("pool window_fwd_kernel (max)");
        case Op::kMaxFwdIndex:
          window_fwd_kernel<T, V, G, Reduce::kMaxIndex, Idx><<<blocks, kThreads, 0, stream>>>(
              g, in + n0 * xi, out + n0 * yi, idx_out + n0 * yi, inc);
          return cuda::check_launch("pool window_fwd_kernel (max with index)");
        case Op::kAvgFwd:
          window_fwd_kernel<T, V, G, Reduce::kAvg, uint8_t><<<blocks, kThreads, 0, stream>>>(
              g, in + n0 * xi, out + n0 * yi, nullptr, inc);
          return cuda::check_launch("pool window_fwd_kernel (avg)");
        case Op::kMaxScatter:
          window_bwd_kernel<T, V, G, true, Idx><<<blocks, kThreads, 0, stream>>>(
              g, in + n0 * yi, idx_in + n0 * yi, out + n0 * xi, inc);
          return cuda::check_launch("pool window_bwd_kernel (max)");
        case Op::kAvgBwd:
          window_bwd_kernel<T, V, G, false, uint8_t><<<blocks, kThreads, 0, stream>>>(
              g, in + n0 * yi, nullptr, out + n0 * xi, inc);
          return cuda::check_launch("pool window_bwd_kernel (avg)");
        default:
          return Status::Error("pool: unexpected op");
      }
    });
  });
  return status;
}

}  // namespace
}  // namespace jaxdnn::pool::gpu

namespace jaxdnn::pool {

Status cuda_run(const Args& a, const Buffers& b, cudaStream_t stream) {
  Status s = validate(a.p);
  if (!s.ok()) return s;
  const bool fwd = a.op == Op::kMaxFwd || a.op == Op::kMaxFwdIndex || a.op == Op::kAvgFwd;
  if (fwd && a.p.global()) return gpu::global_fwd(a, b, stream);
  const bool ok = dispatch_io(a.dtype, a.dtype, [&](auto tag, auto) {
    using T = cuda::device_t<decltype(tag)>;
    s = a.index == IndexType::kU8 ? gpu::run_typed<T, uint8_t>(a, b, stream)
                                  : gpu::run_typed<T, int32_t>(a, b, stream);
  });
  if (!ok) return Status::Error(std::string("pool: unsupported dtype ") + dtype_name(a.dtype));
  return s;
}

}  // namespace jaxdnn::pool
