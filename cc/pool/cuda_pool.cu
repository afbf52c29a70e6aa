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
// Forward columns: J = 2 adjacent output columns per thread (choose_layout) when the windows
// leave no gap and the state fits (J*G*V <= 16 channels). A 2x2/2 bf16 pool at C = 64 had one
// 16-byte vector and 4 taps per thread: 64 bytes read per ~60 instructions of index math, and
// only one row of taps (32 bytes) in flight. With J = 2 a thread walks the 4 contiguous taps
// of each window row once (128 bytes per row of taps, 4 loads in flight), and 3x3/2 windows
// read 5 columns instead of 6. Traffic unchanged: x read once from DRAM, y written once.

#include <type_traits>

#include "cc/pool/cuda_common.cuh"
#include "cc/pool/cuda_pool.h"

namespace jaxdnn::pool::gpu {
namespace {

// At least 3 resident blocks (768 threads) per SM: up to 85 registers, enough for the widest
// accumulators (2 vectors of 8 bf16 channels with their indices) without spilling, and enough
// loads in flight to cover the memory latency.
constexpr int kMinBlocks = 3;

template <typename T, int V, int G, int J, Reduce R, typename Idx>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
window_fwd_kernel(Geom g, FastDiv q_groups, const T* __restrict__ x, T* __restrict__ y,
                  Idx* __restrict__ idx, bool include_pad) {
  using A = dev_acc_t<T>;
  const int32_t items = g.N * g.out[0] * g.out[1] * int32_t(q_groups.d) * g.lanes;
  for (int64_t i = blockIdx.x * kThreads + threadIdx.x; i < items; i += gridDim.x * kThreads) {
    const int32_t e = int32_t(i);  // (the 64-bit counter cannot overflow past `items`)
    int32_t lane, z, pp, qg;
    const int32_t pos = g.lanes_div.divmod(e, &lane);  // (n, z, pp, group of J columns)
    const int32_t n = g.out_div[0].divmod(g.out_div[1].divmod(q_groups.divmod(pos, &qg), &pp), &z);
    int32_t zs, z0, z1, ps, p0, p1;
    g.window_span(0, z, &zs, &z0, &z1);
    g.window_span(1, pp, &ps, &p0, &p1);
    // Output columns q_j = qg*J + j (those < Q), their window starts qs[j] and input columns
    // [w0[j], w1[j]); the row loop walks the union [w0[0], w_end) once, each tap going to the
    // windows that hold it.
    int32_t qs[J], w0[J], w1[J], w_end = 0;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int32_t q = qg * J + j;
      g.window_span(2, q, &qs[j], &w0[j], &w1[j]);
      if (q >= g.out[2]) w0[j] = w1[j] = 0;  // past the edge: an empty window, never stored
      w_end = max(w_end, w1[j]);
    }
    const T* xn = x + n * g.in_spatial() * g.C + lane * V;
    WindowState<A, G * V, R> st[J];
#pragma unroll
    for (int j = 0; j < J; ++j) st[j].init();
    for (int32_t d = z0; d < z1; ++d)
      for (int32_t h = p0; h < p1; ++h) {
        const T* row = xn + (d * g.in[1] + h) * g.in[2] * g.C;
        const int32_t k0 = ((d - zs) * g.window[1] + (h - ps)) * g.window[2];
#pragma unroll 4
        for (int32_t w = w0[0]; w < w_end; ++w) {
          A v[G * V];
#pragma unroll
          for (int k = 0; k < G; ++k)
            load_channels<T, V>(row + w * g.C + k * g.lanes * V, v + k * V);
#pragma unroll
          for (int j = 0; j < J; ++j)
            if (w >= w0[j] && w < w1[j])
#pragma unroll
              for (int c = 0; c < G * V; ++c) st[j].add(c, v[c], k0 + w - qs[j]);
        }
      }
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int32_t q = qg * J + j;
      if (q >= g.out[2]) break;
      A inv = A(1);
      if constexpr (R == Reduce::kAvg)  // 1/0 = inf for a window of only padding: NaN, as flax
        inv = A(1) / A(include_pad ? g.window_size() : (z1 - z0) * (p1 - p0) * (w1[j] - w0[j]));
      const int32_t out = (((n * g.out[0] + z) * g.out[1] + pp) * g.out[2] + q) * g.C + lane * V;
#pragma unroll
      for (int k = 0; k < G; ++k) {
        const int32_t o = out + k * g.lanes * V;
        st[j].template store<T, V, Idx>(k * V, y + o, R == Reduce::kMaxIndex ? idx + o : nullptr,
                                        inv);
      }
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
  int cols;    // output columns per thread (forward)
};

template <typename T, typename Idx>
Layout choose_layout(const Problem& p, const Buffers& b, bool fwd) {
  constexpr int kN = cuda::Vec<T>::kN;
  const void* index = b.index_in != nullptr ? b.index_in : b.index_out;
  Layout l{1, 1, 1};
  if (p.C % kN == 0 && aligned(b.a, cuda::kVecBytes) && aligned(b.result, cuda::kVecBytes) &&
      aligned(index, alignof(IdxVec<Idx, kN>))) {
    // Two vectors per thread when a position has >= 16 (8+ lanes still read 128 contiguous
    // bytes); not with int32 indices, whose 32-byte index vectors would not fit the registers.
    const bool pair = p.C / kN >= 16 && (p.C / kN) % 2 == 0 && sizeof(Idx) == 1;
    l = {kN, pair ? 2 : 1, 1};
  }
  // Two output columns per thread in the forward (up to 16 channels of state each), when
  // their windows leave no gap between them (stride <= window): twice the bytes in flight
  // per thread for the same index arithmetic, and taps shared by both windows read once.
  if (fwd && p.out[2] >= 2 && p.stride[2] <= p.window[2] && l.vec * l.groups * 2 <= 16)
    l.cols = 2;
  return l;
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
  const Layout layout = choose_layout<T, Idx>(p, b, !bwd);
  with_layout<kN, sizeof(Idx) == 1>(layout, [&](auto v_c, auto g_c) {
    constexpr int V = decltype(v_c)::value, G = decltype(g_c)::value;
    const int32_t lanes = int32_t(p.C / (V * G));
    status = over_batch_slices(p, lanes, [&](const Geom& g, int64_t n0) {
      // Forward reduction R with selection indices of type I (index: nullptr without), over
      // groups of `layout.cols` output columns (2 only compiled where choose_layout can pick
      // it, and with one-byte indices).
      auto forward = [&](auto r_c, auto* index, const char* name) {
        using I = std::remove_pointer_t<decltype(index)>;
        auto launch = [&](auto j_c) {
          constexpr int J = decltype(j_c)::value;
          const int64_t groups = (p.out[2] + J - 1) / J;
          const int64_t items = g.N * p.out[0] * p.out[1] * groups * lanes;
          if (items == 0) return;
          window_fwd_kernel<T, V, G, J, decltype(r_c)::value, I>
              <<<cuda::grid_for(items, kThreads), kThreads, 0, stream>>>(
                  g, FastDiv(uint32_t(groups)), in + n0 * xi, out + n0 * yi, index, inc);
        };
        if constexpr (sizeof(I) == 1 && V * G * 2 <= 16) {
          if (layout.cols == 2) launch(std::integral_constant<int, 2>{});
          else launch(std::integral_constant<int, 1>{});
        } else {
          launch(std::integral_constant<int, 1>{});
        }
        return cuda::check_launch(name);
      };
      using RC = std::integral_constant<Reduce, Reduce::kMax>;
      using RI = std::integral_constant<Reduce, Reduce::kMaxIndex>;
      using RA = std::integral_constant<Reduce, Reduce::kAvg>;
      uint8_t* const no_index = nullptr;
      const unsigned blocks = cuda::grid_for(g.N * p.in_spatial() * lanes, kThreads);
      switch (a.op) {
        case Op::kMaxFwd:
          return forward(RC{}, no_index, "pool window_fwd_kernel (max)");
        case Op::kMaxFwdIndex:
          return forward(RI{}, idx_out + n0 * yi, "pool window_fwd_kernel (max with index)");
        case Op::kAvgFwd:
          return forward(RA{}, no_index, "pool window_fwd_kernel (avg)");
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
