// Launcher of the sm_100a shifted-operand convolution (tcgen05.mma kind::f16 with .ashift).
//
// Activations go to Tensor Memory as the MMA's A operand, one output pixel per TMEM lane; the
// NVFP4 weights are dequantized to bf16 into shared memory as the B operand; consecutive filter
// taps along W reuse the activations by shifting A one lane down after each MMA. The schedule
// (which pixel sits in which lane, the lane masks) is conv_sm100_schedule.h.
//
// Host-includable: no CUTLASS, no PTX. Compiled for sm_100a only; the FFI handler calls it on
// compute capability 10.x under JAX_NVFP4_HAS_SM100.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "conv/conv_problem.h"

namespace jax_nvfp4 {

// Enqueues the convolution on `stream`. Float activations (f32/f16/bf16) are rounded to bf16 for
// the MMA; NVFP4 activations (x_is_nvfp4; scales tiled per [W, C] matrix of each (n, h)) are
// dequantized exactly. Returns cudaErrorInvalidValue for a problem the kernel cannot take
// (c not a multiple of 16, a filter wider than one 32-lane sub-partition can shift through).
cudaError_t conv_sm100(const ConvProblem& p, cudaStream_t stream);

}  // namespace jax_nvfp4
