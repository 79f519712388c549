// The nanobind extension: exposes every registered FFI handler as a PyCapsule, plus which
// GPU targets were compiled, so the Python package can register them with XLA.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common/ffi_registry.h"

namespace nb = nanobind;

NB_MODULE(_nvfp4_cuda, m) {
  m.def("targets", []() {
    nb::dict out;
    for (const auto& [name, handler] : jax_nvfp4::ffi_targets()) {
      out[name.c_str()] = nb::capsule(reinterpret_cast<void*>(handler));
    }
    return out;
  });
  m.def("cuda_archs", []() {
    std::vector<std::string> archs;
#ifdef JAX_NVFP4_HAS_SM90
    archs.push_back("sm_90a");
#endif
#ifdef JAX_NVFP4_HAS_SM100
    archs.push_back("sm_100a");
#endif
    return archs;
  });
}
