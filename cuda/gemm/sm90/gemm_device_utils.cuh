// Device helpers shared by the sm_90a GEMM kernels: NVFP4 words to bf16x2 registers (the order
// of nvfp4_bf16x2.h), the activation kinds, and (common/dtype_io.cuh, common/activation.cuh)
// float loads and stores of any operand or output dtype and the epilogue activation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/activation.cuh"
#include "common/bf16x2.cuh"
#include "common/dtype_io.cuh"
#include "gemm/sm90/nvfp4_bf16x2.h"

namespace jax_nvfp4 {
namespace sm90 {

// What the activations are: bf16 goes to the tensor cores as is, NVFP4 is dequantized exactly,
// f16 and f32 are split into bf16 hi + lo (exact for f16, ~2^-17 relative for f32).
enum class XKind { kBF16, kF16, kF32, kNvfp4 };

template <XKind XK>
constexpr bool x_split() {
  return XK == XKind::kF16 || XK == XKind::kF32;
}

// Two E4M3 scales (low 16 bits) -> two bf16x2 registers, each the scale times 2^119 in both halves.
__device__ __forceinline__ void widen_scales(uint32_t two, uint32_t& s0, uint32_t& s1) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const float b0 = f.x * kScaleBoost, b1 = f.y * kScaleBoost;  // exact: powers of two
  s0 = pack_bf16x2(b0, b0);
  s1 = pack_bf16x2(b1, b1);
}

// The 4 dequantized pairs of one word (E2M1 * E4M3 * 2^-7, exact): p[j] = elements j, j + 4.
__device__ __forceinline__ void dequant_word(uint32_t word, uint32_t scale, uint32_t (&p)[4]) {
  p[0] = mul_bf16x2(e2m1_pair_bits<0>(word), scale);
  p[1] = mul_bf16x2(e2m1_pair_bits<1>(word), scale);
  p[2] = mul_bf16x2(e2m1_pair_bits<2>(word), scale);
  p[3] = mul_bf16x2(e2m1_pair_bits<3>(word), scale);
}

}  // namespace sm90
}  // namespace jax_nvfp4
