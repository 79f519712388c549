// The CUTLASS GEMM instantiations of the sm_100a path, one per (output kind, 1-SM/2-SM).
// Declared here for the launcher; defined in gemm_sm100_cutlass.cuh and explicitly
// instantiated in gemm_sm100_{f32,bf16,nvfp4}.cu so the heavy TUs build in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "gemm/sm100/gemm_sm100_args.h"

namespace jax_nvfp4 {
namespace sm100 {

// Bytes of device workspace the CUTLASS kernel needs for args.
template <OutKind kKind, bool kTwoSm>
size_t cutlass_workspace_bytes(const Args& args, int sm_count);

// Enqueues the CUTLASS kernel; cudaErrorInvalidValue when CUTLASS rejects the arguments.
template <OutKind kKind, bool kTwoSm>
cudaError_t run_cutlass(const Args& args, int sm_count, cudaStream_t stream);

}  // namespace sm100
}  // namespace jax_nvfp4
