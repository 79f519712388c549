// Small helpers shared by the FFI handlers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "xla/ffi/api/ffi.h"

namespace jax_nvfp4 {

namespace ffi = xla::ffi;

inline bool to_dtype(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = DType::kF32; return true;
    case ffi::DataType::BF16: *out = DType::kBF16; return true;
    case ffi::DataType::F16: *out = DType::kF16; return true;
    default: return false;
  }
}

inline ffi::Error cuda_error(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInternal, std::string(what) + ": " + cudaGetErrorString(err));
}

// The kernels carve their workspace at 256-byte offsets and need a 256-byte aligned base; XLA
// aligns buffers less strictly, so a workspace result holds kWorkspaceAlign spare bytes.
constexpr size_t kWorkspaceAlign = 256;

// Size of the workspace result for `bytes` bytes of aligned workspace.
inline size_t workspace_result_bytes(size_t bytes) { return bytes == 0 ? 0 : bytes + kWorkspaceAlign; }

// Sets *workspace to the aligned start of the workspace result (null when bytes == 0), or returns
// an error naming `op` when the result is smaller than the call needs.
inline ffi::Error bind_workspace(ffi::Result<ffi::AnyBuffer>& result, size_t bytes, void** workspace,
                                 const char* op) {
  *workspace = nullptr;
  if (bytes == 0) return ffi::Error::Success();
  const size_t have = result->size_bytes();
  if (have < workspace_result_bytes(bytes)) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(op) + ": workspace result of " + std::to_string(have) +
                          " bytes, the call needs " + std::to_string(workspace_result_bytes(bytes)));
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(result->untyped_data());
  *workspace = reinterpret_cast<void*>((base + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign);
  return ffi::Error::Success();
}

// Every handler launches the same device work for the same shapes and attributes, with no host
// synchronization and no allocation: XLA may capture it into a CUDA graph (command buffer).
inline constexpr auto kGraphSafe = ffi::Traits::kCmdBufferCompatible;

// Compute capability of the current device as major*10+minor (90 for Hopper, 100 for B200).
inline int current_compute_capability() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor;
}

}  // namespace jax_nvfp4
