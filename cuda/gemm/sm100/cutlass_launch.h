// How the sm_100a launchers hand CUTLASS a GEMM (gemm_sm100_cutlass.cuh, ragged_sm100_cutlass.cuh):
// the hardware its persistent scheduler sizes the grid for, and the checked launch.
#pragma once

#include <cuda_runtime.h>

#include "common/library_failure.h"
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"

namespace jax_nvfp4 {
namespace sm100 {

// The current device, with sm_count SMs.
inline cutlass::KernelHardwareInfo hardware_info(int sm_count) {
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count;
  return hw;
}

// Enqueues the GEMM adapter `Gemm` on stream with its workspace; cudaErrorInvalidValue when
// CUTLASS rejects the arguments.
template <class Gemm>
cudaError_t run_gemm(const typename Gemm::Arguments& arguments, void* workspace, cudaStream_t stream) {
  Gemm gemm;
  if (gemm.can_implement(arguments) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.initialize(arguments, workspace, stream) != cutlass::Status::kSuccess) {
    return cudaErrorInvalidValue;
  }
  if (gemm.run(stream) != cutlass::Status::kSuccess) return library_failure();
  return cudaSuccess;
}

}  // namespace sm100
}  // namespace jax_nvfp4
