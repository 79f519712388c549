// The GEMM problem handed from the FFI handler to a kernel family (sm90 or sm100).
//
//   out[m, n] = act(alpha * sum_k a(m, k) * b(n, k) (+ bias[n])),   alpha = s_dec_a * s_dec_b
//
// With a gated activation (common/activation.h) n is even and the output has n / 2 columns:
//   out[m, j] = act(z[m, 2j]) * z[m, 2j + 1],   z = alpha * sum_k a(m, k) * b(n, k) (+ bias[n]).
//
// All pointers are device pointers. Matrices are row-major with K contiguous ("TN"), the
// NVFP4 codes packed two per byte (element 2i in the low nibble), scales in the tiled layout
// of common/scale_layout.h. alpha is never read on the host (no sync): kernels load the
// s_dec scalars in their epilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/activation.h"
#include "common/dtype.h"

namespace jax_nvfp4 {

struct Nvfp4Operand {
  const uint8_t* codes = nullptr;   // [rows, k/2] bytes
  const uint8_t* scales = nullptr;  // scale_matrix_bytes(rows, k/16) bytes, tiled
  const float* s_dec = nullptr;     // one float32 tensor decode scale
};

// Which kernel family a launcher with several takes: its own shape heuristic, or a forced one
// (tests and benchmarks run each of Hopper's on one shape; JAX_NVFP4_GEMM_SM90_PATH).
// kPrefillCutlass is the prefill path with CUTLASS's GEMM where it would take cuBLASLt's;
// kFusedWsWide is fused_ws on tiles of 256 staged rows instead of 128.
enum class GemmPath : int {
  kAuto = 0, kDecode = 1, kPrefill = 2, kFused = 3, kFusedWs = 4, kPrefillCutlass = 5, kFusedWsWide = 6
};

struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;  // k is a multiple of 16
  GemmPath path = GemmPath::kAuto;

  // A operand: float activations [m, k] (W4A16) or NVFP4 (W4A4).
  bool a_is_nvfp4 = false;
  const void* a = nullptr;
  DType a_dtype = DType::kBF16;
  Nvfp4Operand a_q;

  Nvfp4Operand b;  // weights [n, k]

  const void* bias = nullptr;  // optional [n]
  DType bias_dtype = DType::kF32;
  // Applied in float32 after alpha and the bias, before the output cast or the NVFP4 output
  // quantization (formulas: common/activation.cuh; a gated one pairs the rows of b).
  Activation activation = Activation::kNone;

  // Float output [m, out_cols(*this)]; null when the output is NVFP4.
  void* out = nullptr;
  DType out_dtype = DType::kBF16;

  // NVFP4 output (optional): codes [m, out_cols / 2] bytes, tiled scales over (m rows,
  // out_cols / 16 blocks), quantized with the caller's encode scale; out_s_dec receives
  // 1/out_s_enc.
  uint8_t* out_codes = nullptr;
  uint8_t* out_scales = nullptr;
  const float* out_s_enc = nullptr;
  float* out_s_dec = nullptr;

  void* workspace = nullptr;  // the call's workspace result (common/workspace_registry.h)
  size_t workspace_bytes = 0;

  // Whether the output is NVFP4. Told by out_s_enc, a scalar: XLA gives a zero-sized buffer (the
  // codes and scales of an output without rows) no address.
  bool nvfp4_out() const { return out_s_enc != nullptr; }
};

// Columns of the output: n, or n / 2 with a gated activation.
inline int64_t out_cols(const GemmProblem& p) { return is_gated(p.activation) ? p.n / 2 : p.n; }

}  // namespace jax_nvfp4
