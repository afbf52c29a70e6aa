// Pooling problem descriptor and kernel entry points, shared by the CPU and CUDA kernels.
//
// All pooling is 3-D and channels-last here: the FFI layer gives 1-D and 2-D problems size-1
// leading spatial dims, and the Python layer transposes channels-first layouts. Row-major:
//   x  (N, D, H, W, C)      input
//   y  (N, Z, P, Q, C)      output; window (T, R, S), strides, padding (lo, hi) per axis
// Along an axis, output o's window reads the input coordinates  start + t  for taps
// t in [0, window), start = o*stride - pad_lo; coordinates outside [0, in) are padding.
// A tap's index inside the window is k = (t*R + r)*S + s (row-major, as in jax.lax).
//
// Ops (one FFI target each, jaxdnn_pool_<op>):
//   max_fwd        x -> y                       y = max over the window (padding is -inf)
//   max_fwd_index  x -> (y, idx)                idx = window index of the selected element
//   max_gather     (t, idx) -> (N,Z,P,Q,C)      t at each window's selected element (jvp)
//   max_scatter    (dy, idx) -> (N,D,H,W,C)     dy routed to the selected elements (vjp)
//   avg_fwd        x -> y                       window sum / divisor
//   avg_bwd        dy -> (N,D,H,W,C)            the transpose: sum of dy/divisor over windows
// The divisor is the window size, or with count_include_pad=false the number of taps that
// fall on the input (0 for a window made only of padding, giving NaN as in flax).
//
// Max selection (the gradient's tie rule): the selected element of a window is the first, in
// tap order, of its maximal elements, NaN counting as greater than any number (so the first
// NaN if there is one) and padding as -inf. Without NaN this is jax.lax's rule (jax.grad of
// reduce_window max: select_and_scatter_add with `ge`). So a window whose elements are all -inf
// selects its first tap, and selects nothing (index kNoIndex: its gradient is dropped) when
// that tap is padding. y is the selected value (-inf for such windows), so NaN propagates.
// The kernels reduce taps above -inf (associatively, which lets a window be split across
// threads) and settle a window where none was taken once, at the end (selected_index).
//
// Backward kernels gather (one thread per input element visits the windows covering it), so
// every result is deterministic.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "cc/common/dtype.h"
#include "cc/common/parallel.h"
#include "cc/common/status.h"

#if defined(__CUDACC__)
#define JAXDNN_POOL_HD __host__ __device__ __forceinline__
#else
#define JAXDNN_POOL_HD inline
#endif

namespace jaxdnn::pool {

enum class Op : int { kMaxFwd, kMaxFwdIndex, kMaxGather, kMaxScatter, kAvgFwd, kAvgBwd };

inline const char* op_name(Op op) {
  switch (op) {
    case Op::kMaxFwd: return "max_fwd";
    case Op::kMaxFwdIndex: return "max_fwd_index";
    case Op::kMaxGather: return "max_gather";
    case Op::kMaxScatter: return "max_scatter";
    case Op::kAvgFwd: return "avg_fwd";
    case Op::kAvgBwd: return "avg_bwd";
  }
  return "?";
}

// Element type of the selected-element indices: uint8 for windows of at most kMaxU8Window
// taps (a quarter of a float32 y), int32 beyond. The largest value means "nothing selected".
enum class IndexType : int { kU8, kI32 };
constexpr int64_t kMaxU8Window = 254;
template <typename Idx> constexpr Idx kNoIndex = std::numeric_limits<Idx>::max();

// One axis of a window: taps read coordinates start + t; [lo, hi) of them lie on the input.
struct Span {
  int64_t start, lo, hi;
  // Whether the window's first tap along this axis lies on the input.
  JAXDNN_POOL_HD bool first_on_input() const { return lo == start && lo < hi; }
};

// The index stored for a window whose reduction took tap ix, or none (ix < 0: no element above
// -inf). Then every element of the window is -inf, padding included, and the first tap is
// the first of its maxima: selected when it lies on the input, nothing (kNoIndex) when it is
// padding, as jax.grad of reduce_window max (padding -inf) does.
template <typename Idx>
JAXDNN_POOL_HD Idx selected_index(int32_t ix, bool first_on_input) {
  return ix >= 0 ? Idx(ix) : (first_on_input ? Idx(0) : kNoIndex<Idx>);
}

struct Problem {
  int64_t N = 0, C = 0;
  int64_t in[3] = {1, 1, 1};      // D, H, W
  int64_t out[3] = {1, 1, 1};     // Z, P, Q
  int64_t window[3] = {1, 1, 1};  // T, R, S
  int64_t stride[3] = {1, 1, 1};
  int64_t pad_lo[3] = {0, 0, 0};
  int64_t pad_hi[3] = {0, 0, 0};

  JAXDNN_POOL_HD int64_t in_spatial() const { return in[0] * in[1] * in[2]; }
  JAXDNN_POOL_HD int64_t out_spatial() const { return out[0] * out[1] * out[2]; }
  JAXDNN_POOL_HD int64_t window_size() const { return window[0] * window[1] * window[2]; }
  JAXDNN_POOL_HD int64_t x_elems() const { return N * in_spatial() * C; }
  JAXDNN_POOL_HD int64_t y_elems() const { return N * out_spatial() * C; }

  JAXDNN_POOL_HD static int64_t clamp(int64_t v, int64_t n) { return v < 0 ? 0 : (v > n ? n : v); }

  // The window of output o along `axis`.
  JAXDNN_POOL_HD Span window_span(int axis, int64_t o) const {
    const int64_t start = o * stride[axis] - pad_lo[axis], end = start + window[axis];
    return {start, clamp(start, in[axis]), clamp(end, in[axis])};
  }

  // The outputs [lo, hi) whose windows contain input coordinate i along `axis` (start unused).
  JAXDNN_POOL_HD Span covering(int axis, int64_t i) const {
    const int64_t first = i + pad_lo[axis] - window[axis] + 1;  // lowest window start reaching i
    const int64_t lo = first <= 0 ? 0 : (first + stride[axis] - 1) / stride[axis];
    const int64_t last = (i + pad_lo[axis]) / stride[axis] + 1;
    return {0, lo, last < out[axis] ? last : out[axis]};
  }

  // avg divisor of the window at output (z, p, q).
  JAXDNN_POOL_HD int64_t divisor(bool count_include_pad, const Span& a, const Span& b,
                                 const Span& c) const {
    return count_include_pad ? window_size() : (a.hi - a.lo) * (b.hi - b.lo) * (c.hi - c.lo);
  }

  // One window covers the whole input exactly (global pooling): kernels may split it.
  JAXDNN_POOL_HD bool global() const {
    for (int a = 0; a < 3; ++a)
      if (window[a] != in[a] || pad_lo[a] != 0 || pad_hi[a] != 0) return false;
    return true;
  }
};

inline int64_t out_size(int64_t in, int64_t window, int64_t stride, int64_t lo, int64_t hi) {
  const int64_t span = in + lo + hi - window;
  return span < 0 ? 0 : span / stride + 1;
}

// Checks the descriptor (the Python layer builds consistent ones; this guards the FFI edge).
inline Status validate(const Problem& p) {
  if (p.N < 0 || p.C < 0) return Status::Error("negative dimension");
  for (int a = 0; a < 3; ++a) {
    if (p.window[a] < 1 || p.stride[a] < 1) return Status::Error("window and stride must be >= 1");
    if (p.pad_lo[a] < 0 || p.pad_hi[a] < 0) return Status::Error("padding must be >= 0");
    if (p.in[a] + p.pad_lo[a] + p.pad_hi[a] < p.window[a])
      return Status::Error("the window is larger than the padded input");
    const int64_t want = out_size(p.in[a], p.window[a], p.stride[a], p.pad_lo[a], p.pad_hi[a]);
    if (p.out[a] != want)
      return Status::Error("spatial axis " + std::to_string(a) + ": output size " +
                           std::to_string(p.out[a]) + " but the window gives " +
                           std::to_string(want));
  }
  return Status::Ok();
}

struct Args {
  Op op = Op::kMaxFwd;
  Problem p;
  DType dtype = DType::kF32;             // x, y, t, dy, dx (one dtype per call)
  IndexType index = IndexType::kU8;      // max_fwd_index / max_gather / max_scatter
  bool count_include_pad = true;         // avg_fwd / avg_bwd
};

// Operands by role: `a` is x (fwd), t (gather) or dy (scatter, avg_bwd); `index` is the
// selected-element indices (read by gather/scatter, written by max_fwd_index).
struct Buffers {
  const void* a = nullptr;
  const void* index_in = nullptr;
  void* result = nullptr;
  void* index_out = nullptr;
};

// The forward ops (max_fwd, max_fwd_index, avg_fwd); the others are the backward direction.
inline bool is_forward(Op op) {
  return op == Op::kMaxFwd || op == Op::kMaxFwdIndex || op == Op::kAvgFwd;
}

// The registries (cpu_algorithms below, cuda_pool.h): named algorithms of one direction, each
// answering whether it runs a call; jaxdnn/ops/pool.py chooses one at lowering time and names it
// in the call.
struct Algorithm {
  const char* name;
  bool forward;  // the direction of its ops
  Support (*supports)(const Args&);
};

// The algorithm of `args`'s direction named `name` in a registry (null when there is none).
inline const Algorithm* find_algorithm(const std::vector<const Algorithm*>& all, const Args& args,
                                       std::string_view name) {
  for (const Algorithm* a : all)
    if (a->forward == is_forward(args.op) && name == a->name) return a;
  return nullptr;
}

// The CPU registry (cpu_pool.cc): "window" (forward: one task per output row, each window's
// taps walked in order) and "gather" (backward: each input element visits the windows covering
// it). Runs `args.op` on the CPU; the CUDA entry point is in cuda_pool.h.
const std::vector<const Algorithm*>& cpu_algorithms();
Status cpu_run(const Args& args, const Buffers& bufs, const Parallel& par);

}  // namespace jaxdnn::pool
