// Entry points of the two sm_90a kernel families, called by the dispatcher (gemm_sm90.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "gemm/gemm_problem.h"

namespace jax_nvfp4 {
namespace sm90 {

// Small-M kernel: writes p.out (float dtype) directly; needs no workspace.
cudaError_t decode_gemm(const GemmProblem& p, cudaStream_t stream);

// Large-M path: dequantize pass + CUTLASS wgmma GEMM, writing p.out (float dtype).
size_t prefill_workspace_bytes(const GemmProblem& p);
cudaError_t prefill_gemm(const GemmProblem& p, cudaStream_t stream);

// Streaming-multiprocessor count of the current device (cached per device).
int sm_count();

}  // namespace sm90
}  // namespace jax_nvfp4
