// Entry points of the two sm_90a kernel families, called by the dispatcher (gemm_sm90.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

#include "gemm/gemm_problem.h"

namespace jax_nvfp4 {
namespace sm90 {

// Small-M kernel: writes p.out (float dtype) directly. It runs a whole stack (p.stack) in one
// launch where decode_runs_stack(p): the grid's rows hold every element's activation tiles. Its
// workspace holds NVFP4 x dequantized to bf16 where it stages x (W4A4 at M <= 4 on large weights), else nothing.
bool decode_runs_stack(const GemmProblem& p);
// A ragged GEMM (p.ragged()) runs in one launch, its grid over the groups' 8-row tiles, where this holds.
bool decode_runs_ragged(const GemmProblem& p);
size_t decode_workspace_bytes(const GemmProblem& p);
cudaError_t decode_gemm(const GemmProblem& p, cudaStream_t stream);

// The activations of the fused kernels, staged once per call at the start of the workspace
// (fused_staging.h: K order and tile layout): tiles of `mt` (64, 128 or 256) rows by 128 K, every x
// kind made bf16 (f16 and f32 as a hi and a lo row, rows_per_x_row = 2).
struct StagedActivations {
  int mt = 128;
  int rows_per_x_row = 1;
  int64_t m_tiles = 0, chunks = 0;
  size_t bytes = 0;
};
StagedActivations staged_activations(const GemmProblem& p, int mt);
cudaError_t stage_activations(const GemmProblem& p, const StagedActivations& s, cudaStream_t stream);

// Mid-M kernel: stages x in the workspace, dequantizes the weights in its main loop.
size_t fused_workspace_bytes(const GemmProblem& p);
cudaError_t fused_gemm(const GemmProblem& p, cudaStream_t stream);

// Large-M kernel on the same staging and weight stages: warp-specialized (a producer warp
// feeding an mbarrier ring, two consumer warpgroups) and persistent over output tiles of 128
// weight rows x 128 staged rows, or 256 (wide). Runs ragged GEMMs too, on tiles of 64, 128 or 256
// staged rows: each tile one group's weights.
// `mt`: the staged rows of a tile, 128 or 256 (ragged GEMMs: 64, 128 or 256).
size_t fused_ws_workspace_bytes(const GemmProblem& p, int mt);
int64_t fused_ws_output_tiles(const GemmProblem& p, int mt);
cudaError_t fused_ws_gemm(const GemmProblem& p, int mt, cudaStream_t stream);

// Large-M path: dequantize pass + CUTLASS wgmma GEMM, writing p.out (float dtype).
size_t prefill_workspace_bytes(const GemmProblem& p);
cudaError_t prefill_gemm(const GemmProblem& p, cudaStream_t stream);

// D[m, n] (row-major, of the output type) = *alpha * A[m, k] . B[n, k]^T + bias[n]: bf16
// row-major A and B, float32 alpha and bias; n must keep D's rows 16-byte aligned. `prepare`
// (may be empty) enqueues the kernels that write A, B, alpha and bias; it runs after CUTLASS's
// workspace set-up, so that the GEMM, a programmatic dependent launch, directly follows them.
struct WgmmaGemmArgs {
  int m, n, k;
  const void* a;
  const void* b;
  void* d;
  const float* alpha;
  const float* bias;
  void* workspace;
};
size_t wgmma_gemm_workspace_f32(int m, int n, int k);
size_t wgmma_gemm_workspace_bf16(int m, int n, int k);
size_t wgmma_gemm_workspace_f16(int m, int n, int k);
cudaError_t wgmma_gemm_f32(const WgmmaGemmArgs& g, cudaStream_t stream,
                           const std::function<cudaError_t()>& prepare);
cudaError_t wgmma_gemm_bf16(const WgmmaGemmArgs& g, cudaStream_t stream,
                           const std::function<cudaError_t()>& prepare);
cudaError_t wgmma_gemm_f16(const WgmmaGemmArgs& g, cudaStream_t stream,
                           const std::function<cudaError_t()>& prepare);

// Streaming-multiprocessor count of the current device (cached per device).
int sm_count();

}  // namespace sm90
}  // namespace jax_nvfp4
