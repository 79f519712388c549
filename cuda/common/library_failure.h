// The CUDA error reported when a library (CUTLASS, cuBLASLt) fails to set up or launch a kernel
// and its status says no more than that.
#pragma once

#include <cuda_runtime.h>

namespace jax_nvfp4 {

// The launch's own error where CUDA recorded one (taking it, as cudaGetLastError does), else
// cudaErrorUnknown. Not cudaErrorLaunchFailure: its text reads as the fault of a kernel that ran,
// which would leave the context unusable; a refused launch does not.
inline cudaError_t library_failure() {
  const cudaError_t err = cudaGetLastError();
  return err != cudaSuccess ? err : cudaErrorUnknown;
}

}  // namespace jax_nvfp4
