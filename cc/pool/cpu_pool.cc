// CPU pooling kernels: every op of pool.h, channels-last.
//
// A task is one output row (n, z, p) for the ops that write y, or one input row (n, d, h) for
// the backward ops that write dx; tasks run on the intra-op pool. Inside a task, channels go
// in chunks of kChunk accumulators (a few vector registers, always in L1) and each window tap
// (or covering window, for the backward ops) is one pass over a contiguous chunk of C, which
// the compiler vectorises. Each row function is compiled for AVX-512, AVX2 and baseline x86-64
// and picked at run time (target_clones).
//
// Traffic: the forward ops read x once from memory (taps of overlapping windows hit in cache)
// and write y; the backward ops read dy (and idx) and write dx once. Accumulation in float
// (double for float64); results are independent of the thread count.

#include <algorithm>
#include <type_traits>

#include "cc/pool/pool.h"

namespace jaxdnn::pool {
namespace {

#define JAXDNN_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

constexpr int64_t kChunk = 64;  // channels per accumulator chunk

template <typename T> inline T from_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, double>) return v; else return store_as_f<T>(v);
}

// The max selection rule of pool.h: v replaces the current selection s when it is greater,
// NaN being greater than any number.
template <typename A> inline bool greater(A v, A s) { return v > s || (v != v && s == s); }

// Flat spatial offset and window index of every valid tap of the window (sz, sp, sq), in tap
// order: fn(pos, k) with pos = (d*H + h)*W + w.
template <typename Fn>
inline void for_each_tap(const Problem& p, const Span& sz, const Span& sp, const Span& sq, Fn fn) {
  for (int64_t d = sz.lo; d < sz.hi; ++d)
    for (int64_t h = sp.lo; h < sp.hi; ++h) {
      const int64_t k0 = ((d - sz.start) * p.window[1] + (h - sp.start)) * p.window[2] - sq.start;
      const int64_t pos0 = (d * p.in[1] + h) * p.in[2];
      for (int64_t w = sq.lo; w < sq.hi; ++w) fn(pos0 + w, k0 + w);
    }
}

// Every window covering input (d, h, w), in output order: fn(opos, k) with opos the output's
// flat spatial offset and k the input's index inside that window.
template <typename Fn>
inline void for_each_window(const Problem& p, int64_t d, int64_t h, int64_t w, Fn fn) {
  const Span cz = p.covering(0, d), cp = p.covering(1, h), cq = p.covering(2, w);
  for (int64_t z = cz.lo; z < cz.hi; ++z)
    for (int64_t pp = cp.lo; pp < cp.hi; ++pp)
      for (int64_t q = cq.lo; q < cq.hi; ++q) {
        const int64_t k = ((d - p.window_span(0, z).start) * p.window[1] +
                           (h - p.window_span(1, pp).start)) * p.window[2] +
                          (w - p.window_span(2, q).start);
        fn((z * p.out[1] + pp) * p.out[2] + q, k);
      }
}

// y (and idx) of output row (n, z, pp).
template <typename T, typename Idx, bool kIndex>
JAXDNN_CPU_CLONES void max_fwd_row(const Problem& p, const T* x, T* y, Idx* idx, int64_t n,
                                   int64_t z, int64_t pp) {
  using A = acc_t<T>;
  const int64_t C = p.C, Q = p.out[2];
  const T* xn = x + n * p.in_spatial() * C;
  const Span sz = p.window_span(0, z), sp = p.window_span(1, pp);
  for (int64_t q = 0; q < Q; ++q) {
    const Span sq = p.window_span(2, q);
    const int64_t out = (((n * p.out[0] + z) * p.out[1] + pp) * Q + q) * C;
    for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
      const int64_t cw = std::min(kChunk, C - c0);
      A sel[kChunk];
      int32_t ix[kChunk];
      for (int64_t c = 0; c < cw; ++c) sel[c] = -std::numeric_limits<A>::infinity();
      if constexpr (kIndex)
        for (int64_t c = 0; c < cw; ++c) ix[c] = int32_t(kNoIndex<Idx>);
      for_each_tap(p, sz, sp, sq, [&](int64_t pos, int64_t k) {
        const T* xp = xn + pos * C + c0;
        for (int64_t c = 0; c < cw; ++c) {
          const A v = load_acc(xp[c]);
          const bool take = greater(v, sel[c]);
          sel[c] = take ? v : sel[c];
          if constexpr (kIndex) ix[c] = take ? int32_t(k) : ix[c];
        }
      });
      for (int64_t c = 0; c < cw; ++c) y[out + c0 + c] = from_acc<T>(sel[c]);
      if constexpr (kIndex)
        for (int64_t c = 0; c < cw; ++c) idx[out + c0 + c] = Idx(ix[c]);
    }
  }
}

template <typename T>
JAXDNN_CPU_CLONES void avg_fwd_row(const Problem& p, const T* x, T* y, bool include_pad,
                                   int64_t n, int64_t z, int64_t pp) {
  using A = acc_t<T>;
  const int64_t C = p.C, Q = p.out[2];
  const T* xn = x + n * p.in_spatial() * C;
  const Span sz = p.window_span(0, z), sp = p.window_span(1, pp);
  for (int64_t q = 0; q < Q; ++q) {
    const Span sq = p.window_span(2, q);
    const A inv = A(1) / A(p.divisor(include_pad, sz, sp, sq));  // inf for an empty window
    const int64_t out = (((n * p.out[0] + z) * p.out[1] + pp) * Q + q) * C;
    for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
      const int64_t cw = std::min(kChunk, C - c0);
      A sum[kChunk];
      for (int64_t c = 0; c < cw; ++c) sum[c] = A(0);
      for_each_tap(p, sz, sp, sq, [&](int64_t pos, int64_t) {
        const T* xp = xn + pos * C + c0;
        for (int64_t c = 0; c < cw; ++c) sum[c] += load_acc(xp[c]);
      });
      for (int64_t c = 0; c < cw; ++c) y[out + c0 + c] = from_acc<T>(sum[c] * inv);
    }
  }
}

// t at each window's selected element: a per-channel gather (the jvp, not a hot path).
template <typename T, typename Idx>
JAXDNN_CPU_CLONES void max_gather_row(const Problem& p, const T* t, const Idx* idx, T* y,
                                      int64_t n, int64_t z, int64_t pp) {
  const int64_t C = p.C, Q = p.out[2], RS = p.window[1] * p.window[2];
  const T* tn = t + n * p.in_spatial() * C;
  const Span sz = p.window_span(0, z), sp = p.window_span(1, pp);
  for (int64_t q = 0; q < Q; ++q) {
    const Span sq = p.window_span(2, q);
    const int64_t out = (((n * p.out[0] + z) * p.out[1] + pp) * Q + q) * C;
    for (int64_t c = 0; c < C; ++c) {
      const Idx k = idx[out + c];
      if (k == kNoIndex<Idx>) { y[out + c] = T{}; continue; }  // T{} is +0 in every dtype
      const int64_t d = sz.start + k / RS, h = sp.start + k / p.window[2] % p.window[1],
                    w = sq.start + k % p.window[2];
      y[out + c] = tn[((d * p.in[1] + h) * p.in[2] + w) * C + c];
    }
  }
}

// dx of input row (n, d, h): the dy of every covering window that selected the element.
template <typename T, typename Idx>
JAXDNN_CPU_CLONES void max_scatter_row(const Problem& p, const T* dy, const Idx* idx, T* dx,
                                       int64_t n, int64_t d, int64_t h) {
  using A = acc_t<T>;
  const int64_t C = p.C, W = p.in[2];
  const int64_t yn = n * p.out_spatial() * C;
  for (int64_t w = 0; w < W; ++w) {
    const int64_t in = (((n * p.in[0] + d) * p.in[1] + h) * W + w) * C;
    for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
      const int64_t cw = std::min(kChunk, C - c0);
      A sum[kChunk];
      for (int64_t c = 0; c < cw; ++c) sum[c] = A(0);
      for_each_window(p, d, h, w, [&](int64_t opos, int64_t k) {
        const T* dyp = dy + yn + opos * C + c0;
        const Idx* ip = idx + yn + opos * C + c0;
        for (int64_t c = 0; c < cw; ++c)
          sum[c] += ip[c] == Idx(k) ? load_acc(dyp[c]) : A(0);
      });
      for (int64_t c = 0; c < cw; ++c) dx[in + c0 + c] = from_acc<T>(sum[c]);
    }
  }
}

template <typename T>
JAXDNN_CPU_CLONES void avg_bwd_row(const Problem& p, const T* dy, T* dx, bool include_pad,
                                   int64_t n, int64_t d, int64_t h) {
  using A = acc_t<T>;
  const int64_t C = p.C, W = p.in[2];
  const int64_t yn = n * p.out_spatial() * C;
  for (int64_t w = 0; w < W; ++w) {
    const int64_t in = (((n * p.in[0] + d) * p.in[1] + h) * W + w) * C;
    for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
      const int64_t cw = std::min(kChunk, C - c0);
      A sum[kChunk];
      for (int64_t c = 0; c < cw; ++c) sum[c] = A(0);
      for_each_window(p, d, h, w, [&](int64_t opos, int64_t) {
        const int64_t q = opos % p.out[2], pp = opos / p.out[2] % p.out[1],
                      z = opos / (p.out[2] * p.out[1]);
        const A inv = A(1) / A(p.divisor(include_pad, p.window_span(0, z), p.window_span(1, pp),
                                         p.window_span(2, q)));
        const T* dyp = dy + yn + opos * C + c0;
        for (int64_t c = 0; c < cw; ++c) sum[c] += load_acc(dyp[c]) * inv;
      });
      for (int64_t c = 0; c < cw; ++c) dx[in + c0 + c] = from_acc<T>(sum[c]);
    }
  }
}

// Calls row(n, a, b) for every output row (n, z, p) or, with `input_rows`, input row (n, d, h).
template <typename Row>
void for_each_row(const Problem& p, bool input_rows, const Parallel& par, Row row) {
  const int64_t* dims = input_rows ? p.in : p.out;
  const int64_t A = dims[0], B = dims[1];
  par.for_each(p.N * A * B, [&](int64_t task) { row(task / (A * B), task / B % A, task % B); });
}

template <typename T, typename Idx>
void run_typed(const Args& a, const Buffers& b, const Parallel& par) {
  const Problem& p = a.p;
  const T* in = static_cast<const T*>(b.a);
  T* out = static_cast<T*>(b.result);
  const Idx* idx_in = static_cast<const Idx*>(b.index_in);
  Idx* idx_out = static_cast<Idx*>(b.index_out);
  const bool inc = a.count_include_pad;
  switch (a.op) {
    case Op::kMaxFwd:
      for_each_row(p, false, par, [&](int64_t n, int64_t z, int64_t pp) {
        max_fwd_row<T, Idx, false>(p, in, out, nullptr, n, z, pp);
      });
      break;
    case Op::kMaxFwdIndex:
      for_each_row(p, false, par, [&](int64_t n, int64_t z, int64_t pp) {
        max_fwd_row<T, Idx, true>(p, in, out, idx_out, n, z, pp);
      });
      break;
    case Op::kMaxGather:
      for_each_row(p, false, par, [&](int64_t n, int64_t z, int64_t pp) {
        max_gather_row<T, Idx>(p, in, idx_in, out, n, z, pp);
      });
      break;
    case Op::kMaxScatter:
      for_each_row(p, true, par, [&](int64_t n, int64_t d, int64_t h) {
        max_scatter_row<T, Idx>(p, in, idx_in, out, n, d, h);
      });
      break;
    case Op::kAvgFwd:
      for_each_row(p, false, par, [&](int64_t n, int64_t z, int64_t pp) {
        avg_fwd_row<T>(p, in, out, inc, n, z, pp);
      });
      break;
    case Op::kAvgBwd:
      for_each_row(p, true, par, [&](int64_t n, int64_t d, int64_t h) {
        avg_bwd_row<T>(p, in, out, inc, n, d, h);
      });
      break;
  }
}

}  // namespace

Status cpu_run(const Args& a, const Buffers& b, const Parallel& par) {
  Status s = validate(a.p);
  if (!s.ok()) return s;
  const bool ok = dispatch_io(a.dtype, a.dtype, [&](auto tag, auto) {
    using T = decltype(tag);
    if (a.index == IndexType::kU8) run_typed<T, uint8_t>(a, b, par);
    else run_typed<T, int32_t>(a, b, par);
  });
  if (!ok) return Status::Error(std::string("pool: unsupported dtype ") + dtype_name(a.dtype));
  return Status::Ok();
}

}  // namespace jaxdnn::pool
