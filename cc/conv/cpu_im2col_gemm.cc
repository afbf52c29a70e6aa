// CPU convolution as im2col + cache-blocked GEMM (cc/common/cpu_gemm.h), every direction and
// case. Per group g, with Cg = C/G, Kg = K/G, F = T*R*S taps and M = N*Z*P*Q output positions:
//
//   fwd        y_g (M, Kg)       = col_g (M, F*Cg) . w_g (F*Cg, Kg)
//   bwd_data   dcol_g (M, F*Cg)  = dy_g (M, Kg) . w_g^T,   then  dx_g = col2im(dcol_g)
//   bwd_filter dw_g (F*Cg, Kg)   = col_g^T (F*Cg, M) . dy_g (M, Kg)
//
// col_g[m, (t, r, s, c)] = x[n, input position of (m, tap t r s), g*Cg + c], 0 on padding and
// lhs-dilation holes (im2col). The col matrix is never held whole: each worker builds one
// (rows, kc) block of it at a time (<= 256 KB), converting 16-bit inputs to float.
// Pointwise problems (1x1x1 filter, stride 1, no padding or dilation) read x itself as col.
//
// Threads and determinism (every direction is bitwise reproducible for any thread count):
//   fwd, pointwise bwd_data  row chunks of M (x groups) are independent tasks; w is packed
//                            once (shared) and each element of y is one GEMM dot product.
//   bwd_data                 one task per (image, group) owns its slice of dx: it computes
//                            dcol for the image chunk by chunk (<= 1 MB) and scatter-adds it
//                            into its own dx rows in a fixed order (no other task writes them).
//   bwd_filter               tasks are (group, block of F*Cg rows, block of Kg columns) tiles
//                            of dw; each reduces over all M positions in fixed k blocks of 256,
//                            building its slice of col and packing dy block by block.
// Results of 16-bit outputs are accumulated in float scratch and rounded once at the end.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>

#include "cc/common/cpu_gemm.h"
#include "cc/conv/cpu_algorithms.h"

namespace jaxdnn::conv {
namespace {

using gemm::Mat;

constexpr int64_t kMaxChunkRows = 256;     // rows of a fwd / pointwise chunk
constexpr int64_t kDcolBytes = 1 << 20;    // a bwd_data dcol chunk per worker
constexpr int64_t kFilterMaxRows = 224;    // rows of F*Cg in a bwd_filter task tile

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
int64_t aligned(int64_t bytes) { return round_up(bytes, 64); }

// Compute type: double for float64, float for everything else.
template <typename In> using Acc = acc_t<In>;

bool pointwise(const Problem& p) {
  if (p.filt_spatial() != 1) return false;
  for (int a = 0; a < 3; ++a)
    if (p.stride[a] != 1 || p.pad_lo[a] != 0 || p.pad_hi[a] != 0 || p.lhs_dil[a] != 1)
      return false;
  return true;
}

// Input index along axis a read by output o through tap f, or -1 on padding or a hole.
int64_t tap_input(const Problem& p, int a, int64_t o, int64_t f) {
  return input_index(dilated_coord(o, f, p.stride[a], p.pad_lo[a], p.rhs_dil[a]), p.in[a],
                     p.lhs_dil[a]);
}

// Taps s of the last axis that read real inputs for an output whose first tap reads dilated
// coordinate u0, when rhs and lhs dilation are 1 there: [lo, hi), possibly empty.
void valid_taps(const Problem& p, int64_t u0, int64_t* lo, int64_t* hi) {
  const int64_t S = p.filt[2];
  *lo = std::clamp<int64_t>(-u0, 0, S);
  *hi = std::max(*lo, std::clamp<int64_t>(p.in[2] - u0, 0, S));
}

template <typename In, typename T>
void copy_run(const In* src, int64_t len, T* dst) {
  if constexpr (std::is_same_v<In, T>) {
    std::memcpy(dst, src, size_t(len) * sizeof(T));
  } else {
    for (int64_t i = 0; i < len; ++i) dst[i] = T(load_acc(src[i]));
  }
}

template <typename T>
void zero_run(T* dst, int64_t len) {
  if (len > 0) std::fill(dst, dst + len, T(0));
}

// Columns [j0, j1) of rows [m0, m0 + rows) of col_g into dst (rows, j1 - j0), pitch ld.
// Column j = ((t*R + r)*S + s)*Cg + c; a (t, r) "segment" is S*Cg consecutive columns, which
// with one group and no dilation along W are also consecutive in x (one copy per segment).
template <typename In, typename T>
void im2col(const Problem& p, const In* x, int64_t g, int64_t m0, int64_t rows, int64_t j0,
            int64_t j1, T* dst, int64_t ld) {
  const int64_t D = p.in[0], H = p.in[1], W = p.in[2], C = p.C, Cg = p.Cg();
  const int64_t Z = p.out[0], P = p.out[1], Q = p.out[2], R = p.filt[1], S = p.filt[2];
  const int64_t seg = S * Cg;
  const bool contiguous = p.G == 1 && p.rhs_dil[2] == 1 && p.lhs_dil[2] == 1;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t m = m0 + row;
    const int64_t q = m % Q, pp = m / Q % P, z = m / (Q * P) % Z, n = m / (Q * P * Z);
    const int64_t u0 = dilated_coord(q, 0, p.stride[2], p.pad_lo[2], p.rhs_dil[2]);
    T* out = dst + row * ld - j0;  // out[j] is column j
    for (int64_t tr = j0 / seg; tr * seg < j1; ++tr) {
      const int64_t base = tr * seg, lo = std::max(j0, base), hi = std::min(j1, base + seg);
      const int64_t id = tap_input(p, 0, z, tr / R), ih = tap_input(p, 1, pp, tr % R);
      if (id < 0 || ih < 0) {
        zero_run(out + lo, hi - lo);
        continue;
      }
      const In* xrow = x + ((n * D + id) * H + ih) * W * C + g * Cg;  // x[n, id, ih, 0, g*Cg]
      if (contiguous) {  // column base + s*Cg + c is x[.., u0 + s, c]
        int64_t s_lo, s_hi;
        valid_taps(p, u0, &s_lo, &s_hi);
        const int64_t a = std::clamp(base + s_lo * Cg, lo, hi), b = std::clamp(base + s_hi * Cg, a, hi);
        zero_run(out + lo, a - lo);
        copy_run(xrow + u0 * Cg + (a - base), b - a, out + a);
        zero_run(out + b, hi - b);
        continue;
      }
      for (int64_t s = (lo - base) / Cg; base + s * Cg < hi; ++s) {
        const int64_t a = std::max(lo, base + s * Cg), b = std::min(hi, base + (s + 1) * Cg);
        const int64_t iw = input_index(u0 + s * p.rhs_dil[2], W, p.lhs_dil[2]);
        if (iw < 0)
          zero_run(out + a, b - a);
        else
          copy_run(xrow + iw * C + (a - base - s * Cg), b - a, out + a);
      }
    }
  }
}

// Scatter-adds rows [m0, m0 + rows) (positions within one image) of dcol (pitch ldd, columns
// as in im2col) into acc, that image's dx for one group: element (input position i, c) at
// acc[i * ld_acc + c]. Rows are added in order, so the sums are reproducible.
template <typename T>
void col2im(const Problem& p, const T* dcol, int64_t ldd, int64_t m0, int64_t rows, T* acc,
            int64_t ld_acc) {
  const int64_t H = p.in[1], W = p.in[2], Cg = p.Cg();
  const int64_t P = p.out[1], Q = p.out[2], T_ = p.filt[0], R = p.filt[1], S = p.filt[2];
  const bool contiguous = ld_acc == Cg && p.rhs_dil[2] == 1 && p.lhs_dil[2] == 1;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t m = m0 + row;
    const int64_t q = m % Q, pp = m / Q % P, z = m / (Q * P);
    const int64_t u0 = dilated_coord(q, 0, p.stride[2], p.pad_lo[2], p.rhs_dil[2]);
    for (int64_t t = 0; t < T_; ++t) {
      const int64_t id = tap_input(p, 0, z, t);
      if (id < 0) continue;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t ih = tap_input(p, 1, pp, r);
        if (ih < 0) continue;
        const T* src = dcol + row * ldd + (t * R + r) * S * Cg;  // (S, Cg) of this segment
        T* dst = acc + (id * H + ih) * W * ld_acc;                 // dx[id, ih, 0, :]
        if (contiguous) {
          int64_t s_lo, s_hi;
          valid_taps(p, u0, &s_lo, &s_hi);
          T* d = dst + (u0 + s_lo) * Cg;
          const T* sp = src + s_lo * Cg;
          for (int64_t i = 0, len = (s_hi - s_lo) * Cg; i < len; ++i) d[i] += sp[i];
          continue;
        }
        for (int64_t s = 0; s < S; ++s) {
          const int64_t iw = input_index(u0 + s * p.rhs_dil[2], W, p.lhs_dil[2]);
          if (iw < 0) continue;
          T* d = dst + iw * ld_acc;
          const T* sp = src + s * Cg;
          for (int64_t c = 0; c < Cg; ++c) d[c] += sp[c];
        }
      }
    }
  }
}

// dst (rows, cols) pitch ldd = src (rows, cols) pitch lds, rounded to Out.
template <typename T, typename Out>
void store_rows(const T* src, int64_t lds, int64_t rows, int64_t cols, Out* dst, int64_t ldd) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * ldd + j] = store_as<Out>(double(src[i * lds + j]));
}

// Workers and their memory. Task t runs on some worker w with scratch(w) to itself; which
// worker runs which task does not change any result.
struct Layout {
  int64_t workers = 1;
  int64_t shared = 0;  // bytes shared by all workers (packed B)
  int64_t scratch = 0;  // bytes per worker
  int64_t bytes() const { return shared + workers * scratch; }
};

// One allocation of layout.bytes() (uninitialised, 64-byte aligned) for a call.
struct Workspace {
  explicit Workspace(const Layout& l) : layout(l), buf(new char[size_t(l.bytes()) + 64]) {
    mem = buf.get() + (64 - reinterpret_cast<uintptr_t>(buf.get()) % 64) % 64;
  }
  template <typename T> T* shared() const { return reinterpret_cast<T*>(mem); }
  char* scratch(int64_t w) const { return mem + layout.shared + w * layout.scratch; }
  Layout layout;
  std::unique_ptr<char[]> buf;
  char* mem;
};

// Hands out consecutive, 64-byte aligned arrays of one worker's scratch.
struct Carver {
  char* p;
  template <typename T> T* take(int64_t elems) {
    T* out = reinterpret_cast<T*>(p);
    p += aligned(elems * int64_t(sizeof(T)));
    return out;
  }
};

void run_tasks(const Parallel& par, const Workspace& ws, int64_t tasks,
               const std::function<void(int64_t task, char* scratch)>& fn) {
  std::atomic<int64_t> next{0};
  par.for_each(ws.layout.workers, [&](int64_t w) {
    for (int64_t t; (t = next.fetch_add(1)) < tasks;) fn(t, ws.scratch(w));
  });
}

int64_t workers_for(int64_t tasks, int num_threads) {
  return std::max<int64_t>(1, std::min<int64_t>(tasks, num_threads));
}

// Packs B_g (k, n) for every group g (B_g = b shifted by g*b_step) into G consecutive packed
// matrices, one n-strip per parallel task.
template <typename T, typename In>
void pack_groups(const Parallel& par, int64_t G, Mat<In> b, int64_t b_step, int64_t k, int64_t n,
                 T* packed) {
  const int64_t strips = gemm::b_strips(n, gemm::blocking<T>()), size = gemm::packed_b_elems<T>(k, n);
  par.for_each(G * strips, [&](int64_t i) {
    const int64_t g = i / strips;
    gemm::pack_b_strip<T, In>({b.data + g * b_step, b.rs, b.cs}, k, n, i % strips, packed + g * size);
  });
}

// ---------------------------------------------------------------------------------------------
// Row GEMMs: out_g (M, n) = A_g (M, k) . B_g (k, n) for every group, M split into chunks.
// fwd: A = col (or x when pointwise), B = w.  Pointwise bwd_data: A = dy, B = w^T.
// ---------------------------------------------------------------------------------------------

template <typename In>
struct RowGemm {
  int64_t G, M, n, k;
  bool im2col;     // A_g is col_g of x; otherwise rows of a: A_g[m, :] = a[m*lda + g*k + :]
  const In* a;
  int64_t lda;
  Mat<In> b;       // B_g = b shifted by g*b_step
  int64_t b_step;
};

template <typename T>
int64_t row_chunk(int64_t M, int64_t G, int num_threads) {
  const int64_t mr = gemm::blocking<T>().mr;
  const int64_t per_group = ceil_div(4 * int64_t(num_threads), G);  // about 4 tasks a thread
  return std::clamp(round_up(ceil_div(M, per_group), mr), mr, kMaxChunkRows);
}

template <typename T, typename In>
Layout row_gemm_layout(const RowGemm<In>& rg, bool out_is_acc, int num_threads) {
  const int64_t rows = row_chunk<T>(rg.M, rg.G, num_threads);
  Layout l;
  l.workers = workers_for(rg.G * ceil_div(rg.M, rows), num_threads);
  l.shared = aligned(rg.G * gemm::packed_b_elems<T>(rg.k, rg.n) * int64_t(sizeof(T)));
  if (rg.im2col) l.scratch += aligned(rows * gemm::blocking<T>().kc_max * int64_t(sizeof(T)));
  if (!out_is_acc) l.scratch += aligned(rows * rg.n * int64_t(sizeof(T)));
  return l;
}

template <typename In, typename Out>
void row_gemm(const Problem& p, const RowGemm<In>& rg, Out* out, int64_t ldo, const Parallel& par) {
  using T = Acc<In>;
  constexpr bool kDirect = std::is_same_v<T, Out>;
  const Workspace ws(row_gemm_layout<T>(rg, kDirect, par.num_threads()));
  T* packed = ws.shared<T>();
  const int64_t psize = gemm::packed_b_elems<T>(rg.k, rg.n);
  pack_groups(par, rg.G, rg.b, rg.b_step, rg.k, rg.n, packed);
  const int64_t rows = row_chunk<T>(rg.M, rg.G, par.num_threads()), chunks = ceil_div(rg.M, rows);
  run_tasks(par, ws, rg.G * chunks, [&](int64_t task, char* scratch) {
    const int64_t g = task / chunks, m0 = task % chunks * rows, mc = std::min(rows, rg.M - m0);
    Carver carve{scratch};
    T* col = rg.im2col ? carve.take<T>(rows * gemm::blocking<T>().kc_max) : nullptr;
    T* c;
    int64_t ldc;
    if constexpr (kDirect) {
      c = out + m0 * ldo + g * rg.n, ldc = ldo;
    } else {
      c = carve.take<T>(rows * rg.n), ldc = rg.n;
    }
    const T* pb = packed + g * psize;
    if (!rg.im2col) {
      const Mat<In> a = gemm::row_major(rg.a + m0 * rg.lda + g * rg.k, rg.lda);
      gemm::gemm_packed<T, In>(mc, rg.n, rg.k, [&](int64_t k0, int64_t) { return a.sub(0, k0); },
                               pb, c, ldc, false);
    } else {
      auto block = [&](int64_t k0, int64_t kc) {
        im2col(p, rg.a, g, m0, mc, k0, k0 + kc, col, kc);
        return gemm::row_major<T>(col, kc);
      };
      gemm::gemm_packed<T, T>(mc, rg.n, rg.k, block, pb, c, ldc, false);
    }
    if constexpr (!kDirect) store_rows(c, ldc, mc, rg.n, out + m0 * ldo + g * rg.n, ldo);
  });
}

template <typename In>
RowGemm<In> fwd_gemm(const Problem& p, const In* x, const In* w) {
  const int64_t Kdim = p.filt_spatial() * p.Cg();
  return {p.G, p.N * p.out_spatial(), p.Kg(), Kdim, !pointwise(p), x, p.C,
          gemm::row_major(w, p.K), p.Kg()};
}

template <typename In>
RowGemm<In> pointwise_data_gemm(const Problem& p, const In* dy, const In* w) {
  return {p.G, p.N * p.out_spatial(), p.Cg(), p.Kg(), false, dy, p.K, gemm::transposed(w, p.K),
          p.Kg()};
}

// ---------------------------------------------------------------------------------------------
// bwd_data (general): one task per (image, group).
// ---------------------------------------------------------------------------------------------

template <typename T>
int64_t dcol_rows(const Problem& p) {
  const int64_t mr = gemm::blocking<T>().mr, Kdim = std::max<int64_t>(1, p.filt_spatial() * p.Cg());
  const int64_t rows = std::max(mr, kDcolBytes / int64_t(sizeof(T)) / Kdim / mr * mr);
  return std::max<int64_t>(1, std::min(rows, p.out_spatial()));
}

template <typename T>
Layout data_layout(const Problem& p, bool out_is_acc, int num_threads) {
  const int64_t Kdim = p.filt_spatial() * p.Cg();
  Layout l;
  l.workers = workers_for(p.N * p.G, num_threads);
  l.shared = aligned(p.G * gemm::packed_b_elems<T>(p.Kg(), Kdim) * int64_t(sizeof(T)));
  l.scratch = aligned(dcol_rows<T>(p) * Kdim * int64_t(sizeof(T)));
  if (!out_is_acc) l.scratch += aligned(p.in_spatial() * p.Cg() * int64_t(sizeof(T)));
  return l;
}

template <typename In, typename Out>
void bwd_data(const Problem& p, const In* dy, const In* w, Out* dx, const Parallel& par) {
  using T = Acc<In>;
  if (pointwise(p)) return row_gemm(p, pointwise_data_gemm(p, dy, w), dx, p.C, par);
  constexpr bool kDirect = std::is_same_v<T, Out>;  // accumulate straight into dx
  const int64_t Kdim = p.filt_spatial() * p.Cg(), Kg = p.Kg(), Cg = p.Cg();
  const int64_t ZPQ = p.out_spatial(), inS = p.in_spatial();
  const Workspace ws(data_layout<T>(p, kDirect, par.num_threads()));
  T* packed = ws.shared<T>();
  const int64_t psize = gemm::packed_b_elems<T>(Kg, Kdim), rows = dcol_rows<T>(p);
  pack_groups(par, p.G, gemm::transposed(w, p.K), Kg, Kg, Kdim, packed);
  run_tasks(par, ws, p.N * p.G, [&](int64_t task, char* scratch) {
    const int64_t n = task / p.G, g = task % p.G;
    Carver carve{scratch};
    T* dcol = carve.take<T>(rows * Kdim);
    T* acc;
    int64_t ld_acc;
    if constexpr (kDirect) {
      acc = dx + n * inS * p.C + g * Cg, ld_acc = p.C;
    } else {
      acc = carve.take<T>(inS * Cg), ld_acc = Cg;
    }
    for (int64_t i = 0; i < inS; ++i) zero_run(acc + i * ld_acc, Cg);
    const In* dyn = dy + n * ZPQ * p.K + g * Kg;
    for (int64_t m0 = 0; m0 < ZPQ; m0 += rows) {
      const int64_t mc = std::min(rows, ZPQ - m0);
      const Mat<In> a = gemm::row_major(dyn + m0 * p.K, p.K);
      gemm::gemm_packed<T, In>(mc, Kdim, Kg, [&](int64_t k0, int64_t) { return a.sub(0, k0); },
                               packed + g * psize, dcol, Kdim, false);
      col2im(p, dcol, Kdim, m0, mc, acc, ld_acc);
    }
    if constexpr (!kDirect) store_rows(acc, Cg, inS, Cg, dx + n * inS * p.C + g * Cg, p.C);
  });
}

// ---------------------------------------------------------------------------------------------
// bwd_filter: tasks are (group, row block, column block) tiles of dw.
// ---------------------------------------------------------------------------------------------

struct FilterTiles {
  int64_t rows, cols;  // tile size (the last ones shorter)
  int64_t row_blocks, col_blocks;
};

template <typename T>
FilterTiles filter_tiles(const Problem& p, int num_threads) {
  const gemm::Blocking& blk = gemm::blocking<T>();
  const int64_t Fc = p.filt_spatial() * p.Cg(), Kg = p.Kg();
  FilterTiles t;
  t.cols = std::max<int64_t>(1, std::min(Kg, blk.nc));
  t.col_blocks = ceil_div(Kg, t.cols);
  const int64_t want = ceil_div(4 * int64_t(num_threads), p.G * t.col_blocks);  // row blocks
  t.rows = std::clamp(round_up(ceil_div(Fc, want), blk.mr), int64_t(blk.mr), kFilterMaxRows);
  t.row_blocks = ceil_div(Fc, t.rows);
  return t;
}

template <typename T>
Layout filter_layout(const Problem& p, bool out_is_acc, int num_threads) {
  const FilterTiles t = filter_tiles<T>(p, num_threads);
  const int64_t kc = gemm::blocking<T>().kc_max;
  Layout l;
  l.workers = workers_for(p.G * t.row_blocks * t.col_blocks, num_threads);
  l.scratch = aligned(gemm::packed_b_elems<T>(kc, t.cols) * int64_t(sizeof(T)));
  if (!pointwise(p)) l.scratch += aligned(kc * t.rows * int64_t(sizeof(T)));
  if (!out_is_acc) l.scratch += aligned(t.rows * t.cols * int64_t(sizeof(T)));
  return l;
}

template <typename In, typename Out>
void bwd_filter(const Problem& p, const In* x, const In* dy, Out* dw, const Parallel& par) {
  using T = Acc<In>;
  constexpr bool kDirect = std::is_same_v<T, Out>;
  const FilterTiles tiles = filter_tiles<T>(p, par.num_threads());
  const Workspace ws(filter_layout<T>(p, kDirect, par.num_threads()));
  const int64_t M = p.N * p.out_spatial(), Fc = p.filt_spatial() * p.Cg(), Kg = p.Kg();
  const bool pw = pointwise(p);
  const gemm::KBlocks kb = gemm::k_blocks<T>(M);
  const int64_t kc_max = gemm::blocking<T>().kc_max;
  const int64_t per_group = tiles.row_blocks * tiles.col_blocks;
  run_tasks(par, ws, p.G * per_group, [&](int64_t task, char* scratch) {
    const int64_t g = task / per_group, i0 = task % per_group / tiles.col_blocks * tiles.rows,
                  j0 = task % tiles.col_blocks * tiles.cols;
    const int64_t rb = std::min(tiles.rows, Fc - i0), cb = std::min(tiles.cols, Kg - j0);
    Carver carve{scratch};
    T* packed = carve.take<T>(gemm::packed_b_elems<T>(kc_max, tiles.cols));
    T* col = pw ? nullptr : carve.take<T>(kc_max * tiles.rows);
    T* c;
    int64_t ldc;
    if constexpr (kDirect) {
      c = dw + i0 * p.K + g * Kg + j0, ldc = p.K;
    } else {
      c = carve.take<T>(tiles.rows * tiles.cols), ldc = tiles.cols;
    }
    for (int64_t b = 0; b < kb.count; ++b) {
      const int64_t m0 = kb.begin(b), kc = kb.len(b, M);
      const Mat<In> dyb = gemm::row_major(dy + m0 * p.K + g * Kg + j0, p.K);  // (kc, cb)
      for (int64_t s = 0; s < gemm::b_strips(cb, gemm::blocking<T>()); ++s)
        gemm::pack_b_strip<T, In>(dyb, kc, cb, s, packed);
      if (pw) {
        const Mat<In> a = gemm::transposed(x + m0 * p.C + g * p.Cg() + i0, p.C);  // (rb, kc)
        gemm::gemm_block<T, In>(rb, cb, kc, a, packed, c, ldc, b > 0);
      } else {
        im2col(p, x, g, m0, kc, i0, i0 + rb, col, rb);  // (kc, rb)
        gemm::gemm_block<T, T>(rb, cb, kc, gemm::transposed<T>(col, rb), packed, c, ldc, b > 0);
      }
    }
    if (kb.count == 0)
      for (int64_t i = 0; i < rb; ++i) zero_run(c + i * ldc, cb);
    if constexpr (!kDirect) store_rows(c, ldc, rb, cb, dw + i0 * p.K + g * Kg + j0, p.K);
  });
}

// ---------------------------------------------------------------------------------------------
// Registry entry
// ---------------------------------------------------------------------------------------------

Support supports(const Args& a) {
  if (!dispatch_io(a.in, a.out, [](auto, auto) {}))
    return Support::No(std::string("unsupported dtypes ") + dtype_name(a.in) + " -> " +
                       dtype_name(a.out));
  return Support::Yes();
}

template <typename T>
int64_t workspace_for(const Args& a, int num_threads) {
  const bool out_is_acc = a.out == (std::is_same_v<T, double> ? DType::kF64 : DType::kF32);
  const Problem& p = a.p;
  switch (a.dir) {
    case Direction::kFwd:
      return row_gemm_layout<T>(fwd_gemm<T>(p, nullptr, nullptr), out_is_acc, num_threads).bytes();
    case Direction::kBwdData:
      if (pointwise(p))
        return row_gemm_layout<T>(pointwise_data_gemm<T>(p, nullptr, nullptr), out_is_acc,
                                  num_threads).bytes();
      return data_layout<T>(p, out_is_acc, num_threads).bytes();
    case Direction::kBwdFilter:
      return filter_layout<T>(p, out_is_acc, num_threads).bytes();
  }
  return 0;
}

int64_t workspace_bytes(const Args& a, int num_threads) {
  return a.in == DType::kF64 ? workspace_for<double>(a, num_threads)
                             : workspace_for<float>(a, num_threads);
}

Status run(const Args& a, const Buffers& b, const Parallel& par) {
  const Problem& p = a.p;
  bool ok = dispatch_io(a.in, a.out, [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    const In* x = static_cast<const In*>(b.x);
    const In* w = static_cast<const In*>(b.w);
    const In* y = static_cast<const In*>(b.y);
    Out* result = static_cast<Out*>(b.result);
    switch (a.dir) {
      case Direction::kFwd: row_gemm(p, fwd_gemm(p, x, w), result, p.K, par); break;
      case Direction::kBwdData: bwd_data(p, y, w, result, par); break;
      case Direction::kBwdFilter: bwd_filter(p, x, y, result, par); break;
    }
  });
  if (!ok)
    return Status::Error(std::string("conv im2col_gemm: unsupported dtypes ") + dtype_name(a.in) +
                         " -> " + dtype_name(a.out));
  return Status::Ok();
}

}  // namespace

const CpuAlgorithm kCpuIm2colGemm = {"im2col_gemm", /*deterministic=*/true, supports,
                                     workspace_bytes, run};

}  // namespace jaxdnn::conv
