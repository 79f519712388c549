// Device loads and stores of one element of a float operand or output of any DType, as float32
// (stores round to nearest even), and the same conversions for an element type known at compile
// time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/dtype.h"

namespace jax_nvfp4 {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// float32 -> T (float, __nv_bfloat16 or __half), rounding to nearest even.
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    static_assert(std::is_same_v<T, __half>, "float, __nv_bfloat16 or __half");
    return __float2half_rn(v);
  }
}

__device__ __forceinline__ float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: return __half2float(static_cast<const __half*>(base)[i]);
  }
}

__device__ __forceinline__ void store_as(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = v; break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
  }
}

}  // namespace jax_nvfp4
