// The CUDA error reported when a library (CUTLASS, cuBLASLt) fails to set up or launch a kernel
// and its status says no more than that.
#pragma once

#include <cuda_runtime.h>

namespace jax_nvfp4 {

// The error CUDA still holds (taking it, as cudaGetLastError does): a sticky fault, or a launch
// error the library did not take itself (CUTLASS's cluster launcher leaves it; its GEMM adapter
// and workspace set-up take theirs), else cudaErrorUnknown. Not cudaErrorLaunchFailure: its text
// reads as the fault of a kernel that ran, which leaves the context unusable; a refused launch
// does not.
inline cudaError_t library_failure() {
  const cudaError_t err = cudaGetLastError();
  return err != cudaSuccess ? err : cudaErrorUnknown;
}

}  // namespace jax_nvfp4
