// Launcher of the sm_90a (Hopper) NVFP4-weight convolution: implicit GEMM on wgmma with the
// activations of one input row segment loaded once into shared memory and reused for all S
// filter taps along W by shifting the wgmma B-operand descriptor (conv_sm90_schedule.h).
#pragma once

#include <cuda_runtime.h>

#include "conv/conv_problem.h"

namespace jax_nvfp4 {

// Runs `p` on `stream`. Activations bf16/f16/f32 or NVFP4 (x_q: codes [N*H*W, C/2], scales one
// tiled [W, C/16] matrix per (n, h) image row, as an NVFP4Array [N, H, W, C] stores them).
// Returns cudaErrorInvalidValue for a problem it cannot take (shared memory over the limit).
cudaError_t conv_sm90(const ConvProblem& p, cudaStream_t stream);

}  // namespace jax_nvfp4
