// Encoding float32 to NVFP4 storage: the rounding steps of the quantization recipe
// (DESIGN.md §2). Host-callable so the software E2M1 rounding is tested exhaustively on the CPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/scale_layout.h"

namespace jax_nvfp4 {

constexpr float kE2m1Max = 6.0f;
constexpr float kE4m3Max = 448.0f;
constexpr uint32_t kE4m3NanBits = 0x7Fu;

NVFP4_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

NVFP4_HD float bits_as_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// E2M1 code of float `y`, rounded to nearest with ties to even and saturated at +-6 (the
// semantics of cvt.rn.satfinite.e2m1x2.f32 and of XLA's convert). The sign of a value that
// rounds to zero is kept (-0.1 -> 0x8). `y` must not be NaN.
//
// E2M1's grid has spacing 0.5 below 2, 1 in [2, 4) and 2 in [4, 6]. Adding the magic number
// M = spacing * 2^23 to |y| makes one float32 ulp equal that spacing, so the FPU's own
// round-to-nearest-even rounds |y| onto the grid; bits(|y| + M) - bits(M) counts grid steps.
// M's exponent is |y|'s exponent (at least that of 1.0) plus 22, and the step count becomes a
// code by adding 2 per binade above [1, 2): codes 4, 6 start the binades [2, 4) and [4, 6].
NVFP4_HD uint32_t e2m1_encode_software(float y) {
  const float mag = fminf(fabsf(y), kE2m1Max);
  const uint32_t exp_bits = float_to_bits(mag) & 0x7F800000u;
  const uint32_t magic = (exp_bits > 0x3F800000u ? exp_bits : 0x3F800000u) + (22u << 23);
  const uint32_t steps = float_to_bits(mag + bits_as_float(magic)) - magic;
  const uint32_t binade_offset = ((magic >> 23) - (127u + 22u)) * 2u;
  return (steps + binade_offset) | ((float_to_bits(y) >> 28) & 8u);
}

}  // namespace jax_nvfp4
