// CPU pooling kernels: every op of pool.h, channels-last.
//
// A task is one output row (n, z, p) for the ops that write y, or one input row (n, d, h) for
// the backward ops that write dx; tasks run on the intra-op pool. Inside a task, channels go
// in chunks of kChunk: a full chunk's accumulators are a compile-time array that lives in
// vector registers for the whole window (the last, partial chunk uses a runtime width), and
// each window tap (or covering window, for the backward ops) is one pass over a contiguous
// chunk of C, which the compiler vectorises. Window and covering spans come from per-axis
// tables built once per call, so the loops do no division. Each row function is compiled for
// AVX-512, AVX2 and baseline x86-64 and picked at run time (target_clones). The plain max of
// 16-bit floats runs on ordered integer keys (Key16), without converting to float.
//
// Traffic: the forward ops read x once from memory (taps of overlapping windows hit in cache)
// and write y (and idx); the backward ops read dy (and idx) and write dx once. Accumulation in
// float (double for float64); results do not depend on the thread count.

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "cc/pool/pool.h"

namespace jaxdnn::pool {
namespace {

#define JAXDNN_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define JAXDNN_INLINE inline __attribute__((always_inline))

constexpr int64_t kChunk = 64;  // channels per accumulator chunk (4 AVX-512 float registers)
constexpr int64_t kTasksPerThread = 4;  // runs of rows per thread, for load balance

template <typename T> JAXDNN_INLINE T from_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, double>) return v; else return store_as_f<T>(v);
}

// A value that is exactly representable in T (a max): bfloat16 needs no rounding.
template <typename T> JAXDNN_INLINE T from_exact(acc_t<T> v) {
  if constexpr (std::is_same_v<T, bf16_t>) return bf16_t{uint16_t(float_to_bits(v) >> 16)};
  else return from_acc<T>(v);
}

// The max selection rule of pool.h: v replaces the current selection s when it is greater,
// NaN being greater than any number. Without an index to track, replacing a NaN by a NaN
// changes nothing, so the cheaper test suffices.
template <bool kIndex, typename A> JAXDNN_INLINE bool greater(A v, A s) {
  if constexpr (kIndex) return v > s || (v != v && s == s);
  else return v > s || v != v;
}

// Per-axis spans of a problem, computed once per call.
struct Tables {
  std::vector<Span> window[3];    // window[a][o]: the taps of output o along axis a
  std::vector<Span> covering[3];  // covering[a][i]: the outputs whose windows contain input i
  explicit Tables(const Problem& p) {
    for (int a = 0; a < 3; ++a) {
      for (int64_t o = 0; o < p.out[a]; ++o) window[a].push_back(p.window_span(a, o));
      for (int64_t i = 0; i < p.in[a]; ++i) covering[a].push_back(p.covering(a, i));
    }
  }
};

enum class Reduce { kMax, kMaxIndex, kAvg };

// Max of 16-bit floats without converting them: their bit patterns map to int16 keys that
// order like the values (negatives reversed below the positives, NaN of either sign above
// +inf), so a max is an integer max over twice the lanes of a float one, and maps back
// exactly. Only the sign of a zero can differ from the float path (+0 wins over -0).
template <typename T>
struct Key16 {
  static constexpr uint16_t kInf = std::is_same_v<T, bf16_t> ? 0x7f80 : 0x7c00;
  static JAXDNN_INLINE int16_t key(T v) {
    const uint16_t mag = v.bits & 0x7fff;
    const uint16_t flip = uint16_t(int16_t(v.bits) >> 15) & 0x7fff;
    return mag > kInf ? int16_t(mag) : int16_t(v.bits ^ flip);
  }
  static JAXDNN_INLINE T value(int16_t k) {
    return T{uint16_t(k < 0 ? uint16_t(k) ^ 0x7fff : uint16_t(k))};
  }
  static constexpr int16_t kMinusInf = int16_t(-1 - kInf);  // key(-inf)
};

template <int CW, typename T>
JAXDNN_INLINE void max16_chunk(const Problem& p, const Span& sz, const Span& sp, const Span& sq,
                               const T* xn, int64_t cw, T* y) {
  constexpr int64_t kCap = CW ? CW : kChunk;
  const int64_t width = CW ? CW : cw;
  const int64_t C = p.C, H = p.in[1], W = p.in[2];
  int16_t acc[kCap];
  for (int64_t c = 0; c < width; ++c) acc[c] = Key16<T>::kMinusInf;
  for (int64_t d = sz.lo; d < sz.hi; ++d)
    for (int64_t h = sp.lo; h < sp.hi; ++h)
      for (int64_t w = sq.lo; w < sq.hi; ++w) {
        const T* xp = xn + ((d * H + h) * W + w) * C;
        for (int64_t c = 0; c < width; ++c) acc[c] = std::max(acc[c], Key16<T>::key(xp[c]));
      }
  for (int64_t c = 0; c < width; ++c) y[c] = Key16<T>::value(acc[c]);
}

// One output position's channels [c0, c0 + width): xn and y (and idx) point at channel c0 of
// image n and of the output. CW > 0 is the width at compile time, CW == 0 the runtime cw.
template <Reduce R, int CW, typename T, typename Idx>
JAXDNN_INLINE void fwd_chunk(const Problem& p, const Span& sz, const Span& sp, const Span& sq,
                             const T* xn, int64_t cw, acc_t<T> inv_divisor, T* y, Idx* idx) {
  using A = acc_t<T>;
  constexpr int64_t kCap = CW ? CW : kChunk;
  const int64_t width = CW ? CW : cw;
  const int64_t C = p.C, H = p.in[1], W = p.in[2];
  A acc[kCap];
  int32_t ix[kCap];
  for (int64_t c = 0; c < width; ++c) {
    acc[c] = R == Reduce::kAvg ? A(0) : -std::numeric_limits<A>::infinity();
    ix[c] = -1;
  }
  for (int64_t d = sz.lo; d < sz.hi; ++d)
    for (int64_t h = sp.lo; h < sp.hi; ++h) {
      const int32_t k0 = int32_t(((d - sz.start) * p.window[1] + (h - sp.start)) * p.window[2] -
                                 sq.start);
      const T* row = xn + (d * H + h) * W * C;
      for (int64_t w = sq.lo; w < sq.hi; ++w) {
        const T* xp = row + w * C;
        for (int64_t c = 0; c < width; ++c) {
          const A v = load_acc(xp[c]);
          if constexpr (R == Reduce::kAvg) {
            acc[c] += v;
          } else {
            const bool take = greater<R == Reduce::kMaxIndex>(v, acc[c]);
            acc[c] = take ? v : acc[c];
            if constexpr (R == Reduce::kMaxIndex) ix[c] = take ? int32_t(k0 + w) : ix[c];
          }
        }
      }
    }
  if constexpr (R == Reduce::kAvg)
    for (int64_t c = 0; c < width; ++c) y[c] = from_acc<T>(acc[c] * inv_divisor);
  else
    for (int64_t c = 0; c < width; ++c) y[c] = from_exact<T>(acc[c]);
  if constexpr (R == Reduce::kMaxIndex) {
    const bool first_in = sz.first_on_input() && sp.first_on_input() && sq.first_on_input();
    for (int64_t c = 0; c < width; ++c) idx[c] = selected_index<Idx>(ix[c], first_in);
  }
}

// y (and idx) of output row (n, z, pp).
template <Reduce R, typename T, typename Idx>
JAXDNN_CPU_CLONES void fwd_row(const Problem& p, const Tables& t, const T* x, T* y, Idx* idx,
                               bool include_pad, int64_t n, int64_t z, int64_t pp) {
  using A = acc_t<T>;
  const int64_t C = p.C, Q = p.out[2];
  const T* xn = x + n * p.in_spatial() * C;
  const Span &sz = t.window[0][size_t(z)], &sp = t.window[1][size_t(pp)];
  for (int64_t q = 0; q < Q; ++q) {
    const Span& sq = t.window[2][size_t(q)];
    const A inv = A(1) / A(p.divisor(include_pad, sz, sp, sq));  // inf for an empty window
    const int64_t out = (((n * p.out[0] + z) * p.out[1] + pp) * Q + q) * C;
    Idx* ip = R == Reduce::kMaxIndex ? idx + out : nullptr;
    auto chunk = [&](auto cw_c, int64_t c0, int64_t cw) {
      constexpr int CW = decltype(cw_c)::value;
      if constexpr (R == Reduce::kMax && sizeof(T) == 2)
        max16_chunk<CW>(p, sz, sp, sq, xn + c0, cw, y + out + c0);
      else
        fwd_chunk<R, CW>(p, sz, sp, sq, xn + c0, cw, inv, y + out + c0, ip ? ip + c0 : ip);
    };
    int64_t c0 = 0;
    for (; c0 + kChunk <= C; c0 += kChunk) chunk(std::integral_constant<int, kChunk>{}, c0, kChunk);
    if (c0 < C) chunk(std::integral_constant<int, 0>{}, c0, C - c0);
  }
}

// One input position's channels [c0, c0 + width): the dy of every window covering (d, h, w)
// that selected it (max), or dy / divisor (avg). dyn and idxn point at channel c0 of image n.
template <bool kMax, int CW, typename T, typename Idx>
JAXDNN_INLINE void bwd_chunk(const Problem& p, const Tables& t, int64_t d, int64_t h, int64_t w,
                             const T* dyn, const Idx* idxn, int64_t cw, bool include_pad,
                             T* dx) {
  using A = acc_t<T>;
  constexpr int64_t kCap = CW ? CW : kChunk;
  const int64_t width = CW ? CW : cw;
  const int64_t C = p.C, P = p.out[1], Q = p.out[2];
  const Span &cz = t.covering[0][size_t(d)], &cp = t.covering[1][size_t(h)],
             &cq = t.covering[2][size_t(w)];
  const A inv_window = A(1) / A(p.window_size());
  A sum[kCap];
  for (int64_t c = 0; c < width; ++c) sum[c] = A(0);
  for (int64_t z = cz.lo; z < cz.hi; ++z)
    for (int64_t pp = cp.lo; pp < cp.hi; ++pp)
      for (int64_t q = cq.lo; q < cq.hi; ++q) {
        const Span &wz = t.window[0][size_t(z)], &wp = t.window[1][size_t(pp)],
                   &wq = t.window[2][size_t(q)];
        const int64_t off = ((z * P + pp) * Q + q) * C;
        const T* g = dyn + off;
        if constexpr (kMax) {
          const Idx k = Idx(((d - wz.start) * p.window[1] + (h - wp.start)) * p.window[2] +
                            (w - wq.start));
          const Idx* ip = idxn + off;
          for (int64_t c = 0; c < width; ++c) sum[c] += ip[c] == k ? load_acc(g[c]) : A(0);
        } else {
          const A scale = include_pad ? inv_window : A(1) / A(p.divisor(false, wz, wp, wq));
          for (int64_t c = 0; c < width; ++c) sum[c] += load_acc(g[c]) * scale;
        }
      }
  for (int64_t c = 0; c < width; ++c) dx[c] = from_acc<T>(sum[c]);
}

// dx of input row (n, d, h).
template <bool kMax, typename T, typename Idx>
JAXDNN_CPU_CLONES void bwd_row(const Problem& p, const Tables& t, const T* dy, const Idx* idx,
                               T* dx, bool include_pad, int64_t n, int64_t d, int64_t h) {
  const int64_t C = p.C, W = p.in[2];
  const int64_t yn = n * p.out_spatial() * C;
  for (int64_t w = 0; w < W; ++w) {
    const int64_t in = (((n * p.in[0] + d) * p.in[1] + h) * W + w) * C;
    int64_t c0 = 0;
    for (; c0 + kChunk <= C; c0 += kChunk)
      bwd_chunk<kMax, kChunk>(p, t, d, h, w, dy + yn + c0, kMax ? idx + yn + c0 : idx, kChunk,
                              include_pad, dx + in + c0);
    if (c0 < C)
      bwd_chunk<kMax, 0>(p, t, d, h, w, dy + yn + c0, kMax ? idx + yn + c0 : idx, C - c0,
                         include_pad, dx + in + c0);
  }
}

// dx of input row (n, d, h) for a global average: dy[n] / window size, copied to every
// position (the general bwd_row would redo the same sum per position).
template <typename T>
JAXDNN_CPU_CLONES void global_avg_bwd_row(const Problem& p, const T* dy, T* dx, int64_t n,
                                          int64_t d, int64_t h) {
  using A = acc_t<T>;
  const int64_t C = p.C, W = p.in[2];
  const A inv = A(1) / A(p.window_size());
  std::vector<T> row(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) row[size_t(c)] = from_acc<T>(load_acc(dy[n * C + c]) * inv);
  T* out = dx + ((n * p.in[0] + d) * p.in[1] + h) * W * C;
  for (int64_t w = 0; w < W; ++w)
    for (int64_t c = 0; c < C; ++c) out[w * C + c] = row[size_t(c)];  // vectorised, inline
}

// t at each window's selected element: a per-channel gather (the jvp, not a hot path).
template <typename T, typename Idx>
void gather_row(const Problem& p, const Tables& t, const T* tangent, const Idx* idx, T* y,
                int64_t n, int64_t z, int64_t pp) {
  const int64_t C = p.C, Q = p.out[2], S = p.window[2], RS = p.window[1] * S;
  const T* tn = tangent + n * p.in_spatial() * C;
  const Span &sz = t.window[0][size_t(z)], &sp = t.window[1][size_t(pp)];
  for (int64_t q = 0; q < Q; ++q) {
    const Span& sq = t.window[2][size_t(q)];
    const int64_t out = (((n * p.out[0] + z) * p.out[1] + pp) * Q + q) * C;
    for (int64_t c = 0; c < C; ++c) {
      const Idx k = idx[out + c];
      if (k == kNoIndex<Idx>) {
        y[out + c] = T{};  // +0 in every dtype
        continue;
      }
      const int64_t d = sz.start + k / RS, h = sp.start + k / S % p.window[1],
                    w = sq.start + k % S;
      y[out + c] = tn[((d * p.in[1] + h) * p.in[2] + w) * C + c];
    }
  }
}

// Calls row(n, a, b) for every output row (n, z, p) or, with `input_rows`, input row (n, d, h).
// A task is a contiguous run of rows, a few per thread: each thread writes (and, on the first
// touch of a fresh output buffer, page-faults) its own region of memory.
template <typename Row>
void for_each_row(const Problem& p, bool input_rows, const Parallel& par, Row row) {
  const int64_t* dims = input_rows ? p.in : p.out;
  const int64_t A = dims[0], B = dims[1], rows = p.N * A * B;
  const int64_t tasks = std::min<int64_t>(rows, int64_t(par.num_threads()) * kTasksPerThread);
  par.for_each(tasks, [&](int64_t task) {
    for (int64_t r = rows * task / tasks; r < rows * (task + 1) / tasks; ++r)
      row(r / (A * B), r / B % A, r % B);
  });
}

template <typename T, typename Idx>
void run_typed(const Args& a, const Buffers& b, const Parallel& par) {
  const Problem& p = a.p;
  const Tables t(p);
  const T* in = static_cast<const T*>(b.a);
  T* out = static_cast<T*>(b.result);
  const Idx* idx_in = static_cast<const Idx*>(b.index_in);
  Idx* idx_out = static_cast<Idx*>(b.index_out);
  const bool inc = a.count_include_pad;
  auto fwd = [&](auto reduce, Idx* idx) {
    for_each_row(p, false, par, [&](int64_t n, int64_t z, int64_t pp) {
      fwd_row<decltype(reduce)::value, T, Idx>(p, t, in, out, idx, inc, n, z, pp);
    });
  };
  auto bwd = [&](auto is_max) {
    for_each_row(p, true, par, [&](int64_t n, int64_t d, int64_t h) {
      bwd_row<decltype(is_max)::value, T, Idx>(p, t, in, idx_in, out, inc, n, d, h);
    });
  };
  using std::integral_constant;
  switch (a.op) {
    case Op::kMaxFwd: fwd(integral_constant<Reduce, Reduce::kMax>{}, nullptr); break;
    case Op::kMaxFwdIndex: fwd(integral_constant<Reduce, Reduce::kMaxIndex>{}, idx_out); break;
    case Op::kAvgFwd: fwd(integral_constant<Reduce, Reduce::kAvg>{}, nullptr); break;
    case Op::kMaxScatter: bwd(std::true_type{}); break;
    case Op::kAvgBwd:
      if (p.global())
        for_each_row(p, true, par, [&](int64_t n, int64_t d, int64_t h) {
          global_avg_bwd_row<T>(p, in, out, n, d, h);
        });
      else
        bwd(std::false_type{});
      break;
    case Op::kMaxGather:
      for_each_row(p, false, par, [&](int64_t n, int64_t z, int64_t pp) {
        gather_row<T, Idx>(p, t, in, idx_in, out, n, z, pp);
      });
      break;
  }
}

Support any_call(const Args&) { return Support::Yes(); }

const Algorithm kWindow{"window", true, any_call};
const Algorithm kGather{"gather", false, any_call};

}  // namespace

const std::vector<const Algorithm*>& cpu_algorithms() {
  static const std::vector<const Algorithm*> kAll = {&kWindow, &kGather};
  return kAll;
}

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
