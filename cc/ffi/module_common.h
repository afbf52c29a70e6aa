// nanobind glue shared by the CPU and CUDA modules.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "cc/ffi/conv_common.h"
#include "cc/ffi/handlers.h"
#include "cc/norm/norm.h"
#include "cc/pool/pool.h"

namespace jaxdnn::ffi_util {

inline nanobind::dict to_registrations(const HandlerList& list) {
  nanobind::dict d;
  for (const auto& [name, handler] : list)
    d[name] = nanobind::capsule(reinterpret_cast<void*>(handler));
  return d;
}

inline conv::Args decode_conv_args(int direction, const std::vector<int64_t>& problem,
                                   const std::string& in_dtype, const std::string& out_dtype) {
  if (direction < 0 || direction > 2) throw std::invalid_argument("bad conv direction");
  conv::Args args;
  args.dir = static_cast<conv::Direction>(direction);
  args.p = decode_problem(problem);
  args.in = dtype_from_name(in_dtype);
  args.out = dtype_from_name(out_dtype);
  args.tf32 = problem.at(28) != 0;
  return args;
}

// One dict per algorithm name (cc/conv/variant.h): name (concrete where supported), base,
// default (the variant its algorithm runs unpinned), supported, reason, workspace_bytes,
// deterministic, tensor_cores. `names` lists the names to describe; empty, every algorithm of
// `all`, with every variant that can run when `variants`. `workspace(algo, args)` returns an
// algorithm's workspace for the problem and `tensor_cores(algo)` whether it uses tensor cores.
template <typename Algo, typename Workspace, typename TensorCores>
nanobind::list describe_conv_algorithms(const std::vector<const Algo*>& all, const conv::Args& args,
                                        const std::vector<std::string>& names, bool variants,
                                        Workspace workspace, TensorCores tensor_cores) {
  std::vector<conv::Listed<Algo>> listed;
  const Status valid = conv::validate(args.p);
  if (!names.empty()) {
    for (const std::string& name : names) listed.push_back(conv::describe_name(all, args, name));
  } else if (valid.ok()) {
    listed = conv::list_algorithms(all, args, variants);
  } else {
    for (const Algo* a : all) listed.push_back({a, a->name, args, Support::No(""), true});
  }
  nanobind::list out;
  for (const conv::Listed<Algo>& l : listed) {
    const Support s = valid.ok() ? l.support : Support::No(valid.message);
    nanobind::dict d;
    d["name"] = l.name;
    d["base"] = l.alg != nullptr ? l.alg->name : "";
    d["default"] = l.is_default;
    d["supported"] = s.ok;
    d["reason"] = s.reason;
    d["workspace_bytes"] = s.ok ? workspace(l.alg, l.args) : int64_t(0);
    d["deterministic"] = l.alg != nullptr && l.alg->deterministic;
    d["tensor_cores"] = l.alg != nullptr && tensor_cores(l.alg);
    out.append(d);
  }
  return out;
}

// One dict of a memory-bound family's algorithm (norm, pool): name, supported, reason, and the
// selection's fields (no workspace of its own, deterministic, no tensor cores).
inline nanobind::dict describe_algorithm(const char* name, const Support& s) {
  nanobind::dict d;
  d["name"] = name;
  d["supported"] = s.ok;
  d["reason"] = s.reason;
  d["workspace_bytes"] = int64_t(0);
  d["deterministic"] = true;
  d["tensor_cores"] = false;
  return d;
}

// The norm problem of a listing: pass "fwd" (training), "infer" or "bwd", the canonical shape
// [P, A, C, K, T, Q] and the dtype of x.
inline norm::Pass norm_pass(const std::string& pass) {
  if (pass == "fwd") return norm::Pass::kTrain;
  if (pass == "infer") return norm::Pass::kInfer;
  if (pass == "bwd") return norm::Pass::kBwd;
  throw std::invalid_argument("norm pass must be fwd, infer or bwd, got " + pass);
}
inline norm::Problem norm_problem(const std::vector<int64_t>& shape, const std::string& dtype,
                                  bool centered, bool relu, bool residual) {
  if (shape.size() != 6) throw std::invalid_argument("norm shape needs 6 entries");
  norm::Problem p;
  p.s = norm::Shape{shape[0], shape[1], shape[2], shape[3], shape[4], shape[5]};
  p.dtype = dtype_from_name(dtype);
  p.centered = centered;
  p.epi = {relu, residual};
  Status st = norm::validate(p.s);
  if (!st.ok()) throw std::invalid_argument("norm shape: " + st.message);
  return p;
}

// Binds norm_algorithms(pass, shape, dtype, centered, relu, residual) of a registry
// `algorithms(pass, problem)` (relu, residual: the fused epilogue, norm.h Epilogue): its dicts in
// preference order, each with two_calls (a training forward as two calls).
template <typename Registry>
void def_norm_algorithms(nanobind::module_& m, Registry algorithms) {
  m.def(
      "norm_algorithms",
      [algorithms](std::string pass, std::vector<int64_t> shape, std::string dtype,
                   bool centered, bool relu, bool residual) {
        const norm::Problem p = norm_problem(shape, dtype, centered, relu, residual);
        nanobind::list out;
        for (const norm::Algorithm* a : algorithms(norm_pass(pass), p)) {
          nanobind::dict d = describe_algorithm(a->name, a->supports(p));
          d["two_calls"] = a->two_calls;
          out.append(d);
        }
        return out;
      },
      nanobind::arg("pass_"), nanobind::arg("shape"), nanobind::arg("dtype"),
      nanobind::arg("centered"), nanobind::arg("relu") = false,
      nanobind::arg("residual") = false);
}

// Binds pool_algorithms(op, problem, dtype, count_include_pad) of a pool registry: the
// algorithms of the op's direction in preference order. problem: N, C, then in, out, window,
// stride, pad_lo, pad_hi (3 entries each, the canonical (N, D, H, W, C) problem of pool.h).
inline void def_pool_algorithms(nanobind::module_& m,
                                const std::vector<const pool::Algorithm*>& all) {
  m.def(
      "pool_algorithms",
      [&all](std::string op, std::vector<int64_t> problem, std::string dtype,
             bool count_include_pad) {
        if (problem.size() != 20) throw std::invalid_argument("pool problem needs 20 entries");
        pool::Args a;
        a.op = pool::Op::kMaxFwd;
        while (op != pool::op_name(a.op)) {
          if (a.op == pool::Op::kAvgBwd) throw std::invalid_argument("unknown pool op " + op);
          a.op = static_cast<pool::Op>(int(a.op) + 1);
        }
        pool::Problem& p = a.p;
        p.N = problem[0];
        p.C = problem[1];
        for (int i = 0; i < 3; ++i) {
          p.in[i] = problem[2 + i];
          p.out[i] = problem[5 + i];
          p.window[i] = problem[8 + i];
          p.stride[i] = problem[11 + i];
          p.pad_lo[i] = problem[14 + i];
          p.pad_hi[i] = problem[17 + i];
        }
        Status st = pool::validate(p);
        if (!st.ok()) throw std::invalid_argument("pool problem: " + st.message);
        a.dtype = dtype_from_name(dtype);
        a.index = p.window_size() <= pool::kMaxU8Window ? pool::IndexType::kU8
                                                        : pool::IndexType::kI32;
        a.count_include_pad = count_include_pad;
        nanobind::list out;
        for (const pool::Algorithm* algo : all)
          if (algo->forward == pool::is_forward(a.op))
            out.append(describe_algorithm(algo->name, algo->supports(a)));
        return out;
      },
      nanobind::arg("op"), nanobind::arg("problem"), nanobind::arg("dtype"),
      nanobind::arg("count_include_pad"));
}

}  // namespace jaxdnn::ffi_util
