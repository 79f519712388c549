// Encoding float32 to NVFP4 storage: the rounding steps of the quantization recipe
// (DESIGN.md §2). Host-callable so the software E2M1 rounding is tested exhaustively on the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/byte_perm.h"
#include "common/nvfp4_decode.cuh"
#include "common/scale_layout.h"

namespace jax_nvfp4 {

constexpr float kE2m1Max = 6.0f;
constexpr float kE4m3Max = 448.0f;
constexpr uint32_t kE4m3NanBits = 0x7Fu;

// Float bits whose low byte is the E2M1 code of |y| (0..7), rounded to nearest with ties to even
// and saturated at 6 (the semantics of cvt.rn.satfinite.e2m1x2.f32 and of XLA's convert).
//
// E2M1's grid has spacing 0.5 below 2, 1 in [2, 4) and 2 in [4, 6]. Adding a magic number M
// whose float32 ulp equals that spacing lets the FPU's own round-to-nearest-even round |y| onto
// the grid, leaving the number of grid steps in the low bits of |y| + M. M's exponent is |y|'s
// (at least that of 1.0) plus 22; its low mantissa bits hold the code where the binade starts
// past 2 steps (0 for [0, 2), 2 for [2, 4): 2.0 is code 4, 4 for [4, 6]: 4.0 is code 6). They
// are even, so ties still go to even codes.
NVFP4_HD uint32_t e2m1_magnitude_bits(float y) {
  const float mag = fminf(fabsf(y), kE2m1Max);
  uint32_t exp_bits = float_to_bits(mag) & 0x7F800000u;
  exp_bits = exp_bits > 0x3F800000u ? exp_bits : 0x3F800000u;
  const uint32_t magic = exp_bits + (22u << 23) + (exp_bits >> 22) - 254u;
  return float_to_bits(mag + bits_to_float(magic));
}

// E2M1 code (sign bit 0x8) of float `y`; the sign of a value that rounds to zero is kept
// (-0.1 -> 0x8). `y` must not be NaN.
NVFP4_HD uint32_t e2m1_encode_software(float y) {
  return (e2m1_magnitude_bits(y) & 0x7u) | ((float_to_bits(y) >> 28) & 8u);
}

// The codes of y[0..7] packed into a word, element 2i in the low nibble of byte i. The low
// bytes of the magnitude bits and the top bytes (signs) of the inputs are gathered with byte
// permutes, four at a time, instead of being shifted into place one by one.
NVFP4_HD uint32_t e2m1_pack8_software(const float* y) {
  uint32_t m[8], s[8];
  for (int e = 0; e < 8; ++e) {
    m[e] = e2m1_magnitude_bits(y[e]);
    s[e] = float_to_bits(y[e]);
  }
  // byte i of gather(w, o) is the low byte (o = 0) or top byte (o = 3) of w[2i] (bytes 0..3).
  auto gather = [](const uint32_t* w, uint32_t o) {
    const uint32_t pick = o | ((o + 4u) << 4);  // byte o of the first and of the second word
    return byte_perm(byte_perm(w[0], w[2], pick), byte_perm(w[4], w[6], pick), 0x5410u);
  };
  const uint32_t codes = gather(m, 0) | (gather(m + 1, 0) << 4);
  const uint32_t signs = ((gather(s, 3) >> 4) & 0x08080808u) | (gather(s + 1, 3) & 0x80808080u);
  return codes | signs;
}

}  // namespace jax_nvfp4
