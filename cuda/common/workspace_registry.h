// Device workspace of the FFI handlers, sized at lowering time.
//
// A handler that needs scratch memory takes it as its last result: a uint8 buffer that XLA
// allocates like any other. XLA's FFI scratch allocator cannot be used: its memory is freed when
// the handler returns, while a CUDA graph (XLA command buffer) that captured the launch replays
// it later. The Python side sizes that result by asking the extension (ffi_module.cc), which asks
// the size function the op registered here, with the shapes and element types of the call.
//
// A size holds on every GPU of the compute capability it was asked for, not only on the one that
// lowered the call (a jax.export artifact runs on another). Where a handler's choice of kernel
// depends on more than that (the SM count), the op also registers a settling function: the
// Python side asks it first and lowers the call with the attributes it returns, which force the
// kernel it would pick on this GPU; the workspace is sized for that kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jax_nvfp4 {

struct ArgShape {
  std::vector<int64_t> dims;
  xla::ffi::DataType type = xla::ffi::DataType::INVALID;

  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
};

// What a size function sees: the device's compute capability (major*10+minor), the shapes of
// the call's operands and results (the workspace result excluded) and its integer attributes.
struct WorkspaceQuery {
  int compute_capability = 0;
  std::vector<ArgShape> args;
  std::vector<ArgShape> rets;
  std::map<std::string, int64_t> attrs;
};

using WorkspaceFn = size_t (*)(const WorkspaceQuery&);
// The integer attributes a call is lowered with in place of q.attrs' (those it leaves out stay).
using SettleFn = std::map<std::string, int64_t> (*)(const WorkspaceQuery&);

inline std::map<std::string, WorkspaceFn>& workspace_functions() {
  static std::map<std::string, WorkspaceFn> fns;
  return fns;
}

struct WorkspaceRegistration {
  WorkspaceRegistration(const char* target, WorkspaceFn fn) { workspace_functions()[target] = fn; }
};

inline std::map<std::string, SettleFn>& settle_functions() {
  static std::map<std::string, SettleFn> fns;
  return fns;
}

struct SettleRegistration {
  SettleRegistration(const char* target, SettleFn fn) { settle_functions()[target] = fn; }
};

}  // namespace jax_nvfp4

#define JAX_NVFP4_WORKSPACE_CONCAT_(a, b) a##b
#define JAX_NVFP4_WORKSPACE_NAME_(line) JAX_NVFP4_WORKSPACE_CONCAT_(workspace_registration_, line)

// Declares that FFI target `target` takes a workspace result of fn(query) bytes.
#define JAX_NVFP4_REGISTER_WORKSPACE(target, fn) \
  static ::jax_nvfp4::WorkspaceRegistration JAX_NVFP4_WORKSPACE_NAME_(__LINE__){target, fn}

// Declares that FFI target `target` is lowered with the attributes fn(query) settles.
#define JAX_NVFP4_REGISTER_SETTLED_ATTRS(target, fn) \
  static ::jax_nvfp4::SettleRegistration JAX_NVFP4_WORKSPACE_NAME_(__LINE__){target, fn}
