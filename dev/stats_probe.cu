// Access-front probe of the segment path's statistics pass (session 21): the library's
// segment_unit_stats (a warp per unit, each warp streaming its own segment) against "teams" of
// TEAM threads interleaved over one unit (thread r of a team reads packs r, r + TEAM, ... of the
// unit, so a block's loads in flight cover one contiguous window), units in memory order, blocks
// in order. Same batched Welford as the library (add_values). Each variant's partials are merged
// on the host and checked against a float64 reference of every group's mean and variance.
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -I. -arch=sm_90 -o /tmp/sp dev/stats_probe.cu
//   /tmp/sp
// Cases: batch_norm NCHW 64x64x112x112 and group_norm NCHW 32x256x56x56 (32 groups), float32
// and bfloat16. Times, per launch (CUDA events, medians of 20): alone (8 launches back to back
// over 3 rotating copies of x), and each launch right after a flat read of another copy, after a
// flat write of it to y (evict-first stores, as the library's outputs) and after a plain write:
// what a pass pays for the dirty lines a writer left in L2. benchmarks/NOTES.md, session 21.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cc/norm/cuda_segment.cu"
#include "dev/event_timing.cuh"

using namespace jaxdnn::norm;
using namespace jaxdnn::norm::cuda_impl;

// Unit u: piece u % pieces of run u / pieces; a run is run_packs contiguous 16-byte packs of
// one group (a segment, or a group's whole contiguous range), a piece at most `piece` packs.
struct Runs {
  unsigned run_packs, piece, pieces, units;
};

template <typename D, int TEAM, int THREADS, int U, int MINB>
__global__ void __launch_bounds__(THREADS, MINB)
    team_stats(const D* x, Runs r, double* ws0, double* ws1) {
  constexpr int VEC = Vec<D>::kN, TPB = THREADS / TEAM, WPT = TEAM / 32;
  using Acc = A<D>;
  using Pk = PackOf<D, VEC>;
  __shared__ Moments<Acc> wm[THREADS / 32];
  const int t = threadIdx.x / TEAM, rk = threadIdx.x % TEAM, lane = threadIdx.x % 32,
            warp = threadIdx.x / 32;
  for (unsigned base = blockIdx.x * TPB; base < r.units; base += gridDim.x * TPB) {
    const unsigned u = base + t;
    Moments<Acc> m{0, 0, 0};
    Acc shift = 0;
    if (u < r.units) {
      const unsigned run = u / r.pieces, q = u % r.pieces, b0 = q * r.piece;
      const unsigned size = min(r.piece, r.run_packs - b0);
      const D* px = x + (size_t(run) * r.run_packs + b0) * VEC;
      shift = to_acc(px[0]);
      const unsigned mine = size > unsigned(rk) ? (size - rk + TEAM - 1) / TEAM : 0;
      batched<U, false>(
          0, mine, [&](int64_t i) { return Pk::load(px + (rk + i * TEAM) * VEC); },
          [&](int64_t, const auto& v, int count) { add_values<D, VEC, U>(m, v, count, shift); });
    }
    m = warp_merge(m);
    if constexpr (WPT > 1) {
      if (lane == 0) wm[warp] = m;
      __syncthreads();
      if (rk < 32) m = warp_merge(lane < WPT ? wm[t * WPT + lane] : Moments<Acc>{0, 0, 0});
      __syncthreads();
    }
    if (rk == 0 && u < r.units) store_partial(ws0, ws1, u, shift, m.n, m.mean, m.m2, true);
  }
}

// What the op before a statistics pass leaves in L2: y = x*a + b over the whole tensor, one
// 16-byte pack per thread (the table apply's shape), stored evict-first (kStream, as the
// library's outputs) or plainly.
template <bool kStream>
__global__ void write_kernel(const uint4* x, uint4* y, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) {
    uint4 v = x[i];
    v.x ^= 0x5a5a5a5au;
    if (kStream) __stcs(y + i, v);
    else y[i] = v;
  }
}

struct Case {
  const char* name;
  Shape s;
  bool group_runs_ok;  // a group's segments are contiguous (A == 1)
};

template <typename D>
void run_case(const Case& cs) {
  using Acc = A<D>;
  constexpr int VEC = Vec<D>::kN;
  const Shape& s = cs.s;
  const int64_t n = s.elems(), bytes = n * int64_t(sizeof(D)), packs = n / VEC;
  const int64_t segs = s.P * s.A * s.C * s.K, groups = s.groups();
  std::vector<D> hx(static_cast<size_t>(n));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.5f, 2.0f);
  for (auto& v : hx) v = D(nd(rng));
  // float64 reference per group; segment r belongs to group (p, c).
  auto group_of_seg = [&](int64_t r) {
    const int64_t c = r / s.K % s.C, p = r / (s.K * s.C * s.A);
    return p * s.C + c;
  };
  std::vector<double> rs(groups, 0), rq(groups, 0), rn(groups, 0);
  for (int64_t r = 0; r < segs; ++r) {
    const int64_t g = group_of_seg(r);
    for (int64_t i = 0; i < s.T; ++i) {
      const double v = double(float(hx[size_t(r * s.T + i)]));
      rs[g] += v, rn[g] += 1;
    }
  }
  for (int64_t r = 0; r < segs; ++r) {
    const int64_t g = group_of_seg(r);
    const double mu = rs[g] / rn[g];
    for (int64_t i = 0; i < s.T; ++i) {
      const double d = double(float(hx[size_t(r * s.T + i)])) - mu;
      rq[g] += d * d;
    }
  }
  constexpr int kCopies = 3;
  D* x[kCopies];
  for (auto& p : x) {
    CK_(cudaMalloc(&p, bytes));
    CK_(cudaMemcpy(p, hx.data(), bytes, cudaMemcpyHostToDevice));
  }
  const int64_t max_units = 1 << 20;
  double *ws0, *ws1;
  CK_(cudaMalloc(&ws0, max_units * 8));
  CK_(cudaMalloc(&ws1, max_units * 8));
  unsigned* sink;
  CK_(cudaMalloc(&sink, 4));
  const double mb = bytes / 1e6;
  std::printf("\n=== %s %s (%.1f MB, %lld segments of %lld values, %lld groups)\n", cs.name,
              sizeof(D) == 4 ? "float32" : "bfloat16", mb, (long long)segs, (long long)s.T,
              (long long)groups);
  auto timed = [&](auto launch) {
    int k = 0;
    return median_us([&] {
             for (int i = 0; i < 8; ++i) launch(x[k++ % kCopies]);
           }) /
           8;
  };
  // The statistics launch alone, each time right after `before` (another copy of x -> y):
  // median over 20 rounds of the mean over 8 such pairs.
  cudaEvent_t ev[16];
  for (auto& e : ev) CK_(cudaEventCreate(&e));
  auto after = [&](auto launch, auto before) {
    std::vector<float> t;
    int k = 0;
    for (int rep = 0; rep < 23; ++rep) {
      for (int i = 0; i < 8; ++i, ++k) {
        before(x[k % kCopies]);
        CK_(cudaEventRecord(ev[2 * i]));
        launch(x[(k + 1) % kCopies]);
        CK_(cudaEventRecord(ev[2 * i + 1]));
      }
      CK_(cudaEventSynchronize(ev[15]));
      float sum = 0;
      for (int i = 0; i < 8; ++i) {
        float ms;
        CK_(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        sum += ms * 1e3f / 8;
      }
      if (rep >= 3) t.push_back(sum);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  D* y;
  CK_(cudaMalloc(&y, bytes));
  const unsigned wgrid = unsigned((packs + 255) / 256);
  auto read_before = [&](D* xx) {
    read_kernel<<<wgrid, 256>>>(reinterpret_cast<const uint4*>(xx), packs, sink);
  };
  auto cs_before = [&](D* xx) {
    write_kernel<true><<<wgrid, 256>>>(reinterpret_cast<const uint4*>(xx),
                                       reinterpret_cast<uint4*>(y), packs);
  };
  auto plain_before = [&](D* xx) {
    write_kernel<false><<<wgrid, 256>>>(reinterpret_cast<const uint4*>(xx),
                                        reinterpret_cast<uint4*>(y), packs);
  };
  // Isolated (8 back to back), then right after a flat read, an evict-first write, a plain one.
  auto four = [&](auto launch) {
    char b[96];
    std::snprintf(b, sizeof b, "%6.1f %6.1f %6.1f %6.1f", timed(launch), after(launch, read_before),
                  after(launch, cs_before), after(launch, plain_before));
    return std::string(b);
  };
  auto check = [&](const std::vector<int64_t>& unit_group, const std::vector<double>& unit_n) {
    const int64_t units = int64_t(unit_group.size());
    std::vector<double> h0(units), h1(units);
    CK_(cudaMemcpy(h0.data(), ws0, units * 8, cudaMemcpyDeviceToHost));
    CK_(cudaMemcpy(h1.data(), ws1, units * 8, cudaMemcpyDeviceToHost));
    std::vector<double> gn(groups, 0), gm(groups, 0), g2(groups, 0);
    for (int64_t u = 0; u < units; ++u) {
      const int64_t g = unit_group[u];
      const double nb = unit_n[u], nn = gn[g] + nb, d = h0[u] - gm[g];
      gm[g] += d * nb / nn;
      g2[g] += h1[u] + d * d * gn[g] * nb / nn;
      gn[g] = nn;
    }
    double err = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const double mu = rs[g] / rn[g], var = rq[g] / rn[g];
      err = std::max(err, std::fabs(gm[g] - mu) / std::sqrt(var));
      err = std::max(err, std::fabs(g2[g] / gn[g] - var) / var);
    }
    return err;
  };

  // Copy and flat-read rooflines.
  const float t_copy =
      timed([&](D* xx) { cudaMemcpyAsync(y, xx, bytes, cudaMemcpyDeviceToDevice); });
  const float t_read = timed([&](D* xx) {
    read_kernel<<<unsigned((packs + 255) / 256), 256>>>(
        reinterpret_cast<const uint4*>(xx), packs, sink);
  });
  std::printf("%-44s %8.1f us  %5.2f TB/s (read+write)\n", "copy (cudaMemcpyAsync)", t_copy,
              2 * mb / t_copy);
  std::printf("%-44s  alone / after read / after cs write / after plain write (us)\n", "");
  std::printf("%-44s %s  (%.2f TB/s alone)\n", "flat read, 1 pack/thread",
              four([&](D* xx) { read_before(xx); }).c_str(), mb / t_read);

  // The library's kernel, with its own units (split_units).
  {
    constexpr auto stats = segment_unit_stats_kernel<D, VEC>;
    const int64_t wave_warps = 8 * jaxdnn::cuda::resident_grid<stats, 256>(int64_t(1) << 40);
    const SegmentUnits su = split_units(s, wave_warps);
    Fwd<D> f{};
    f.s = s, f.centered = true, f.training = true, f.ws0 = ws0, f.ws1 = ws1;
    const unsigned grid = unsigned((su.units + 7) / 8);
    auto launch = [&](D* xx) {
      f.x = xx;
      stats<<<grid, 256>>>(f, su);
    };
    const std::string t4 = four(launch);
    std::vector<int64_t> ug(su.units);
    std::vector<double> un(su.units);
    for (int64_t u = 0; u < su.units; ++u) {
      ug[u] = group_of_seg(u / su.pieces);
      const int64_t q = u % su.pieces;
      un[u] = double(std::min(s.T, (q + 1) * su.len) - q * su.len);
    }
    std::printf("%-44s %s  err %.1e  (%lld units, grid %u)\n", "library segment_unit_stats",
                t4.c_str(), check(ug, un), (long long)su.units, grid);
  }

  // Team variants over runs: segments, or (where a group is contiguous) groups' ranges.
  auto variant = [&](const char* label, auto kernel, int team, int threads, bool group_runs,
                     int64_t piece_target) {
    const int64_t run_packs = (group_runs ? s.K * s.T : s.T) / VEC;
    const int64_t runs = packs / run_packs;
    const int64_t pieces = std::max<int64_t>(1, (run_packs + piece_target - 1) / piece_target);
    const int64_t piece = (run_packs + pieces - 1) / pieces;
    const Runs r{unsigned(run_packs), unsigned(piece), unsigned(pieces),
                 unsigned(runs * pieces)};
    if (r.units > max_units) return;
    const int tpb = threads / team;
    int per_sm = 0;
    CK_(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    const auto grid = unsigned((r.units + tpb - 1) / tpb);
    const std::string t4 = four([&](D* xx) { kernel<<<grid, threads>>>(xx, r, ws0, ws1); });
    CK_(cudaGetLastError());
    std::vector<int64_t> ug(r.units);
    std::vector<double> un(r.units);
    for (int64_t u = 0; u < r.units; ++u) {
      const int64_t run = u / pieces, q = u % pieces;
      ug[u] = group_runs ? run : group_of_seg(run);
      un[u] = double(std::min(piece, run_packs - q * piece) * VEC);
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s %s pieces %lld", label,
                  group_runs ? "group-runs" : "segments", (long long)pieces);
    std::printf("%-44s %s  err %.1e  (%u units, grid %u, %d/SM)\n", buf, t4.c_str(),
                check(ug, un), r.units, grid, per_sm);
  };
#define V(TEAM, THREADS, U, MINB, ...)                                                        \
  variant("team" #TEAM " thr" #THREADS " U" #U " minb" #MINB,                                 \
          team_stats<D, TEAM, THREADS, U, MINB>, TEAM, THREADS, __VA_ARGS__)
  const int64_t whole = int64_t(1) << 30;
  V(32, 256, 8, 4, false, whole);
  V(256, 256, 8, 4, false, whole);
  V(800, 800, 4, 2, false, whole);  // XLA's batch_norm NCHW reduce: 4096 x 800
  V(800, 800, 8, 2, false, whole);
  if (cs.group_runs_ok) {
    V(128, 256, 8, 4, true, whole);
    V(256, 256, 2, 4, true, 392);  // XLA's group_norm reduce: 16384 x 256
    V(256, 256, 4, 4, true, 784);
  }
#undef V
  for (auto& e : ev) CK_(cudaEventDestroy(e));
  for (auto& p : x) CK_(cudaFree(p));
  CK_(cudaFree(y));
  CK_(cudaFree(ws0));
  CK_(cudaFree(ws1));
  CK_(cudaFree(sink));
}

int main() {
  Shape bn{}, gn{};
  bn.P = 1, bn.A = 64, bn.C = 64, bn.K = 1, bn.T = 112 * 112, bn.Q = 1;
  gn.P = 32, gn.A = 1, gn.C = 32, gn.K = 8, gn.T = 56 * 56, gn.Q = 1;
  const Case cases[] = {{"batch_norm NCHW 64x64x112x112", bn, false},
                        {"group_norm NCHW 32x256x56x56 G=32", gn, true}};
  for (const Case& c : cases) run_case<float>(c);
  for (const Case& c : cases) run_case<__nv_bfloat16>(c);
  return 0;
}
