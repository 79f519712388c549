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

// The kernels carve their workspace at 256-byte offsets and need a 256-byte aligned base. XLA's
// FFI scratch allocator refused an alignment request of 256 on the H200 (jax 0.11), so this asks
// for 256 spare bytes with the default alignment and aligns the pointer itself. Sets *workspace
// (null when bytes == 0) or returns an error naming `op`.
inline ffi::Error allocate_workspace(ffi::ScratchAllocator& scratch, size_t bytes,
                                     void** workspace, const char* op) {
  constexpr size_t kAlign = 256;
  *workspace = nullptr;
  if (bytes == 0) return ffi::Error::Success();
  auto ws = scratch.Allocate(bytes + kAlign);
  if (!ws.has_value()) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string(op) + ": no workspace of " + std::to_string(bytes) + " bytes");
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(*ws);
  *workspace = reinterpret_cast<void*>((base + kAlign - 1) / kAlign * kAlign);
  return ffi::Error::Success();
}

// Compute capability of the current device as major*10+minor (90 for Hopper, 100 for B200).
inline int current_compute_capability() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor;
}

}  // namespace jax_nvfp4
