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
#include <type_traits>

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
// kFusedWsWide is fused_ws on tiles of 256 staged rows instead of 128; kFusedWsNarrow on tiles of
// 64 (ragged GEMMs only).
enum class GemmPath : int {
  kAuto = 0, kDecode = 1, kPrefill = 2, kFused = 3, kFusedWs = 4, kPrefillCutlass = 5, kFusedWsWide = 6,
  kFusedWsNarrow = 7
};

// A stack of `count` GEMMs of one shape (the stacked FFI calls: vmap over stacked weights), run
// in one launch by a kernel that can (gemm_sm90_runs_stack). Element e reads each operand and
// writes its output advanced by e times the stride, in bytes; a stride of 0 is an operand every
// element shares.
struct GemmStack {
  int64_t count = 1;
  int64_t a = 0, a_scales = 0, a_s_dec = 0;  // a: float x, or the NVFP4 codes
  int64_t b_codes = 0, b_scales = 0, b_s_dec = 0;
  int64_t bias = 0, out = 0;
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

  GemmStack stack;  // one GEMM (count 1) unless the launcher runs stacks (float output only)

  // A ragged GEMM (lax.ragged_dot; float output): the weights (and bias, s_dec where stacked) are
  // `stack.count` groups, strided as `stack` says, and a and out are shared (strides 0). Group g
  // multiplies the group_sizes[g] rows of a that follow group g - 1's, group 0's from row
  // *first_row; negative sizes count as 0 and rows past m are dropped. Rows outside every group
  // are written as zeros. Both are device int32 values, read by the kernel (no host sync).
  const int32_t* group_sizes = nullptr;  // [stack.count]
  const int32_t* first_row = nullptr;    // scalar

  // Whether the output is NVFP4. Told by out_s_enc, a scalar: XLA gives a zero-sized buffer (the
  // codes and scales of an output without rows) no address.
  __host__ __device__ bool nvfp4_out() const { return out_s_enc != nullptr; }
  __host__ __device__ bool ragged() const { return group_sizes != nullptr; }
};

// Columns of the output: n, or n / 2 with a gated activation.
__host__ __device__ inline int64_t out_cols(const GemmProblem& p) { return is_gated(p.activation) ? p.n / 2 : p.n; }

// ptr advanced by `bytes` (a null pointer, an absent operand, stays null).
template <class T>
__host__ __device__ inline T* advanced(T* ptr, int64_t bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const uint8_t, uint8_t>;
  return ptr == nullptr ? ptr : reinterpret_cast<T*>(reinterpret_cast<Byte*>(ptr) + bytes);
}

// Element e of a stack (float output) as a problem of its own.
__host__ __device__ inline GemmProblem stack_element(const GemmProblem& stack, int64_t e) {
  GemmProblem p = stack;
  const GemmStack& s = stack.stack;
  p.a = advanced(p.a, e * s.a);
  p.a_q = {advanced(p.a_q.codes, e * s.a), advanced(p.a_q.scales, e * s.a_scales),
           advanced(p.a_q.s_dec, e * s.a_s_dec)};
  p.b = {advanced(p.b.codes, e * s.b_codes), advanced(p.b.scales, e * s.b_scales),
         advanced(p.b.s_dec, e * s.b_s_dec)};
  p.bias = advanced(p.bias, e * s.bias);
  p.out = advanced(p.out, e * s.out);
  p.stack = GemmStack{};
  return p;
}

}  // namespace jax_nvfp4
