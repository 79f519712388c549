// NVFP4 -> bf16x2 with a few integer ops, for the sm_90a GEMM kernels (host-testable).
//
// A 32-bit word holds 8 E2M1 codes (code i in bits 4i..4i+3). Pair j (0..3) of a word is the
// bf16x2 {code j (low half), code j+4 (high half)}: both sit at the same offset in their 16-bit
// halves, so one shift and mask place both magnitudes and another both signs.
//
// The 3 magnitude bits (e1 e0 m) go to bf16 bits 8..6: exponent field e, top mantissa bit m. For
// e >= 1 that is 2^(e-127) * (1 + m/2), for e == 0 the subnormal m/2 * 2^-126: in both cases the
// E2M1 value times 2^-126. Multiplying by the block scale times 2^119 (exact in bf16: E4M3 has 4
// significant bits and 448 * 2^119 < 2^128) gives e2m1 * e4m3 * 2^-7, exactly; kernels fold the
// 2^7 back into alpha. (bf16 arithmetic keeps subnormals on sm_80+; there is no .ftz for bf16.)
#pragma once

#include <cstdint>

#include "common/scale_layout.h"

namespace jax_nvfp4 {
namespace sm90 {

// Every dequantized NVFP4 value carries this factor (2^-7), undone in the epilogue.
constexpr float kDequantFactor = 1.0f / 128.0f;
// The block scale is widened to bf16 times 2^119 (see above).
constexpr float kScaleBoost = 6.64613997892457936451903530140172288e35f;  // 2^119

// Bits of the bf16x2 {code j, code j+4} of `word`, each the E2M1 value times 2^-126. The two
// nibbles are isolated, then one multiply lays down two copies, 6 bits apart, that do not
// overlap (so no carries): the first supplies the magnitude bits (8..6), the second the sign
// (bit 15); a mask keeps those. Pairs 2 and 3 are pairs 0 and 1 of the word shifted down by a
// byte. Three integer instructions per pair, one of them on the FMA pipe.
template <int J>
NVFP4_HD uint32_t e2m1_pair_bits(uint32_t word) {
  static_assert(J >= 0 && J < 4, "pair index");
  constexpr int kLow = J % 2;  // pair within the (shifted) low byte of each half
  const uint32_t w = J < 2 ? word : word >> 8;
  const uint32_t both = w & (0x000F000Fu << (4 * kLow));
  return (both * ((1u << (6 - 4 * kLow)) + (1u << (12 - 4 * kLow)))) & 0x81C081C0u;
}

// Order of the elements of the 4 pairs of a word: pair j holds elements j and j+4.
NVFP4_HD int pair_element(int j, int half) { return j + 4 * half; }

// Offset of block b's scale from block 0's within one row of the tiled layout
// (scale_offset(r, b, kb) == scale_offset(r, 0, kb) + row_scale_offset(b)).
NVFP4_HD int64_t row_scale_offset(int64_t b) {
  return (b / kTileKBlocks) * kTileBytes + b % kTileKBlocks;
}

// How far a row's scale pointer moves per K chunk of `chunk` elements (a multiple of 64).
NVFP4_HD constexpr int64_t row_scale_step(int64_t chunk) { return chunk / (kTileKBlocks * kBlockSize) * kTileBytes; }

}  // namespace sm90
}  // namespace jax_nvfp4
