// Blackwell (sm_100a) NVFP4 GEMM: CUTLASS's block-scaled tcgen05 kernels behind a plain launcher.
//
// Host-only declarations (no CUTLASS here: the FFI handler including this is compiled with g++).
// gemm_sm100 takes both W4A4 (A already NVFP4) and W4A16 (A float: quantized first, with its
// dynamic amax, into the workspace), float output (f32/bf16/f16) or NVFP4 output when
// p.nvfp4_out(), and an optional bias. Nothing is read back on the host: alpha and
// the output decode scale are formed on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "gemm/gemm_problem.h"

namespace jax_nvfp4 {

// Device scratch gemm_sm100 needs for p on the current GPU (quantized A, K-padded codes, unpadded
// output staging, alpha, CUTLASS's own workspace, which with the 1-SM or 2-SM choice depends on
// the SM count). p.workspace must point to at least this many bytes.
size_t gemm_sm100_workspace_bytes(const GemmProblem& p);

// The most p needs over the SM counts an sm_100a GPU can have: what a call's workspace is sized
// for when it is lowered, so that it runs on any of them (jax.export).
size_t gemm_sm100_lowered_workspace_bytes(const GemmProblem& p);

// Enqueues the GEMM on stream. Returns cudaErrorInvalidValue for a problem it cannot run
// (k not a multiple of 16, too little workspace, unsupported dtype). A ragged problem
// (p.ragged()) goes to ragged_sm100.
cudaError_t gemm_sm100(const GemmProblem& p, cudaStream_t stream);

// The ragged GEMM (GemmProblem::group_sizes; float output, k a multiple of 32, n of 4): one
// CUTLASS grouped block-scaled GEMM over the groups' rows (ragged_sm100_plan.h), A quantized
// first for W4A16 as above. Its workspace, the launch (cudaErrorInvalidValue for a problem
// it cannot run), and why it cannot run p (nullptr when it can).
const char* ragged_sm100_unsupported_reason(const GemmProblem& p);
size_t ragged_sm100_workspace_bytes(const GemmProblem& p, int sm_count);
cudaError_t ragged_sm100(const GemmProblem& p, cudaStream_t stream);

}  // namespace jax_nvfp4
