// Encoding float32 to NVFP4 storage: the rounding steps of the quantization recipe
// (DESIGN.md §2). Host-callable so the software E2M1 rounding is tested exhaustively on the CPU.
#pragma once

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
NVFP4_HD uint32_t e2m1_encode_software(float y) {
  const uint32_t bits = float_to_bits(y);
  uint32_t mag = bits & 0x7FFFFFFFu;
  mag = mag < 0x40C00000u ? mag : 0x40C00000u;  // |y| saturated at 6.0 (Inf included)
  // |y| >= 1, E2M1's normals: round the float32 mantissa to one bit, to nearest even, in
  // integers; the exponent then carries into place. 1.0 (bits 0x3F800000) has code 2.
  const uint32_t rounded = mag + 0x1FFFFFu + ((mag >> 22) & 1u);
  const uint32_t normal = (rounded >> 22) - 0xFCu;
  // |y| < 1, multiples of 0.5: in 2^22 + |y| one ulp is 0.5, so the float addition rounds
  // |y| to nearest even and leaves the code (0, 1, or 2 for a round-up to 1.0) in the low bits.
  const uint32_t subnormal = float_to_bits(bits_as_float(mag) + 4194304.0f) - 0x4A800000u;
  return (mag >= 0x3F800000u ? normal : subnormal) | ((bits >> 28) & 8u);
}

}  // namespace jax_nvfp4
