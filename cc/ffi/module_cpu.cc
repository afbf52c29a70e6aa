// jaxdnn._cpu: the CPU handlers and the CPU conv algorithm registry, as seen from Python.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "cc/conv/cpu_algorithms.h"
#include "cc/ffi/conv_common.h"
#include "cc/ffi/module_common.h"

namespace nb = nanobind;
using namespace jaxdnn;

NB_MODULE(_cpu, m) {
  m.def("registrations", [] {
    ffi_util::HandlerList list;
    ffi_util::add_conv_cpu_handlers(list);
    return ffi_util::to_registrations(list);
  });
  m.def("ffi_api_version", [] { return nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); });
  m.def(
      "conv_algorithms",
      [](int direction, std::vector<int64_t> problem, std::string in_dtype, std::string out_dtype,
         int num_threads) {
        conv::Args args;
        args.dir = static_cast<conv::Direction>(direction);
        args.p = ffi_util::decode_problem(problem);
        args.in = ffi_util::dtype_from_name(in_dtype);
        args.out = ffi_util::dtype_from_name(out_dtype);
        nb::list out;
        for (const conv::CpuAlgorithm* a : conv::cpu_algorithms()) {
          Support s = a->supports(args);
          nb::dict d;
          d["name"] = a->name;
          d["supported"] = s.ok;
          d["reason"] = s.reason;
          d["workspace_bytes"] = s.ok ? a->workspace_bytes(args, num_threads) : 0;
          d["deterministic"] = a->deterministic;
          d["tensor_cores"] = false;
          out.append(d);
        }
        return out;
      },
      nb::arg("direction"), nb::arg("problem"), nb::arg("in_dtype"), nb::arg("out_dtype"),
      nb::arg("num_threads"));
}
