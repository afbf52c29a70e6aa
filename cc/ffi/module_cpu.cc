// jaxdnn._cpu: the CPU handlers and the CPU conv algorithm registry, as seen from Python.

#include "cc/conv/cpu_algorithms.h"
#include "cc/norm/cpu_norm.h"
#include "cc/ffi/module_common.h"

namespace nb = nanobind;
using namespace jaxdnn;

ffi_util::HandlerList& ffi_util::cpu_handlers() {
  static HandlerList list;
  return list;
}

namespace {
norm::Shape norm_shape(const std::vector<int64_t>& shape) {  // (P, A, C, K, T, Q)
  if (shape.size() != 6) throw std::invalid_argument("norm shape needs 6 entries");
  return norm::Shape{shape[0], shape[1], shape[2], shape[3], shape[4], shape[5]};
}
}  // namespace

NB_MODULE(_cpu, m) {
  m.def("registrations", [] { return ffi_util::to_registrations(ffi_util::cpu_handlers()); });
  m.def("ffi_version", [] { return JAXDNN_FFI_VERSION; });
  // Workspace bytes of the norm kernels for a canonical shape (P, A, C, K, T, Q) and the dtype
  // of x: the single definition (cc/norm/norm.h), which jaxdnn/ops/norm.py sizes outputs by.
  m.def(
      "norm_workspace_bytes",
      [](std::string direction, std::vector<int64_t> shape, std::string x_dtype) -> int64_t {
        const norm::Shape s = norm_shape(shape);
        if (direction == "fwd") return norm::fwd_workspace_bytes(s);
        if (direction == "bwd") return norm::bwd_workspace_bytes(s, ffi_util::dtype_from_name(x_dtype));
        throw std::invalid_argument("norm workspace direction must be fwd or bwd");
      },
      nb::arg("direction"), nb::arg("shape"), nb::arg("x_dtype"));
  ffi_util::def_norm_algorithms(m, norm::cpu_algorithms);
  ffi_util::def_pool_algorithms(m, pool::cpu_algorithms());
  // The CPU has one softmax kernel (cc/softmax/cpu_softmax.cc: rows split over the threads);
  // listed so that selection and explain treat every platform alike.
  m.def(
      "softmax_algorithms",
      [](int64_t, int64_t, std::string) {
        nb::dict d;
        d["name"] = "rows";
        d["supported"] = true;
        d["reason"] = "";
        d["workspace_bytes"] = int64_t(0);
        d["deterministic"] = true;
        d["tensor_cores"] = false;
        nb::list out;
        out.append(d);
        return out;
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("dtype"));
  m.def("ffi_api_version", [] { return nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); });
  m.def(
      "conv_algorithms",
      [](int direction, std::vector<int64_t> problem, std::string in_dtype, std::string out_dtype,
         int num_threads, std::vector<std::string> names, bool variants) {
        conv::Args args = ffi_util::decode_conv_args(direction, problem, in_dtype, out_dtype);
        return ffi_util::describe_conv_algorithms(
            conv::cpu_algorithms(), args, names, variants,
            [&](const conv::CpuAlgorithm* a, const conv::Args& x) {
              return a->workspace_bytes(x, num_threads);
            },
            [](const conv::CpuAlgorithm*) { return false; });
      },
      nb::arg("direction"), nb::arg("problem"), nb::arg("in_dtype"), nb::arg("out_dtype"),
      nb::arg("num_threads"), nb::arg("names") = std::vector<std::string>(),
      nb::arg("variants") = false);
}
