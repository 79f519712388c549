// Epilogue staging shared by the sm_90a kernels whose accumulator rows are output columns (the
// weights are wgmma's M, the activation rows or pixels its N): stmatrix transposes a warpgroup's
// scaled accumulators into a shared-memory tile whose rows are output rows, so that every 8
// output columns of a row leave with one 16-byte store instead of 8 scattered 2-byte ones.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/activation.cuh"
#include "common/bf16x2.cuh"
#include "cute/arch/copy_sm90.hpp"

namespace jax_nvfp4 {

// Two floats as the 2-byte output type T (bf16 or f16), a in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "2-byte output");
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    return pack_bf16x2(a, b);
  }
}

// acc: this thread's accumulators of a wgmma m64nN fragment from column group j0 on (acc[4j..4j+3]
// are rows r, r + 8 x columns 8j + 2t, 8j + 2t + 1 of group j0 + j, r = 16 * warp + lane / 4).
// Writes act(alpha * acc + bias) (bias[0] for row r, bias[1] for r + 8) of kGroups column groups as T
// into `tile`, transposed: column 8j + c becomes tile row 8j + c, and accumulator row r lands at
// element `rows` + r % 16 of it (`rows`: where this warp's 16 rows start in a tile row; `pitch`:
// elements per tile row, a pad of 8 puts a matrix's 8 rows on distinct banks).
template <typename T, int kGroups>
__device__ __forceinline__ void stmatrix_transposed(const float* acc, float alpha, const float (&bias)[2], T* tile,
                                                    int pitch, int rows, int lane,
                                                    Activation act = Activation::kNone) {
  static_assert(kGroups % 2 == 0, "one stmatrix.x4 per two column groups");
  // Matrix q of an x4 is (group j + q / 2, row half q % 2); lane l addresses row l % 8 of matrix l / 8.
  const int m = lane / 8;
  T* row_dst = tile + (8 * (m / 2) + lane % 8) * pitch + rows + 8 * (m % 2);
#pragma unroll
  for (int j = 0; j < kGroups; j += 2) {
    uint32_t frag[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int a = (j + q / 2) * 4 + 2 * (q % 2);
      frag[q] = pack2<T>(apply_activation(acc[a] * alpha + bias[q % 2], act),
                         apply_activation(acc[a + 1] * alpha + bias[q % 2], act));
    }
    cute::SM90_U16x8_STSM_T::copy(frag[0], frag[1], frag[2], frag[3],
                                  *reinterpret_cast<cute::uint128_t*>(row_dst + 8 * j * pitch));
  }
}

}  // namespace jax_nvfp4
