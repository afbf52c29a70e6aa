// Normalisation problem descriptor shared by every norm kernel, CPU and CUDA.
//
// Every normalisation (batch, layer, RMS, group, instance) is one canonical problem, row-major:
//   x, y, dy, dx   (P, A, C, K, T)
//   mean, var      (P, C)        one statistics group per (p, c), reduced over (a, k, t):
//                                n = A*K*T elements
//   scale, bias    (Q, C, K)     element (p, a, c, k, t) uses affine row q = p / (P/Q)
// The Python layer maps each op onto it with free reshapes:
//   layer/rms norm over the last dims  (M, 1, 1, N, 1)
//   batch norm, channels-last           (1, N*H*W, C, 1, 1)
//   batch norm, channels-first          (1, N, C, 1, H*W)
//   group norm, channels-last           (N, H*W, G, C/G, 1)
//   group norm, channels-first          (N, 1, G, C/G, H*W)
// vmap folds the mapped axis into P (and Q), so mapped statistics stay independent.
//
// Statistics and affine parameters are float32 for 16-bit and float32 inputs, float64 for
// float64 inputs. `var` is the biased variance (the mean square when not centred, RMS norm);
// the inverse standard deviation is rstd = 1/sqrt(var + eps), recomputed from the saved var
// wherever it is needed (identically in every kernel).
//
// Three paths, chosen from the shape alone (path_of):
//   kRow      A == 1, T == 1: each group is one contiguous row of K elements (layer/RMS norm).
//             Fused kernels: one read of x for statistics and output.
//   kColumn   A > 1, T == 1: groups run down the columns of an (A, C*K) matrix per p (batch and
//             group norm, channels-last). Partial statistics per column and row slice, merged.
//   kSegment  T > 1: each group is A*K contiguous segments of T (channels-first). Partial
//             statistics per segment, merged.
// The column and segment paths write partial results to a workspace buffer that the caller
// provides (an extra output of the custom call, sized by the functions below, which the Python
// layer mirrors in jaxdnn/ops/norm.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cc/common/dtype.h"
#include "cc/common/status.h"

#if defined(__CUDACC__)
#define JAXDNN_NORM_HD __host__ __device__ __forceinline__
#else
#define JAXDNN_NORM_HD inline
#endif

namespace jaxdnn::norm {

struct Shape {
  int64_t P = 1, A = 1, C = 1, K = 1, T = 1;
  int64_t Q = 1;  // affine rows; P % Q == 0

  JAXDNN_NORM_HD int64_t elems() const { return P * A * C * K * T; }
  JAXDNN_NORM_HD int64_t groups() const { return P * C; }
  JAXDNN_NORM_HD int64_t group_size() const { return A * K * T; }
  JAXDNN_NORM_HD int64_t CK() const { return C * K; }
  JAXDNN_NORM_HD int64_t Pq() const { return P / Q; }  // p rows per affine row
};

enum class Path { kRow, kColumn, kSegment };

inline Path path_of(const Shape& s) {
  if (s.T > 1) return Path::kSegment;
  return s.A > 1 ? Path::kColumn : Path::kRow;
}

// Rows of one partial-statistics slice. Column path: enough rows that a slice holds about 64K
// elements (at least 16, at most 512 rows); segment path: one row (a partial per segment).
inline int64_t rows_per_slice(const Shape& s) {
  if (path_of(s) != Path::kColumn) return 1;
  const int64_t want = (65536 + s.CK() - 1) / std::max<int64_t>(s.CK(), 1);
  return std::min<int64_t>(512, std::max<int64_t>(16, want));
}

// Slices along A (partials per group and k): S = ceil(A / rows_per_slice).
inline int64_t num_slices(const Shape& s) {
  const int64_t rps = rows_per_slice(s);
  return (s.A + rps - 1) / rps;
}

// Segment path, pieces of a segment (the CUDA single-pass forward keeps one partial per piece,
// so that a few long segments still give every warp of the GPU work): cut so that the whole
// tensor has about kSegmentUnits pieces, each at least kMinSegmentPiece values, the piece
// length a multiple of 8 (every vector width) and the last piece of a segment shorter.
constexpr int64_t kSegmentUnits = 16384, kMinSegmentPiece = 1024;

inline int64_t segment_piece_len(const Shape& s) {
  const int64_t segs = std::max<int64_t>(1, s.P * s.A * s.C * s.K);
  const int64_t want = std::max<int64_t>(
      1, std::min((kSegmentUnits + segs - 1) / segs, s.T / kMinSegmentPiece));
  return ((s.T + want - 1) / want + 7) / 8 * 8;
}
inline int64_t segment_pieces(const Shape& s) {  // (segment path: T > 1)
  const int64_t len = segment_piece_len(s);
  return (s.T + len - 1) / len;
}

// Row path backward: the rows of each affine row q are split into at most this many slices,
// each reducing its own d(scale), d(bias) partial (platforms choose how many, up to this).
constexpr int64_t kRowBwdMaxSlices = 512;

inline int64_t row_bwd_max_slices(const Shape& s) {
  return std::min<int64_t>(s.Pq(), kRowBwdMaxSlices);
}

// Workspace bytes (a byte buffer, at least 16-byte aligned).
//   forward:  2 double planes (mean, M2) of (P, S, C, K) partials (double, so that a partial
//             mean keeps its digits under a large common offset), times segment_pieces(s) on
//             the segment path (one per piece; the CPU uses one per segment); none on the row
//             path. Then fwd_table_slots(s) 8-byte slots: the segment path's split forward's
//             table (mean, rstd*scale, bias, unused) per segment, in the statistics type.
//   backward, in the statistics type (float, or double for float64 inputs):
//             row path: 2 planes (sum dy*xhat, sum dy) of (Q, S_b, C, K) partials;
//             otherwise 2 planes of (P, S, C, K) partials + per-group coefficients (P, C, 2).
inline int64_t fwd_partials(const Shape& s) {  // elements per forward plane
  switch (path_of(s)) {
    case Path::kRow: return 0;
    case Path::kColumn: return s.P * num_slices(s) * s.CK();
    case Path::kSegment: return s.P * num_slices(s) * s.CK() * segment_pieces(s);
  }
  return 0;
}
inline int64_t bwd_partials(const Shape& s) {  // elements per backward plane
  return path_of(s) == Path::kRow ? s.Q * row_bwd_max_slices(s) * s.CK()
                                  : s.P * num_slices(s) * s.CK();
}
// Segment path, split training forward (CUDA, cuda_segment.cu): per-piece statistics, then a
// (segments, 4) table of each segment's coefficients, then a flat apply. Segments of at least
// kSplitMinSegment values (so that the table stays small beside x, and a warp's piece gives each
// lane several 16-byte chunks).
constexpr int64_t kSplitMinSegment = 512;
inline bool segment_split_shape(const Shape& s) {
  return path_of(s) == Path::kSegment && s.T >= kSplitMinSegment;
}
inline int64_t fwd_table_slots(const Shape& s) {
  return segment_split_shape(s) ? 4 * s.P * s.A * s.C * s.K : 0;
}
inline int64_t fwd_workspace_bytes(const Shape& s) {
  return 8 * (2 * fwd_partials(s) + fwd_table_slots(s));
}
inline int64_t bwd_workspace_bytes(const Shape& s, DType dtype) {
  const int64_t coef = path_of(s) == Path::kRow ? 0 : 2 * s.groups();
  return (2 * bwd_partials(s) + coef) * (dtype == DType::kF64 ? 8 : 4);
}

inline Status validate(const Shape& s) {
  if (s.P < 0 || s.A < 0 || s.C < 0 || s.K < 0 || s.T < 0)
    return Status::Error("negative dimension");
  if (s.Q < 1 || s.P % s.Q != 0)
    return Status::Error("affine rows Q=" + std::to_string(s.Q) + " must divide P=" +
                         std::to_string(s.P));
  return Status::Ok();
}

// The fused epilogue of an apply (batch norm + add + ReLU, as cuDNN's BN-add-ReLU; the column
// and segment paths' kernels, not the row path's):
//   forward   z = (x - mean)*rstd*scale + bias [+ residual],   y = relu ? max(z, 0) : z
//   backward  with relu: dz = dy where z > 0, else 0 (z recomputed from x, the statistics,
//             bias and the residual, in the forward's arithmetic), then the plain backward of dz,
//             and d(residual) = dz. Without relu the backward is the plain one (the residual's
//             gradient is dy itself, which the caller takes).
// relu(NaN) is NaN and relu'(0) = 0, as jax.nn.relu.
struct Epilogue {
  bool relu = false;
  bool residual = false;  // a residual operand is added before the activation
  bool any() const { return relu || residual; }
};

struct Problem {
  Shape s;
  DType dtype = DType::kF32;  // x, y, dy, dx; statistics and affine: float (double for f64)
  bool centered = true;       // false: RMS norm (mean is 0, var is the mean square)
  double eps = 1e-5;
  Epilogue epi;
};

// Training forward: statistics from x.     x, scale, bias -> y, mean, var (+ workspace)
// Inference forward: given statistics.     x, scale, bias, mean, var -> y
struct FwdBuffers {
  const void* x = nullptr;
  const void* scale = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;
  void* mean = nullptr;  // written in training, read in inference
  void* var = nullptr;
  void* ws = nullptr;
  const void* residual = nullptr;  // x-like, when epi.residual (apply passes only)
};

// Backward, linear in the cotangents dy (and, in training, dmean, dvar of the statistics
// outputs). Training:  dx = rstd*(g - sum(g)/n - xhat*sum(g*xhat)/n) + dmean/n + 2*dvar*(x-mean)/n
// with g = scale*dy. Inference (statistics are inputs): dx = scale*rstd*dy and the statistics
// get gradients  d(mean) = -rstd*sum(g),  d(var) = -rstd^2/2 * sum(g*xhat).
// Both: d(scale) = sum dy*xhat, d(bias) = sum dy over (p in q, a, t).
struct BwdBuffers {
  bool training = true;
  const void* dy = nullptr;
  const void* dmean = nullptr;  // training only (cotangents of the statistics outputs; null: 0)
  const void* dvar = nullptr;
  const void* x = nullptr;
  const void* scale = nullptr;
  const void* mean = nullptr;
  const void* var = nullptr;
  void* dx = nullptr;
  void* dscale = nullptr;
  void* dbias = nullptr;
  void* dmean_out = nullptr;  // inference only
  void* dvar_out = nullptr;
  void* ws = nullptr;
  // With epi.relu (Epilogue): the bias and residual that recompute z, and d(residual) = dz
  // (written when epi.residual).
  const void* bias = nullptr;
  const void* residual = nullptr;
  void* dresidual = nullptr;
};

// The registries (cpu_norm.h, cuda_norm.h): named algorithms per pass, each answering whether
// it runs a problem; jaxdnn/ops/norm.py chooses one at lowering time and names it in the call.
//   kTrain  training forward (statistics from x)     kInfer  inference forward (given statistics)
//   kBwd    backward, training or inference
enum class Pass : int { kTrain = 0, kInfer = 1, kBwd = 2 };

struct Algorithm {
  const char* name;
  Pass pass;
  Support (*supports)(const Problem&);
  // Training forwards run as two XLA calls, statistics (mean, var, workspace) then apply (y),
  // so that XLA schedules the statistics passes apart from the writes (jaxdnn/ops/norm.py).
  bool two_calls = false;
};

// What a training forward call runs: all of it, or one half of a two-call algorithm.
enum class Half { kAll, kStats, kApply };

// Support for the algorithms bound to one path (each names its path in the reason).
inline Support on_path(const Problem& p, Path want) {
  static const char* const kPaths[] = {
      "the row path (A == 1, T == 1: layer and RMS norm)",
      "the column path (A > 1, T == 1: channels-last batch and group norm)",
      "the segment path (T > 1: channels-first batch and group norm)"};
  const Path is = path_of(p.s);
  if (is == want && (want != Path::kRow || !p.epi.any())) return Support::Yes();
  if (is == want)
    return Support::No("the fused activation / residual epilogue runs on the column and "
                       "segment paths (batch and group norm), not the row path");
  return Support::No(std::string("runs ") + kPaths[int(want)] + "; this problem is on " +
                     kPaths[int(is)]);
}

// The algorithm of `pass` named `name` in a registry (null when there is none).
inline const Algorithm* find_algorithm(const std::vector<const Algorithm*>& all, Pass pass,
                                       std::string_view name) {
  for (const Algorithm* a : all)
    if (a->pass == pass && name == a->name) return a;
  return nullptr;
}

}  // namespace jaxdnn::norm
