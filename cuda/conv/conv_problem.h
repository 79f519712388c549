// The convolution problem handed from the FFI handler to a kernel family (sm90 or sm100).
//
//   out[n, p, q, k] = alpha * sum_{r, s, c} x[n, h, w, c] * wgt[r, s, k, c] (+ bias[k])
//   h = p*stride_h - pad_h + r*dil_h,  w = q*stride_w - pad_w + s*dil_w  (zero outside)
//
// Activations NHWC; weights stored [R, S, K, C] ("HWOI": the contracting C axis last, as every
// NVFP4Array has it), quantized along C; each (r, s) slice is one [K, C] NVFP4 matrix with its
// own tiled scales (common/scale_layout.h), slices laid out one after another.
#pragma once

#include <cstdint>

#include "gemm/gemm_problem.h"

namespace jax_nvfp4 {

struct ConvProblem {
  int64_t n = 0, h = 0, w = 0, c = 0;  // input; c is a multiple of 16
  int64_t k = 0;                       // output channels
  int r = 1, s = 1;                    // filter taps
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;            // leading (top/left) padding; trailing follows from p, q
  int dil_h = 1, dil_w = 1;
  int64_t p = 0, q = 0;                // output height, width

  // Activations: float NHWC (x, x_dtype) or NVFP4 quantized along C (x_q).
  bool x_is_nvfp4 = false;
  const void* x = nullptr;
  DType x_dtype = DType::kBF16;
  Nvfp4Operand x_q;

  Nvfp4Operand wgt;  // codes [R*S*K, C/2]; scales R*S blocks of scale_matrix_bytes(K, C/16)

  const void* bias = nullptr;  // optional [k]
  DType bias_dtype = DType::kF32;

  void* out = nullptr;  // [n, p, q, k]
  DType out_dtype = DType::kBF16;
};

}  // namespace jax_nvfp4
