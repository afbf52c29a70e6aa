// jaxdnn._cpu: the CPU handlers and the CPU conv algorithm registry, as seen from Python.

#include "cc/conv/cpu_algorithms.h"
#include "cc/ffi/module_common.h"

namespace nb = nanobind;
using namespace jaxdnn;

ffi_util::HandlerList& ffi_util::cpu_handlers() {
  static HandlerList list;
  return list;
}

NB_MODULE(_cpu, m) {
  m.def("registrations", [] { return ffi_util::to_registrations(ffi_util::cpu_handlers()); });
  m.def("ffi_api_version", [] { return nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); });
  m.def(
      "conv_algorithms",
      [](int direction, std::vector<int64_t> problem, std::string in_dtype, std::string out_dtype,
         int num_threads) {
        conv::Args args = ffi_util::decode_conv_args(direction, problem, in_dtype, out_dtype);
        return ffi_util::describe_conv_algorithms(
            conv::cpu_algorithms(), args,
            [&](const conv::CpuAlgorithm* a, const conv::Args& x) {
              return a->workspace_bytes(x, num_threads);
            },
            [](const conv::CpuAlgorithm*) { return false; });
      },
      nb::arg("direction"), nb::arg("problem"), nb::arg("in_dtype"), nb::arg("out_dtype"),
      nb::arg("num_threads"));
}
