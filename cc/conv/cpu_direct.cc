// CPU direct convolution: the oracle. Seven plain loops per direction, every case (stride,
// padding, lhs/rhs dilation, groups) written out, accumulation in double (integer inputs:
// exact, wrapping sums in the accumulator of dtype.h's IntAcc; the only CPU algorithm that
// runs them). Each direction
// gathers (no scatter), so results are deterministic whatever the thread count. fwd and
// bwd_filter multiply the zero that a tap reads on padding (conv.h), so 0 * inf = NaN there.
//
// Cost: N*Z*P*Q*K*T*R*S*Cg multiply-adds with no blocking; it is meant for correctness, and
// for tiny problems where packing would cost more than it saves.

#include <type_traits>
#include <vector>

#include "cc/conv/cpu_algorithms.h"

namespace jaxdnn::conv {
namespace {

// How the sums of input type In are kept: in double for floats, in the wrapping unsigned
// accumulator for integers (dtype.h: IntAcc), whose low bits are the result.
template <typename In, typename = void>
struct Sum {
  using Acc = double;
  static Acc load(In v) { return double(load_acc(v)); }
  template <typename Out> static Out store(Acc a) { return store_as<Out>(a); }
};
template <typename In>
struct Sum<In, std::enable_if_t<std::is_integral_v<In>>> {
  using Acc = int_acc_t<In>;
  static Acc load(In v) { return Acc(v); }
  template <typename Out> static Out store(Acc a) { return Out(a); }
};

template <typename In, typename Out>
void fwd(const Problem& p, const In* x, const In* w, Out* y, const Parallel& par) {
  const int64_t D = p.in[0], H = p.in[1], W = p.in[2], C = p.C, K = p.K;
  const int64_t Z = p.out[0], P = p.out[1], Q = p.out[2];
  const int64_t T = p.filt[0], R = p.filt[1], S = p.filt[2], Cg = p.Cg(), Kg = p.Kg();
  using M = Sum<In>;
  using Acc = typename M::Acc;
  par.for_each(p.N * Z * P, [&](int64_t task) {
    const int64_t n = task / (Z * P), z = task / P % Z, pp = task % P;
    for (int64_t q = 0; q < Q; ++q) {
      Out* yp = y + (((n * Z + z) * P + pp) * Q + q) * K;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = k / Kg;
        Acc acc = 0;
        for (int64_t t = 0; t < T; ++t) {
          const int64_t id = in_idx(p, 0, z, t);
          for (int64_t r = 0; r < R; ++r) {
            const int64_t ih = in_idx(p, 1, pp, r);
            for (int64_t s = 0; s < S; ++s) {
              const int64_t iw = in_idx(p, 2, q, s);
              const In* wp = w + ((t * R + r) * S + s) * Cg * K + k;
              if (id < 0 || ih < 0 || iw < 0) {  // padding: zero times the weights
                for (int64_t c = 0; c < Cg; ++c) acc += Acc(0) * M::load(wp[c * K]);
                continue;
              }
              const In* xp = x + (((n * D + id) * H + ih) * W + iw) * C + g * Cg;
              for (int64_t c = 0; c < Cg; ++c)
                acc += M::load(xp[c]) * M::load(wp[c * K]);
            }
          }
        }
        yp[k] = M::template store<Out>(acc);
      }
    }
  });
}

template <typename In, typename Out>
void bwd_data(const Problem& p, const In* dy, const In* w, Out* dx, const Parallel& par) {
  const int64_t D = p.in[0], H = p.in[1], W = p.in[2], C = p.C, K = p.K;
  const int64_t Z = p.out[0], P = p.out[1], Q = p.out[2];
  const int64_t T = p.filt[0], R = p.filt[1], S = p.filt[2], Cg = p.Cg(), Kg = p.Kg();
  using M = Sum<In>;
  using Acc = typename M::Acc;
  par.for_each(p.N * D * H, [&](int64_t task) {
    const int64_t n = task / (D * H), d = task / H % D, h = task % H;
    for (int64_t iw = 0; iw < W; ++iw) {
      Out* dxp = dx + (((n * D + d) * H + h) * W + iw) * C;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t g = c / Cg, ci = c % Cg;
        Acc acc = 0;
        for (int64_t t = 0; t < T; ++t) {
          const int64_t oz = out_idx(p, 0, d, t);
          if (oz < 0) continue;
          for (int64_t r = 0; r < R; ++r) {
            const int64_t op = out_idx(p, 1, h, r);
            if (op < 0) continue;
            for (int64_t s = 0; s < S; ++s) {
              const int64_t oq = out_idx(p, 2, iw, s);
              if (oq < 0) continue;
              const In* dyp = dy + (((n * Z + oz) * P + op) * Q + oq) * K + g * Kg;
              const In* wp = w + (((t * R + r) * S + s) * Cg + ci) * K + g * Kg;
              for (int64_t k = 0; k < Kg; ++k)
                acc += M::load(dyp[k]) * M::load(wp[k]);
            }
          }
        }
        dxp[c] = M::template store<Out>(acc);
      }
    }
  });
}

template <typename In, typename Out>
void bwd_filter(const Problem& p, const In* x, const In* dy, Out* dw, const Parallel& par) {
  const int64_t D = p.in[0], H = p.in[1], W = p.in[2], C = p.C, K = p.K;
  const int64_t Z = p.out[0], P = p.out[1], Q = p.out[2];
  const int64_t R = p.filt[1], S = p.filt[2], Cg = p.Cg(), Kg = p.Kg();
  constexpr int64_t kChunk = 64;  // outputs accumulated at once, on the stack
  using M = Sum<In>;
  using Acc = typename M::Acc;
  // One task per filter row (t, r, s, ci): it owns the K outputs dw[t, r, s, ci, :], which it
  // computes kChunk at a time.
  par.for_each(p.filt_spatial() * Cg, [&](int64_t task) {
    const int64_t ci = task % Cg, s = task / Cg % S, r = task / (Cg * S) % R,
                  t = task / (Cg * S * R);
    for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
      const int64_t k1 = k0 + kChunk < K ? k0 + kChunk : K;
      Acc acc[kChunk] = {};
      for (int64_t n = 0; n < p.N; ++n)
        for (int64_t z = 0; z < Z; ++z) {
          const int64_t id = in_idx(p, 0, z, t);
          for (int64_t pp = 0; pp < P; ++pp) {
            const int64_t ih = in_idx(p, 1, pp, r);
            for (int64_t q = 0; q < Q; ++q) {
              const int64_t iw = in_idx(p, 2, q, s);
              const In* dyp = dy + (((n * Z + z) * P + pp) * Q + q) * K;
              if (id < 0 || ih < 0 || iw < 0) {  // padding: zero times dy
                for (int64_t k = k0; k < k1; ++k) acc[k - k0] += Acc(0) * M::load(dyp[k]);
                continue;
              }
              const In* xp = x + (((n * D + id) * H + ih) * W + iw) * C + ci;
              for (int64_t k = k0; k < k1; ++k)
                acc[k - k0] += M::load(xp[(k / Kg) * Cg]) * M::load(dyp[k]);
            }
          }
        }
      for (int64_t k = k0; k < k1; ++k) dw[task * K + k] = M::template store<Out>(acc[k - k0]);
    }
  });
}

Support supports(const Args&) { return Support::Yes(); }

int64_t workspace_bytes(const Args&, int) { return 0; }

Status run(const Args& a, const Buffers& b, const Parallel& par) {
  const Problem& p = a.p;
  auto run_typed = [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    switch (a.dir) {
      case Direction::kFwd:
        fwd(p, static_cast<const In*>(b.x), static_cast<const In*>(b.w),
            static_cast<Out*>(b.result), par);
        break;
      case Direction::kBwdData:
        bwd_data(p, static_cast<const In*>(b.y), static_cast<const In*>(b.w),
                 static_cast<Out*>(b.result), par);
        break;
      case Direction::kBwdFilter:
        bwd_filter(p, static_cast<const In*>(b.x), static_cast<const In*>(b.y),
                   static_cast<Out*>(b.result), par);
        break;
    }
  };
  const bool ok = dispatch_io(a.in, a.out, run_typed) || dispatch_int_io(a.in, a.out, run_typed);
  if (!ok)
    return Status::Error(std::string("conv direct: unsupported dtypes ") + dtype_name(a.in) +
                         " -> " + dtype_name(a.out));
  return Status::Ok();
}

}  // namespace

const CpuAlgorithm kCpuDirect = {"direct", /*deterministic=*/true, supports, workspace_bytes, run};

}  // namespace jaxdnn::conv
