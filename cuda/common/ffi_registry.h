// Each op's FFI handlers register themselves here at load time; ffi_module.cc hands the
// whole table to Python as capsules, an execute, an instantiate and an initialize handler a
// target (initialize_stage.h). Adding an op means adding files, not editing a list.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/initialize_stage.h"
#include "xla/ffi/api/c_api.h"

namespace jax_nvfp4 {

struct FfiStages {
  XLA_FFI_Handler* execute;
  XLA_FFI_Handler* instantiate;
  XLA_FFI_Handler* initialize;
};

inline std::map<std::string, FfiStages>& ffi_targets() {
  static std::map<std::string, FfiStages> targets;
  return targets;
}

// How many times each handler has run on the host for its execute stage. XLA runs a handler once
// when it records the call into a CUDA graph (command buffer) and not when it replays the graph,
// so tests read these to see that a loop of calls was captured. The initialize stage's warm-up
// run is not counted.
inline std::atomic<uint64_t>& host_calls(const std::string& target) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<std::atomic<uint64_t>>> counts;
  std::lock_guard<std::mutex> lock(mu);
  auto& count = counts[target];
  if (!count) count = std::make_unique<std::atomic<uint64_t>>(0);
  return *count;
}

// Counts one host execution of handler `target` (a string literal).
#define JAX_NVFP4_COUNT_HOST_CALL(target)                                           \
  do {                                                                              \
    static std::atomic<uint64_t>& calls_ = ::jax_nvfp4::host_calls(target);         \
    if (!::jax_nvfp4::warming_up()) calls_.fetch_add(1, std::memory_order_relaxed); \
  } while (0)

struct FfiTargetRegistration {
  FfiTargetRegistration(const char* name, FfiStages stages) { ffi_targets()[name] = stages; }
};

}  // namespace jax_nvfp4

// Registers `handler` (a symbol made with XLA_FFI_DEFINE_HANDLER_SYMBOL) as FFI target `name`,
// with its warm-up as the initialize stage and the warm-up's per-call state made at instantiation.
#define JAX_NVFP4_REGISTER_FFI_TARGET(name, handler)                                         \
  static ::jax_nvfp4::FfiTargetRegistration handler##_registration{                          \
      name, {handler, &::jax_nvfp4::instantiate_handler<handler>, &::jax_nvfp4::initialize_handler<handler>}}
