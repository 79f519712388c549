// Small device helpers around the CUTLASS kernels: copies that pad or unpad matrices (and convert
// their element type), the epilogue scalars, and the quantization of a float A. Host-callable
// launchers, no CUTLASS.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemm/gemm_problem.h"
#include "quantize/quantize.h"

// Returns from the enclosing function with the error of a CUDA call that failed.
#define JAX_NVFP4_TRY(expr)               \
  do {                                    \
    const cudaError_t err_ = (expr);      \
    if (err_ != cudaSuccess) return err_; \
  } while (0)

namespace jax_nvfp4 {
namespace sm100 {

// SMs of the current device (what CUTLASS's persistent schedulers size their grids and
// workspaces for); 0 when no device answers.
inline int current_sm_count() {
  int device = 0, count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count;
}

// A bound above the SMs of an sm_100a GPU (a B200 enables 148). CUTLASS's grouped GEMM takes 640
// bytes of workspace an SM (host-side probe of CUTLASS 4.2).
constexpr int kMaxSm100Sms = 160;

enum class Elem : int { kU8 = 0, kF32 = 1, kBF16 = 2, kF16 = 3 };

// A row-major matrix view: rows x cols elements, rows `pitch` elements apart.
struct MatrixRef {
  const void* data = nullptr;
  Elem elem = Elem::kU8;
  int64_t rows = 0, cols = 0, pitch = 0;
};

// dst[r, c] = src[r, c] converted to dst's element type for r < src.rows and c < src.cols,
// zero elsewhere, over dst's rows x cols. Supported: same type (any), and f32 <-> f16 / bf16.
cudaError_t copy_matrix(const MatrixRef& src, const MatrixRef& dst, cudaStream_t stream);

// alpha = a_s_dec * b_s_dec (skipped when alpha is null); out_s_dec = 1 / out_s_enc when
// out_s_enc is given.
cudaError_t epilogue_scalars(const float* a_s_dec, const float* b_s_dec, float* alpha,
                             const float* out_s_enc, float* out_s_dec, cudaStream_t stream);

// W4A16: p's float A [m, k] quantized with its dynamic amax into codes, scales and s_dec, with
// the quantizer's scratch (quantize_workspace_bytes of the result; all null when only sizing).
inline QuantizeProblem quantize_a_problem(const GemmProblem& p, uint8_t* codes, uint8_t* scales,
                                          float* s_dec, void* workspace) {
  QuantizeProblem q;
  q.rows = q.rows_per_matrix = p.m;
  q.k = p.k;
  q.x = p.a;
  q.x_dtype = p.a_dtype;
  q.codes = codes;
  q.scales = scales;
  q.s_dec = s_dec;
  q.workspace = workspace;
  q.workspace_bytes = quantize_workspace_bytes(q);
  return q;
}

}  // namespace sm100
}  // namespace jax_nvfp4
