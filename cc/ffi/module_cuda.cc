// jaxdnn._cuda: the CUDA handlers and the CUDA conv algorithm registry, as seen from Python.
// Importing it needs no GPU (cudart is linked statically and only touched by the queries
// below when asked).

#include <cuda_runtime.h>

#include "cc/conv/cuda_algorithms.h"
#include "cc/norm/cuda_norm.h"
#include "cc/pool/cuda_pool.h"
#include "cc/softmax/cuda_softmax.h"
#include "cc/ffi/module_common.h"

namespace nb = nanobind;
using namespace jaxdnn;

ffi_util::HandlerList& ffi_util::cuda_handlers() {
  static HandlerList list;
  return list;
}

NB_MODULE(_cuda, m) {
  m.def("registrations", [] { return ffi_util::to_registrations(ffi_util::cuda_handlers()); });
  m.def("ffi_version", [] { return JAXDNN_FFI_VERSION; });
  m.def(
      "conv_algorithms",
      [](int direction, std::vector<int64_t> problem, std::string in_dtype, std::string out_dtype,
         int /*num_threads*/, std::vector<std::string> names, bool variants) {
        conv::Args args = ffi_util::decode_conv_args(direction, problem, in_dtype, out_dtype);
        return ffi_util::describe_conv_algorithms(
            conv::cuda_algorithms(), args, names, variants,
            [](const conv::CudaAlgorithm* a, const conv::Args& x) { return a->workspace_bytes(x); },
            [](const conv::CudaAlgorithm* a) { return a->tensor_cores; });
      },
      nb::arg("direction"), nb::arg("problem"), nb::arg("in_dtype"), nb::arg("out_dtype"),
      nb::arg("num_threads"), nb::arg("names") = std::vector<std::string>(),
      nb::arg("variants") = false);
  m.def(
      "time_conv_algorithm",
      [](int direction, std::vector<int64_t> problem, std::string in_dtype, std::string out_dtype,
         std::string name, int repeats) {
        conv::Args args = ffi_util::decode_conv_args(direction, problem, in_dtype, out_dtype);
        std::string error;
        const conv::CudaAlgorithm* alg =
            conv::find_algorithm(conv::cuda_algorithms(), name, &args.variant, &error);
        if (alg == nullptr) throw std::invalid_argument(error);
        Support sup = conv::algorithm_supports(*alg, args);
        if (!sup.ok) throw std::invalid_argument(name + ": " + sup.reason);
        std::vector<float> ms;
        Status st = conv::time_cuda_algorithm(*alg, args, repeats, &ms);
        if (!st.ok()) throw std::runtime_error(st.message);
        return ms;
      },
      nb::arg("direction"), nb::arg("problem"), nb::arg("in_dtype"), nb::arg("out_dtype"),
      nb::arg("name"), nb::arg("repeats"),
      "Device milliseconds of `repeats` runs of one algorithm (CUDA events, own stream and "
      "buffers); RuntimeError when it cannot run (e.g. not enough free GPU memory).");
  m.def(
      "softmax_algorithms",
      [](int64_t rows, int64_t cols, std::string dtype) {
        const softmax::Problem p{ffi_util::dtype_from_name(dtype), rows, cols};
        nb::list out;
        for (const softmax::CudaAlgorithm* a : softmax::cuda_algorithms()) {
          Support s = a->supports(p);
          nb::dict d;
          d["name"] = a->name;
          d["supported"] = s.ok;
          d["reason"] = s.reason;
          d["workspace_bytes"] = int64_t(0);
          d["deterministic"] = true;
          d["tensor_cores"] = false;
          out.append(d);
        }
        return out;
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("dtype"));
  ffi_util::def_norm_algorithms(m, norm::cuda_algorithms);
  ffi_util::def_pool_algorithms(m, pool::cuda_algorithms());
  m.def("cuda_runtime_version", [] {
    int v = 0;
    cudaRuntimeGetVersion(&v);
    return v;
  });
}
