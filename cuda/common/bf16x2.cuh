// bf16x2 register helpers shared by the sm_90a and sm_100a kernels.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace jax_nvfp4 {

// Two floats rounded to bf16 (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Lane-wise a * b of two bf16x2 registers, rounded to nearest even (subnormals kept).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

}  // namespace jax_nvfp4
