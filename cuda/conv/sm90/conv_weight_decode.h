// E2M1 weight codes to bf16 with byte permutes, for the sm_90a conv kernels' register-A fragments
// (host-testable: tests/host/conv_sm90_weight_decode.cc runs it on the host).
#pragma once

#include <cstdint>

#include "common/byte_perm.h"
#include "common/scale_layout.h"

namespace jax_nvfp4 {
namespace conv90 {

// Four E2M1 codes (the low 16 bits of `x`: code i in bits 4i..4i+3) -> two bf16x2 words of their
// values, unscaled: codes 0, 1 give `w01`, codes 2, 3 give `w23` (the lower code in the low half).
// Two permutes look the four magnitudes up in 8-entry tables of the bf16 low and high bytes of 0,
// 0.5, 1, 1.5, 2, 3, 4, 6 (a selector reads 3 bits of each nibble: the sign bit is left out); the
// four sign bits go to bit 7 of the high bytes (the low bytes do not depend on the sign); two
// permutes interleave the bytes into halves. 8 instructions per 4 codes.
NVFP4_HD void decode_e2m1x4(uint32_t x, uint32_t& w01, uint32_t& w23) {
  constexpr uint32_t kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;  // low bytes of magnitudes 0-3, 4-7
  constexpr uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u;  // high bytes
  const uint32_t lo = byte_perm(kLo0, kLo1, x);
  // Bytes 0-3 of x << 4, x, x << 4, x (bytes 0, 0, 1, 1) hold codes 0-3's signs in bit 7.
  const uint32_t hi = byte_perm(kHi0, kHi1, x) | (byte_perm(x << 4, x, 0x5140u) & 0x80808080u);
  w01 = byte_perm(lo, hi, 0x5140u);
  w23 = byte_perm(lo, hi, 0x7362u);
}

}  // namespace conv90
}  // namespace jax_nvfp4
