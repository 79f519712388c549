// Each op's FFI handlers register themselves here at load time; ffi_module.cc hands the
// whole table to Python as capsules. Adding an op means adding files, not editing a list.
#pragma once

#include <map>
#include <string>

#include "xla/ffi/api/c_api.h"

namespace jax_nvfp4 {

inline std::map<std::string, XLA_FFI_Handler*>& ffi_targets() {
  static std::map<std::string, XLA_FFI_Handler*> targets;
  return targets;
}

struct FfiTargetRegistration {
  FfiTargetRegistration(const char* name, XLA_FFI_Handler* handler) { ffi_targets()[name] = handler; }
};

}  // namespace jax_nvfp4

// Registers `handler` (a symbol made with XLA_FFI_DEFINE_HANDLER_SYMBOL) as FFI target `name`.
#define JAX_NVFP4_REGISTER_FFI_TARGET(name, handler) \
  static ::jax_nvfp4::FfiTargetRegistration handler##_registration{name, handler}
