// CPU convolution as im2col + cache-blocked GEMM (cc/common/cpu_gemm.h), every direction and
// case. Per group g, with Cg = C/G, Kg = K/G, F = T*R*S taps and M = N*Z*P*Q output positions:
//
//   fwd        y_g (M, Kg)       = col_g (M, F*Cg) . w_g (F*Cg, Kg)
//   bwd_data   dcol_g (M, F*Cg)  = dy_g (M, Kg) . w_g^T,   then  dx_g += col2im(dcol_g)
//   bwd_filter dw_g (F*Cg, Kg)   = col_g^T (F*Cg, M) . dy_g (M, Kg)
//
// col_g[m, (t, r, s, c)] = x[n, input position of (m, tap t r s), g*Cg + c], 0 on padding and
// lhs-dilation holes. Neither col nor dcol is ever held whole: a worker builds one (<= 256
// rows, one k block of <= 256 columns) block of col at a time (256 KB, converting 16-bit
// inputs to float), and a (<= 256, <= 512) block of dcol. Pointwise problems (1x1x1 filter,
// stride 1, no padding or dilation) read x (dy) itself as the GEMM operand: no copy at all.
//
// Threads and determinism (every direction is bitwise reproducible for any thread count):
//   fwd, pointwise bwd_data  tasks are row chunks of M (per group); w is packed once, shared,
//                            and each element of y is one GEMM dot product.
//   bwd_data                 tasks are (block of images, group): a task owns that slice of dx
//                            and scatter-adds dcol into it chunk by chunk in a fixed order.
//   bwd_filter               tasks are tiles of dw within slices of the M positions; slices
//                            (chosen from the problem alone) write partial dw that are added
//                            in slice order at the end.
// 16-bit outputs are accumulated in float and rounded once at the end.
// Variants (cc/conv/variant.h): the GEMM's instruction set, im2col_gemm.avx512 | .avx2 | .generic
// (by default the best this CPU supports); it sets the microkernel, the blocking, the A packing
// and the 16-bit conversions of the whole call. Each variant is deterministic on its own.
// Traffic: x (or dy) is read once per column panel of the GEMM (once when Kg, resp. F*Cg,
// fits one 512-wide panel) plus one im2col copy that stays in L2; w is read and packed once;
// y is written once (bwd_data: dx is read-modify-written once per tap that reaches it, in L2).

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cc/common/cpu_gemm.h"
#include "cc/conv/cpu_algorithms.h"

namespace jaxdnn::conv {
namespace {

using gemm::Mat;

constexpr int64_t kMaxChunkRows = 256;   // rows of M in one chunk (fwd, bwd_data)
constexpr int64_t kFilterMaxRows = 224;  // rows of F*Cg in a bwd_filter task tile

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

// Input index read through dilated coordinate u along axis a, or -1 (padding or a hole).
int64_t input_at(const Problem& p, int a, int64_t u) {
  if (p.lhs_dil[a] == 1) return u >= 0 && u < p.in[a] ? u : -1;  // no division
  return input_index(u, p.in[a], p.lhs_dil[a]);
}

// Walks columns [j0, j1) of rows [m0, m0 + rows) of the col matrix of one group,
//   col[m, j = ((t*R + r)*S + s)*Cg + c] = x[input position of (m, tap t r s), c],
// as runs: fn(row, j, len, pos, c0) says that columns [j, j + len) of that row read
// channels c0, c0 + 1, ... of input position pos (flattened n, d, h, w), or padding when
// pos < 0. Without `merge` a run stays inside one tap, so len <= Cg. With `merge` (no
// dilation along W, and the caller's layout holds exactly Cg channels per position) a run
// covers every valid tap s of a (t, r) segment: consecutive columns are then consecutive
// (pos, c) elements, i.e. element pos*Cg + c0 + i.
template <typename Fn>
void for_each_run(const Problem& p, int64_t m0, int64_t rows, int64_t j0, int64_t j1, bool merge,
                  Fn&& fn) {
  const int64_t D = p.in[0], H = p.in[1], W = p.in[2], Cg = p.Cg();
  const int64_t Z = p.out[0], P = p.out[1], Q = p.out[2], R = p.filt[1], S = p.filt[2];
  const int64_t seg = S * Cg;
  if (rows <= 0 || j1 <= j0) return;
  // (n, z, pp, q) of row m0, then stepped row by row; the first segment and its (t, r).
  int64_t q = m0 % Q, pp = m0 / Q % P, z = m0 / (Q * P) % Z, n = m0 / (Q * P * Z);
  const int64_t tr0 = j0 / seg, t0 = tr0 / R, r0 = tr0 % R;
  // Dilated coordinate read by output o through tap f along axis a.
  auto coord = [&](int a, int64_t o, int64_t f) {
    return dilated_coord(o, f, p.stride[a], p.pad_lo[a], p.rhs_dil[a]);
  };
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t u0 = coord(2, q, 0);
    int64_t s_lo = 0, s_hi = 0;  // taps of a merged run: 0 <= u0 + s < W
    if (merge) {
      s_lo = std::clamp<int64_t>(-u0, 0, S);
      s_hi = std::max(s_lo, std::clamp<int64_t>(W - u0, 0, S));
    }
    for (int64_t tr = tr0, t = t0, r = r0; tr * seg < j1; ++tr) {
      const int64_t base = tr * seg, lo = std::max(j0, base), hi = std::min(j1, base + seg);
      const int64_t id = input_at(p, 0, coord(0, z, t)), ih = input_at(p, 1, coord(1, pp, r));
      if (++r == R) r = 0, ++t;
      if (id < 0 || ih < 0) {
        fn(row, lo, hi - lo, int64_t(-1), int64_t(0));
        continue;
      }
      const int64_t wpos = ((n * D + id) * H + ih) * W;  // position of x[n, id, ih, 0]
      if (merge) {
        const int64_t a = std::clamp(base + s_lo * Cg, lo, hi);
        const int64_t b = std::clamp(base + s_hi * Cg, a, hi);
        if (a > lo) fn(row, lo, a - lo, int64_t(-1), int64_t(0));
        if (b > a) fn(row, a, b - a, wpos + u0 + (a - base) / Cg, (a - base) % Cg);
        if (hi > b) fn(row, b, hi - b, int64_t(-1), int64_t(0));
        continue;
      }
      for (int64_t s = lo == base ? 0 : (lo - base) / Cg; base + s * Cg < hi; ++s) {
        const int64_t a = std::max(lo, base + s * Cg), b = std::min(hi, base + (s + 1) * Cg);
        const int64_t iw = input_at(p, 2, u0 + s * p.rhs_dil[2]);
        fn(row, a, b - a, iw < 0 ? int64_t(-1) : wpos + iw, a - base - s * Cg);
      }
    }
    if (++q == Q) {
      q = 0;
      if (++pp == P) {
        pp = 0;
        if (++z == Z) z = 0, ++n;
      }
    }
  }
}

bool mergeable(const Problem& p, int64_t pitch) {
  return pitch == p.Cg() && p.rhs_dil[2] == 1 && p.lhs_dil[2] == 1;
}

// Columns [j0, j1) of rows [m0, m0 + rows) of col_g into dst (rows, j1 - j0), pitch ld,
// converted to T with the conversions of isa.
template <typename In, typename T>
void im2col(CpuIsa isa, const Problem& p, const In* x, int64_t g, int64_t m0, int64_t rows,
            int64_t j0, int64_t j1, T* dst, int64_t ld) {
  const In* xg = x + g * p.Cg();
  for_each_run(p, m0, rows, j0, j1, mergeable(p, p.C),
               [&](int64_t row, int64_t j, int64_t len, int64_t pos, int64_t c0) {
                 T* d = dst + row * ld + (j - j0);
                 if (pos < 0) {
                   std::fill(d, d + len, T(0));
                   return;
                 }
                 gemm::convert(isa, xg + pos * p.C + c0, len, d);
               });
}

// The transpose of im2col: adds columns [j0, j1) of rows [m0, m0 + rows) of dcol (rows,
// j1 - j0, pitch ldd) into acc, where input position pos (counted from acc's first) holds its
// channels at acc[pos * ld_acc + c]. Runs are added in a fixed order, so sums reproduce.
template <typename T>
void col2im(const Problem& p, const T* dcol, int64_t ldd, int64_t m0, int64_t rows, int64_t j0,
            int64_t j1, T* acc, int64_t first_pos, int64_t ld_acc) {
  for_each_run(p, m0, rows, j0, j1, mergeable(p, ld_acc),
               [&](int64_t row, int64_t j, int64_t len, int64_t pos, int64_t c0) {
                 if (pos < 0) return;
                 T* d = acc + (pos - first_pos) * ld_acc + c0;
                 const T* src = dcol + row * ldd + (j - j0);
                 for (int64_t i = 0; i < len; ++i) d[i] += src[i];
               });
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

// One allocation of layout.bytes() (uninitialised, 64-byte aligned: every part is a multiple
// of 64 bytes) for a call; mem is null if it failed.
struct Workspace {
  explicit Workspace(const Layout& l)
      : layout(l),
        mem(static_cast<char*>(std::aligned_alloc(64, size_t(std::max<int64_t>(64, l.bytes()))))) {}
  ~Workspace() { std::free(mem); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  template <typename T> T* shared() const { return reinterpret_cast<T*>(mem); }
  char* scratch(int64_t w) const { return mem + layout.shared + w * layout.scratch; }
  Layout layout;
  char* mem;
};

Status out_of_memory(const Layout& l) {
  return Status::Error("conv im2col_gemm: cannot allocate a workspace of " +
                       std::to_string(l.bytes()) + " bytes");
}

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
void pack_groups(CpuIsa isa, const Parallel& par, int64_t G, Mat<In> b, int64_t b_step, int64_t k,
                 int64_t n, T* packed) {
  const int64_t strips = gemm::b_strips(n, gemm::blocking<T>(isa));
  const int64_t size = gemm::packed_b_elems<T>(isa, k, n);
  par.for_each(G * strips, [&](int64_t i) {
    const int64_t g = i / strips, s = i % strips;
    gemm::pack_b<T, In>(isa, {b.data + g * b_step, b.rs, b.cs}, k, n, s, s + 1,
                        packed + g * size);
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
int64_t row_chunk(CpuIsa isa, int64_t M, int64_t G, int num_threads) {
  const int64_t mr = gemm::blocking<T>(isa).mr;
  const int64_t per_group = ceil_div(4 * int64_t(num_threads), G);  // about 4 tasks a thread
  return std::clamp(round_up(ceil_div(M, per_group), mr), mr, kMaxChunkRows);
}

template <typename T, typename In>
Layout row_gemm_layout(CpuIsa isa, const RowGemm<In>& rg, bool out_is_acc, int num_threads) {
  const int64_t rows = row_chunk<T>(isa, rg.M, rg.G, num_threads);
  Layout l;
  l.workers = workers_for(rg.G * ceil_div(rg.M, rows), num_threads);
  l.shared = aligned(rg.G * gemm::packed_b_elems<T>(isa, rg.k, rg.n) * int64_t(sizeof(T)));
  if (rg.im2col) l.scratch += aligned(rows * gemm::blocking<T>(isa).kc_max * int64_t(sizeof(T)));
  if (!out_is_acc) l.scratch += aligned(rows * rg.n * int64_t(sizeof(T)));
  return l;
}

template <typename In, typename Out>
Status row_gemm(CpuIsa isa, const Problem& p, const RowGemm<In>& rg, Out* out, int64_t ldo,
                const Parallel& par) {
  using T = Acc<In>;
  constexpr bool kDirect = std::is_same_v<T, Out>;
  const Workspace ws(row_gemm_layout<T>(isa, rg, kDirect, par.num_threads()));
  if (ws.mem == nullptr) return out_of_memory(ws.layout);
  T* packed = ws.shared<T>();
  const int64_t psize = gemm::packed_b_elems<T>(isa, rg.k, rg.n);
  pack_groups(isa, par, rg.G, rg.b, rg.b_step, rg.k, rg.n, packed);
  const int64_t rows = row_chunk<T>(isa, rg.M, rg.G, par.num_threads());
  const int64_t chunks = ceil_div(rg.M, rows);
  run_tasks(par, ws, rg.G * chunks, [&](int64_t task, char* scratch) {
    // Groups vary fastest, so consecutive tasks read the same lines of x.
    const int64_t g = task % rg.G, m0 = task / rg.G * rows, mc = std::min(rows, rg.M - m0);
    Carver carve{scratch};
    T* col = rg.im2col ? carve.take<T>(rows * gemm::blocking<T>(isa).kc_max) : nullptr;
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
      gemm::gemm_packed<T, In>(isa, mc, rg.n, rg.k,
                               [&](int64_t k0, int64_t) { return a.sub(0, k0); }, pb, c, ldc,
                               false);
    } else {
      auto block = [&](int64_t k0, int64_t kc) {
        im2col(isa, p, rg.a, g, m0, mc, k0, k0 + kc, col, kc);
        return gemm::row_major<T>(col, kc);
      };
      gemm::gemm_packed<T, T>(isa, mc, rg.n, rg.k, block, pb, c, ldc, false);
    }
    if constexpr (!kDirect) store_rows(c, ldc, mc, rg.n, out + m0 * ldo + g * rg.n, ldo);
  });
  return Status::Ok();
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
// bwd_data (general): tasks are (block of images, group); each owns dx of its images in its
// group. It walks its rows of M in chunks cut at fixed multiples of kMaxChunkRows (the same for
// any thread count, so every dx element receives its terms in the same order), and per chunk
// and panel of <= nc columns computes dcol (rows, nc) and adds it into its dx (col2im).
// ---------------------------------------------------------------------------------------------

struct ImageBlocks {
  int64_t images, count;  // images per task, number of blocks
};

ImageBlocks image_blocks(const Problem& p, int num_threads) {
  const int64_t want = std::clamp<int64_t>(ceil_div(2 * int64_t(num_threads), p.G), 1,
                                           std::max<int64_t>(1, p.N));
  const int64_t images = std::max<int64_t>(1, ceil_div(p.N, want));
  return {images, ceil_div(p.N, images)};
}

template <typename T>
Layout data_layout(CpuIsa isa, const Problem& p, bool out_is_acc, int num_threads) {
  const int64_t Kdim = p.filt_spatial() * p.Cg();
  const ImageBlocks ib = image_blocks(p, num_threads);
  Layout l;
  l.workers = workers_for(ib.count * p.G, num_threads);
  l.shared = aligned(p.G * gemm::packed_b_elems<T>(isa, p.Kg(), Kdim) * int64_t(sizeof(T)));
  l.scratch =
      aligned(kMaxChunkRows * std::min(Kdim, gemm::blocking<T>(isa).nc) * int64_t(sizeof(T)));
  if (!out_is_acc) l.scratch += aligned(ib.images * p.in_spatial() * p.Cg() * int64_t(sizeof(T)));
  return l;
}

template <typename In, typename Out>
Status bwd_data(CpuIsa isa, const Problem& p, const In* dy, const In* w, Out* dx,
                const Parallel& par) {
  using T = Acc<In>;
  if (pointwise(p)) return row_gemm(isa, p, pointwise_data_gemm(p, dy, w), dx, p.C, par);
  constexpr bool kDirect = std::is_same_v<T, Out>;  // accumulate straight into dx
  const int64_t Kdim = p.filt_spatial() * p.Cg(), Kg = p.Kg(), Cg = p.Cg();
  const int64_t ZPQ = p.out_spatial(), inS = p.in_spatial();
  const int64_t nc_max = gemm::blocking<T>(isa).nc;
  const ImageBlocks ib = image_blocks(p, par.num_threads());
  const Workspace ws(data_layout<T>(isa, p, kDirect, par.num_threads()));
  if (ws.mem == nullptr) return out_of_memory(ws.layout);
  T* packed = ws.shared<T>();
  const int64_t psize = gemm::packed_b_elems<T>(isa, Kg, Kdim);
  pack_groups(isa, par, p.G, gemm::transposed(w, p.K), Kg, Kg, Kdim, packed);
  run_tasks(par, ws, ib.count * p.G, [&](int64_t task, char* scratch) {
    const int64_t g = task % p.G, n0 = task / p.G * ib.images, n1 = std::min(p.N, n0 + ib.images);
    Carver carve{scratch};
    T* dcol = carve.take<T>(kMaxChunkRows * std::min(Kdim, nc_max));
    T* acc;
    int64_t ld_acc;
    if constexpr (kDirect) {
      acc = dx + n0 * inS * p.C + g * Cg, ld_acc = p.C;
    } else {
      acc = carve.take<T>(ib.images * inS * Cg), ld_acc = Cg;
    }
    for (int64_t i = 0; i < (n1 - n0) * inS; ++i)
      std::fill(acc + i * ld_acc, acc + i * ld_acc + Cg, T(0));
    for (int64_t m = n0 * ZPQ, next; m < n1 * ZPQ; m = next) {
      next = std::min(n1 * ZPQ, (m / kMaxChunkRows + 1) * kMaxChunkRows);
      const Mat<In> a = gemm::row_major(dy + m * p.K + g * Kg, p.K);  // (next - m, Kg)
      for (int64_t j0 = 0; j0 < Kdim; j0 += nc_max) {
        const int64_t nc = std::min(nc_max, Kdim - j0);
        gemm::gemm_panel<T, In>(isa, next - m, Kdim, Kg, j0, nc,
                                [&](int64_t k0, int64_t) { return a.sub(0, k0); },
                                packed + g * psize, dcol, nc, false);
        col2im(p, dcol, nc, m, next - m, j0, j0 + nc, acc, n0 * inS, ld_acc);
      }
    }
    if constexpr (!kDirect)
      store_rows(acc, Cg, (n1 - n0) * inS, Cg, dx + n0 * inS * p.C + g * Cg, p.C);
  });
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// bwd_filter: dw_g = col_g^T . dy_g reduces over the M positions in the k blocks of M (fixed
// by M). The blocks are split into S slices, S chosen from the problem alone. A task is one
// (slice, group, row block, column block) tile of dw: block by block it builds its columns of
// col, packs its columns of dy and accumulates its tile. With S > 1 every slice writes its own
// partial dw and a last pass adds the partials in slice order, so every element of dw is the
// same sum for any thread count.
// ---------------------------------------------------------------------------------------------

constexpr int64_t kMaxSlices = 8;
constexpr int64_t kMinSliceBlocks = 8;      // k blocks (2048 positions) per slice at least
constexpr int64_t kPartialBytes = 8 << 20;  // the partial dw of all slices at most

struct FilterPlan {
  int64_t slices;
  int64_t rows, cols;  // tile size (the last ones shorter)
  int64_t row_blocks, col_blocks;
  int64_t tasks(const Problem& p) const { return slices * p.G * row_blocks * col_blocks; }
};

// A tile packs its dy columns for every k block (cost ~ 1/rows of its work) and builds its col
// columns (cost ~ 1/cols), so tiles start as large as the blocking allows and the larger side
// is halved until there are about two tasks per thread.
template <typename T>
FilterPlan filter_plan(CpuIsa isa, const Problem& p, int num_threads) {
  const gemm::Blocking& blk = gemm::blocking<T>(isa);
  const int64_t Fc = p.filt_spatial() * p.Cg(), Kg = p.Kg();
  const int64_t blocks = gemm::k_blocks<T>(isa, p.N * p.out_spatial()).count;
  const int64_t dw_bytes = std::max<int64_t>(1, p.w_elems() * int64_t(sizeof(T)));
  FilterPlan f;
  f.slices = std::clamp(std::min(blocks / kMinSliceBlocks, kPartialBytes / dw_bytes), int64_t(1),
                        kMaxSlices);
  f.rows = std::clamp<int64_t>(round_up(Fc, blk.mr), blk.mr, kFilterMaxRows);
  f.cols = std::clamp<int64_t>(round_up(Kg, blk.nr), blk.nr, blk.nc);
  while (f.slices * p.G * ceil_div(Fc, f.rows) * ceil_div(Kg, f.cols) < 2 * int64_t(num_threads)) {
    if (f.rows >= f.cols && f.rows >= 2 * blk.mr)
      f.rows = round_up(f.rows / 2, blk.mr);
    else if (f.cols >= 2 * blk.nr)
      f.cols = round_up(f.cols / 2, blk.nr);
    else if (f.rows >= 2 * blk.mr)
      f.rows = round_up(f.rows / 2, blk.mr);
    else
      break;
  }
  f.row_blocks = ceil_div(Fc, f.rows);
  f.col_blocks = ceil_div(Kg, f.cols);
  return f;
}

template <typename T>
Layout filter_layout(CpuIsa isa, const Problem& p, bool out_is_acc, int num_threads) {
  const FilterPlan f = filter_plan<T>(isa, p, num_threads);
  const int64_t kc = gemm::blocking<T>(isa).kc_max;
  Layout l;
  l.workers = workers_for(f.tasks(p), num_threads);
  if (f.slices > 1) l.shared = aligned(f.slices * p.w_elems() * int64_t(sizeof(T)));
  l.scratch = aligned(gemm::packed_b_elems<T>(isa, kc, f.cols) * int64_t(sizeof(T)));
  if (!pointwise(p)) l.scratch += aligned(kc * f.rows * int64_t(sizeof(T)));
  if (f.slices == 1 && !out_is_acc) l.scratch += aligned(f.rows * f.cols * int64_t(sizeof(T)));
  return l;
}

template <typename In, typename Out>
Status bwd_filter(CpuIsa isa, const Problem& p, const In* x, const In* dy, Out* dw,
                  const Parallel& par) {
  using T = Acc<In>;
  constexpr bool kDirect = std::is_same_v<T, Out>;
  const FilterPlan f = filter_plan<T>(isa, p, par.num_threads());
  const Workspace ws(filter_layout<T>(isa, p, kDirect, par.num_threads()));
  if (ws.mem == nullptr) return out_of_memory(ws.layout);
  const int64_t M = p.N * p.out_spatial(), Fc = p.filt_spatial() * p.Cg(), Kg = p.Kg();
  const bool pw = pointwise(p);
  const gemm::KBlocks kb = gemm::k_blocks<T>(isa, M);
  const int64_t kc_max = gemm::blocking<T>(isa).kc_max, NR = gemm::blocking<T>(isa).nr;
  T* partial = f.slices > 1 ? ws.shared<T>() : nullptr;  // (S, F*Cg, K)
  run_tasks(par, ws, f.tasks(p), [&](int64_t task, char* scratch) {
    // Groups vary fastest, so consecutive tasks read the same lines of x and dy.
    const int64_t g = task % p.G, jb = task / p.G % f.col_blocks,
                  ib = task / (p.G * f.col_blocks) % f.row_blocks,
                  s = task / (p.G * f.col_blocks * f.row_blocks);
    const int64_t i0 = ib * f.rows, j0 = jb * f.cols;
    const int64_t rb = std::min(f.rows, Fc - i0), cb = std::min(f.cols, Kg - j0);
    const int64_t b0 = s * kb.count / f.slices, b1 = (s + 1) * kb.count / f.slices;
    Carver carve{scratch};
    T* packed = carve.take<T>(gemm::packed_b_elems<T>(isa, kc_max, f.cols));
    T* col = pw ? nullptr : carve.take<T>(kc_max * f.rows);
    T* c;
    int64_t ldc = p.K;
    if (partial != nullptr) {
      c = partial + s * p.w_elems() + i0 * p.K + g * Kg + j0;
    } else if constexpr (kDirect) {
      c = dw + i0 * p.K + g * Kg + j0;
    } else {
      c = carve.take<T>(f.rows * f.cols), ldc = f.cols;
    }
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t m0 = kb.begin(b), kc = kb.len(b, M);
      const In* dyb = dy + m0 * p.K + g * Kg + j0;  // (kc, cb), pitch K
      gemm::pack_b<T, In>(isa, gemm::row_major(dyb, p.K), kc, cb, 0, ceil_div(cb, NR), packed);
      if (pw) {
        const Mat<In> a = gemm::transposed(x + m0 * p.C + g * p.Cg() + i0, p.C);  // (rb, kc)
        gemm::gemm_block<T, In>(isa, rb, cb, kc, a, packed, c, ldc, b > b0);
      } else {
        im2col(isa, p, x, g, m0, kc, i0, i0 + rb, col, rb);  // (kc, rb)
        gemm::gemm_block<T, T>(isa, rb, cb, kc, gemm::transposed<T>(col, rb), packed, c, ldc,
                               b > b0);
      }
    }
    if (b0 == b1)
      for (int64_t i = 0; i < rb; ++i) std::fill(c + i * ldc, c + i * ldc + cb, T(0));
    if constexpr (!kDirect) {
      if (partial == nullptr) store_rows(c, ldc, rb, cb, dw + i0 * p.K + g * Kg + j0, p.K);
    }
  });
  if (partial == nullptr) return Status::Ok();
  // dw = partial[0] + partial[1] + ... in slice order, in row chunks across the threads.
  const int64_t rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, p.K));
  par.for_each(ceil_div(Fc, rows), [&](int64_t chunk) {
    const int64_t e0 = chunk * rows * p.K, e1 = std::min(Fc, (chunk + 1) * rows) * p.K;
    for (int64_t e = e0; e < e1; ++e) {
      T sum = partial[e];
      for (int64_t s = 1; s < f.slices; ++s) sum += partial[s * p.w_elems() + e];
      dw[e] = store_as<Out>(double(sum));
    }
  });
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Registry entry
// ---------------------------------------------------------------------------------------------

// The instruction set the GEMM of a call runs: the one its name pins (avx512, avx2, generic),
// else the best this CPU supports.
CpuIsa isa_of(const Args& a) {
  return a.variant.isa == CpuIsa::kAuto ? gemm::best_isa() : a.variant.isa;
}

Support supports(const Args& a) {
  if (Support s = float_inputs(a); !s.ok) return s;
  if (!dispatch_io(a.in, a.out, [](auto, auto) {}))
    return Support::No(std::string("unsupported dtypes ") + dtype_name(a.in) + " -> " +
                       dtype_name(a.out));
  if (isa_of(a) > gemm::best_isa())
    return Support::No(std::string("this CPU lacks ") + gemm::isa_requirements(isa_of(a)) +
                       ", which option '" + isa_name(isa_of(a)) + "' needs");
  return Support::Yes();
}

// The options of the variant that runs `a` (variant.h): the GEMM's instruction set.
std::string resolve(const Args& a) { return std::string(".") + isa_name(isa_of(a)); }

template <typename T>
int64_t workspace_for(CpuIsa isa, const Args& a, int num_threads) {
  const bool out_is_acc = a.out == (std::is_same_v<T, double> ? DType::kF64 : DType::kF32);
  const Problem& p = a.p;
  switch (a.dir) {
    case Direction::kFwd:
      return row_gemm_layout<T>(isa, fwd_gemm<T>(p, nullptr, nullptr), out_is_acc, num_threads)
          .bytes();
    case Direction::kBwdData:
      if (pointwise(p))
        return row_gemm_layout<T>(isa, pointwise_data_gemm<T>(p, nullptr, nullptr), out_is_acc,
                                  num_threads).bytes();
      return data_layout<T>(isa, p, out_is_acc, num_threads).bytes();
    case Direction::kBwdFilter:
      return filter_layout<T>(isa, p, out_is_acc, num_threads).bytes();
  }
  return 0;
}

int64_t workspace_bytes(const Args& a, int num_threads) {
  return a.in == DType::kF64 ? workspace_for<double>(isa_of(a), a, num_threads)
                             : workspace_for<float>(isa_of(a), a, num_threads);
}

Status run(const Args& a, const Buffers& b, const Parallel& par) {
  const Problem& p = a.p;
  const CpuIsa isa = isa_of(a);
  Status status = Status::Error(std::string("conv im2col_gemm: unsupported dtypes ") +
                                dtype_name(a.in) + " -> " + dtype_name(a.out));
  dispatch_io(a.in, a.out, [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    const In* x = static_cast<const In*>(b.x);
    const In* w = static_cast<const In*>(b.w);
    const In* y = static_cast<const In*>(b.y);
    Out* result = static_cast<Out*>(b.result);
    switch (a.dir) {
      case Direction::kFwd: status = row_gemm(isa, p, fwd_gemm(p, x, w), result, p.K, par); break;
      case Direction::kBwdData: status = bwd_data(isa, p, y, w, result, par); break;
      case Direction::kBwdFilter: status = bwd_filter(isa, p, x, y, result, par); break;
    }
  });
  return status;
}

}  // namespace

const CpuAlgorithm kCpuIm2colGemm = {"im2col_gemm", /*deterministic=*/true, supports,
                                     workspace_bytes, run, "avx512 avx2 generic", resolve};

}  // namespace jaxdnn::conv
