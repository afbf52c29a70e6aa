// Convolution problem descriptor shared by every conv algorithm, CPU and CUDA.
//
// All convolutions are 3-D here: 1-D and 2-D problems arrive with size-1 leading spatial
// dims (the Python layer reshapes, which is free). Canonical layouts, row-major:
//   x  (N, D, H, W, C)        input, C = G * Cg
//   w  (T, R, S, Cg, K)       filter, K = G * Kg; group g reads channels [g*Cg, (g+1)*Cg)
//   y  (N, Z, P, Q, K)        output
// Along each spatial axis an output position o and filter tap f read the *dilated* input
// coordinate  u = o*stride - pad_lo + f*rhs_dil;  it is a real input element i = u / lhs_dil
// when 0 <= u <= (in-1)*lhs_dil and u % lhs_dil == 0, otherwise it is padding (zero).
// Non-finite values: fwd and bwd_filter multiply that zero like a real element, so an infinite
// or NaN weight (bwd_filter: dy) makes NaN at a padded tap, as lax's zero-padded convolution
// does (XLA:CPU in float32; its float64 emitter skips padded taps). Every algorithm does but
// the transforms (winograd*, fft*), which mix a tile's values before multiplying: there one
// non-finite operand spreads over its tile, as in cuDNN. The tensor cores' 3xTF32 split (float32
// at precision HIGHEST) makes NaN of an infinite operand (its low part is inf - inf).
//
// Directions (cuDNN names in brackets):
//   kFwd       y  = conv(x, w)                    [forward]
//   kBwdData   dx = conv^T_x(dy, w)               [backward data]
//   kBwdFilter dw = conv^T_w(x, dy)               [backward filter]
#pragma once

#include <cstdint>
#include <string>

#include "cc/common/cpu_isa.h"
#include "cc/common/dtype.h"
#include "cc/common/status.h"
#include "cc/conv/epilogue.h"

#if defined(__CUDACC__)
#define JAXDNN_HD __host__ __device__ __forceinline__
#else
#define JAXDNN_HD inline
#endif

namespace jaxdnn::conv {

enum class Direction : int { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };

inline const char* direction_name(Direction d) {
  switch (d) {
    case Direction::kFwd: return "fwd";
    case Direction::kBwdData: return "bwd_data";
    case Direction::kBwdFilter: return "bwd_filter";
  }
  return "?";
}

struct Problem {
  int64_t N = 0, C = 0, K = 0, G = 1;
  int64_t in[3] = {1, 1, 1};    // D, H, W
  int64_t filt[3] = {1, 1, 1};  // T, R, S
  int64_t out[3] = {1, 1, 1};   // Z, P, Q
  int64_t stride[3] = {1, 1, 1};
  int64_t pad_lo[3] = {0, 0, 0};
  int64_t pad_hi[3] = {0, 0, 0};
  int64_t lhs_dil[3] = {1, 1, 1};
  int64_t rhs_dil[3] = {1, 1, 1};

  JAXDNN_HD int64_t Cg() const { return C / G; }
  JAXDNN_HD int64_t Kg() const { return K / G; }
  JAXDNN_HD int64_t in_spatial() const { return in[0] * in[1] * in[2]; }
  JAXDNN_HD int64_t out_spatial() const { return out[0] * out[1] * out[2]; }
  JAXDNN_HD int64_t filt_spatial() const { return filt[0] * filt[1] * filt[2]; }
  JAXDNN_HD int64_t x_elems() const { return N * in_spatial() * C; }
  JAXDNN_HD int64_t w_elems() const { return filt_spatial() * Cg() * K; }
  JAXDNN_HD int64_t y_elems() const { return N * out_spatial() * K; }
  // Multiply-adds of one direction (all three are equal): N*Z*P*Q*K * T*R*S*Cg.
  JAXDNN_HD double macs() const { return double(y_elems()) * double(filt_spatial() * Cg()); }
};

// The dilated-input coordinate read by output o and tap f along `axis`; see the header.
JAXDNN_HD int64_t dilated_coord(int64_t o, int64_t f, int64_t stride, int64_t pad_lo,
                                int64_t rhs_dil) {
  return o * stride - pad_lo + f * rhs_dil;
}

// Maps a dilated coordinate to an input index, or -1 if it falls on padding or a hole.
JAXDNN_HD int64_t input_index(int64_t u, int64_t in, int64_t lhs_dil) {
  if (u < 0 || u > (in - 1) * lhs_dil) return -1;
  if (lhs_dil != 1 && u % lhs_dil != 0) return -1;
  return u / lhs_dil;
}

// Input index along `axis` read by output o through tap f, or -1 on padding or a hole.
JAXDNN_HD int64_t in_idx(const Problem& p, int axis, int64_t o, int64_t f) {
  return input_index(dilated_coord(o, f, p.stride[axis], p.pad_lo[axis], p.rhs_dil[axis]),
                     p.in[axis], p.lhs_dil[axis]);
}

// Output index along `axis` that reads input i through tap f, or -1 if none does (the inverse
// of in_idx, used by gather-style backward-data kernels).
JAXDNN_HD int64_t out_idx(const Problem& p, int axis, int64_t i, int64_t f) {
  const int64_t num = i * p.lhs_dil[axis] + p.pad_lo[axis] - f * p.rhs_dil[axis];
  if (num < 0 || num % p.stride[axis] != 0) return -1;
  const int64_t o = num / p.stride[axis];
  return o < p.out[axis] ? o : -1;
}

// Output size along one axis (0 when the window does not fit anywhere).
inline int64_t out_size(int64_t in, int64_t filt, int64_t stride, int64_t pad_lo, int64_t pad_hi,
                        int64_t lhs_dil, int64_t rhs_dil) {
  int64_t in_d = in == 0 ? 0 : (in - 1) * lhs_dil + 1;
  int64_t f_d = filt == 0 ? 0 : (filt - 1) * rhs_dil + 1;
  int64_t span = in_d + pad_lo + pad_hi - f_d;
  return span < 0 ? 0 : span / stride + 1;
}

// Checks that the descriptor is self-consistent (the Python layer has already produced a
// consistent one; this guards the FFI boundary against malformed custom calls).
inline Status validate(const Problem& p) {
  if (p.N < 0 || p.C < 0 || p.K < 0) return Status::Error("negative dimension");
  if (p.G < 1 || p.C % p.G != 0 || p.K % p.G != 0)
    return Status::Error("groups=" + std::to_string(p.G) + " must divide C=" +
                         std::to_string(p.C) + " and K=" + std::to_string(p.K));
  for (int a = 0; a < 3; ++a) {
    if (p.stride[a] < 1 || p.lhs_dil[a] < 1 || p.rhs_dil[a] < 1)
      return Status::Error("stride and dilations must be >= 1");
    if (p.in[a] < 0 || p.filt[a] < 0 || p.out[a] < 0) return Status::Error("negative spatial size");
    int64_t want = out_size(p.in[a], p.filt[a], p.stride[a], p.pad_lo[a], p.pad_hi[a],
                            p.lhs_dil[a], p.rhs_dil[a]);
    if (want != p.out[a])
      return Status::Error("spatial axis " + std::to_string(a) + ": output size " +
                           std::to_string(p.out[a]) + " but the window gives " +
                           std::to_string(want));
  }
  return Status::Ok();
}

// Where the rows (pixels) of a result go: dense, or (a residue class of strided bwd_data,
// strided_classes.h) row m = (n, i0, i1, i2) of the class's grid `size` to pixel
// ((n * dx[0] + i0 * stride[0] + residue[0]) * dx[1] + ...) of the full result. Only the
// GEMM algorithms' Hopper (wgmma) epilogue takes a mapped one.
// 32-bit: the GEMM algorithms take tensors below 2^31 elements (gemm_dtype_support), so
// pixel counts fit, and the epilogue's divisions stay cheap.
struct ResultRows {
  int32_t size[3] = {0, 0, 0};  // size[2] == 0: dense
  int32_t stride[3] = {1, 1, 1}, residue[3] = {0, 0, 0}, dx[3] = {1, 1, 1};
  JAXDNN_HD bool mapped() const { return size[2] != 0; }
  JAXDNN_HD int32_t row(int32_t m) const {
    const int32_t i2 = m % size[2], r = m / size[2], i1 = r % size[1], r2 = r / size[1];
    const int32_t i0 = r2 % size[0], n = r2 / size[0];
    return ((n * dx[0] + i0 * stride[0] + residue[0]) * dx[1] + i1 * stride[1] + residue[1]) *
               dx[2] + i2 * stride[2] + residue[2];
  }
};

// A kernel variant: the choices an algorithm otherwise makes itself from the problem and the
// GPU or CPU, each left to it (kAuto) or pinned by an option of the algorithm's name (variant.h
// has the grammar, e.g. "implicit_precomp_gemm.wgmma.table.tma_b.128x128.ws", "im2col_gemm.avx2").
enum class Pin : int8_t { kAuto = 0, kOn = 1, kOff = 2 };
struct Variant {
  Pin wgmma = Pin::kAuto;       // wgmma | mma_sync: Hopper's warpgroup MMA or sm_80's mma.sync
  Pin ws = Pin::kAuto;          // ws | no_ws: the warp-specialised wgmma kernel (wide tiles)
  Pin tma_b = Pin::kAuto;       // tma_b | gather_b: the B operand through TMA boxes
  Pin im2col = Pin::kAuto;      // im2col_tma | table: A through TMA's im2col mode, or a table
  Pin class_rows = Pin::kAuto;  // class_rows | scatter: strided bwd_data classes' stores
  Pin halo = Pin::kAuto;        // halo | no_halo: the halo kernels of implicit_gemm*
  int tile_n = 0;               // 128x64 | 128x128 | 128x256 (0: by the problem)
  CpuIsa isa = CpuIsa::kAuto;   // generic | avx2 | avx512: the CPU GEMM's instruction set
};

// A problem plus its dtypes: what an algorithm's supports() and workspace_bytes() look at.
struct Args {
  Direction dir = Direction::kFwd;
  Problem p;
  DType in = DType::kF32;   // dtype of the two operands
  DType out = DType::kF32;  // dtype of the result
  bool tf32 = false;        // float32 operands may be rounded to TF32 (lax's default precision)
  ResultRows rows;          // dense unless set by the strided bwd_data classes
  Variant variant;          // the options of the algorithm's name
  const FusedEpilogue* epilogue = nullptr;  // the fused forward's (epilogue.h), or null
};

// Integer inputs run on the direct algorithms alone (exact, wrapping sums): every other
// algorithm's supports() declines them with this reason first.
inline Support float_inputs(const Args& a) {
  return is_integer(a.in) ? Support::No("integer inputs: direct only") : Support::Yes();
}

// The three buffers of a call, named by role in the *forward* problem. For kFwd, x and w are
// read and y written; kBwdData reads y (= dy) and w and writes x (= dx); kBwdFilter reads x
// and y (= dy) and writes w (= dw).
struct Buffers {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* y = nullptr;
  void* result = nullptr;
};

}  // namespace jaxdnn::conv
