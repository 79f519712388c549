// Decoding NVFP4 storage: E2M1 codes and E4M3 scales to float. Encoding (the quantizer's
// rounding) lives with the quantize kernels; every kernel that reads NVFP4 can use these.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/scale_layout.h"

namespace jax_nvfp4 {

NVFP4_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

NVFP4_HD float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// E2M1 (sign, 2 exponent bits with bias 1, 1 mantissa bit) to float, exactly:
// magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
NVFP4_HD float e2m1_to_float(uint32_t code) {
  const uint32_t exp = (code >> 1) & 3u, man = code & 1u;
  const float mag = exp == 0 ? 0.5f * static_cast<float>(man)
                             : static_cast<float>((2u + man) << (exp - 1)) * 0.5f;
  return (code & 8u) ? -mag : mag;
}

// E4M3 (float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN) to float, exactly.
NVFP4_HD float e4m3_to_float(uint32_t bits) {
  const uint32_t sign = (bits >> 7) & 1u, exp = (bits >> 3) & 0xFu, man = bits & 7u;
  float v;
  if (exp == 0xFu && man == 7u) {
    v = bits_to_float(0x7FC00000u);
  } else if (exp == 0) {
    v = static_cast<float>(man) * 0.001953125f;  // man * 2^-9: subnormal
  } else {
    v = bits_to_float(((exp + 120u) << 23) | (man << 20));  // rebias 7 -> 127
  }
  return sign ? -v : v;
}

}  // namespace jax_nvfp4
