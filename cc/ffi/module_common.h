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

// One dict per registered algorithm: name, supported, reason, workspace_bytes, deterministic,
// tensor_cores. `workspace(algo, args)` returns the algorithm's workspace for the problem and
// `tensor_cores(algo)` whether it uses tensor cores.
template <typename Algo, typename Workspace, typename TensorCores>
nanobind::list describe_conv_algorithms(const std::vector<const Algo*>& all, const conv::Args& args,
                                        Workspace workspace, TensorCores tensor_cores) {
  nanobind::list out;
  Status valid = conv::validate(args.p);
  for (const Algo* a : all) {
    Support s = valid.ok() ? conv::algorithm_supports(*a, args)
                           : Support::No(valid.message);
    nanobind::dict d;
    d["name"] = a->name;
    d["supported"] = s.ok;
    d["reason"] = s.reason;
    d["workspace_bytes"] = s.ok ? workspace(a, args) : int64_t(0);
    d["deterministic"] = a->deterministic;
    d["tensor_cores"] = tensor_cores(a);
    out.append(d);
  }
  return out;
}

}  // namespace jaxdnn::ffi_util
