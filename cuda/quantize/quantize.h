// Launchers of the NVFP4 quantize / dequantize kernels (one family per GPU target; the
// sm_100a family converts with cvt.rn.satfinite.e2m1x2.f32, sm_90a in software, same bytes).
//
// A tensor of logical shape [..., R, K] is seen as `rows` = prod(all dims but K) rows of K
// elements; its scales are tiled per [R, K] matrix (common/scale_layout.h), matrices one after
// another. `groups` encode scales each cover rows/groups consecutive rows.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace jax_nvfp4 {

struct QuantizeProblem {
  int64_t rows = 0;             // rows of K elements (1 for a rank-1 tensor)
  int64_t k = 0;                // a multiple of 16
  int64_t rows_per_matrix = 0;  // R, the second-to-last dim (1 for rank 1)
  int64_t groups = 1;           // number of s_enc values; divides rows
  const void* x = nullptr;      // [rows, k] of x_dtype
  DType x_dtype = DType::kBF16;
  const float* s_enc = nullptr;  // [groups] given encode scales, or null: from the amax (groups == 1)
  uint8_t* codes = nullptr;      // [rows, k/2], packed
  uint8_t* scales = nullptr;     // tiled, padding written as zero
  float* s_dec = nullptr;        // [groups]
  void* workspace = nullptr;     // quantize_workspace_bytes() bytes
  size_t workspace_bytes = 0;
};

struct DequantizeProblem {
  int64_t rows = 0, k = 0, rows_per_matrix = 0, groups = 1;
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const float* s_dec = nullptr;  // [groups]
  void* out = nullptr;           // [rows, k] of out_dtype
  DType out_dtype = DType::kBF16;
};

// CTAs of the amax pass at most (S_enc not given): each leaves its maximum in one float of the
// workspace, which the quantize pass's CTAs reduce.
constexpr int kMaxAmaxBlocks = 1024;

// The amax pass leaves one float per CTA in the workspace.
inline size_t quantize_workspace_bytes(const QuantizeProblem& p) {
  return p.s_enc == nullptr ? kMaxAmaxBlocks * sizeof(float) : 0;
}

cudaError_t quantize_sm90(const QuantizeProblem& p, cudaStream_t stream);
cudaError_t dequantize_sm90(const DequantizeProblem& p, cudaStream_t stream);
cudaError_t quantize_sm100(const QuantizeProblem& p, cudaStream_t stream);
cudaError_t dequantize_sm100(const DequantizeProblem& p, cudaStream_t stream);

}  // namespace jax_nvfp4
