// nanobind glue shared by the CPU and CUDA modules.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "cc/ffi/conv_common.h"
#include "cc/ffi/handlers.h"

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

}  // namespace jaxdnn::ffi_util
