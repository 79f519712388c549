// The weight-code order of the fused_ws kernels, whose activations keep x's own K order (a TMA
// copy of bf16 x, no staging pass; host-testable: tests/host/gemm_sm90_natural_k.cc).
//
// wgmma takes k slot i of a k-step from B's column 16 s + i, so a consumer thread t, whose A
// registers hold slots 2t, 2t + 1, 2t + 8, 2t + 9 of every k-step, must find those elements'
// codes where its decoding reads them: word q of its 16 bytes, pair j (codes j and j + 4,
// nvfp4_bf16x2.h) as k-step 2q + j / 2, register j % 2 (slots + 8 j % 2). So nibble n of the
// stored word 4t + q is element 32q + 16 (n % 4 / 2) + 2t + 8 (n % 2) + n / 4 of the row's chunk,
// and k-step 2q + h is that chunk's 16-element block 2q + h.
#pragma once

#include <cstdint>

#include "common/byte_perm.h"
#include "common/scale_layout.h"

namespace jax_nvfp4 {
namespace sm90 {

// The chunk element (0..127) that nibble n of stored word w (= 4t + q) decodes as.
NVFP4_HD constexpr int natural_k_element(int w, int n) {
  return 32 * (w % 4) + 16 * (n % 4 / 2) + 2 * (w / 4) + 8 * (n % 2) + n / 4;
}

// One weight row's chunk of 128 codes: `natural` as stored in the matrix (code e in nibble e % 8
// of word e / 8), `stored` in the order above. Words 4q .. 4q + 3 feed stored words q, 4 + q,
// 8 + q, 12 + q: byte t of each of the four, nibbles regrouped (16 integer ops per 4 words).
NVFP4_HD void natural_k_codes(const uint32_t (&natural)[16], uint32_t (&stored)[16]) {
  constexpr uint32_t kLo = 0x0F0F0F0Fu;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t n0 = natural[4 * q], n1 = natural[4 * q + 1], n2 = natural[4 * q + 2], n3 = natural[4 * q + 3];
    // Byte t of: a, the low codes of n0 and n1; b, of n2 and n3; c and d, their high codes.
    const uint32_t a = (n0 & kLo) | ((n1 << 4) & ~kLo);
    const uint32_t b = (n2 & kLo) | ((n3 << 4) & ~kLo);
    const uint32_t c = ((n0 >> 4) & kLo) | (n1 & ~kLo);
    const uint32_t d = ((n2 >> 4) & kLo) | (n3 & ~kLo);
    const uint32_t ab01 = byte_perm(a, b, 0x5140u), ab23 = byte_perm(a, b, 0x7362u);
    const uint32_t cd01 = byte_perm(c, d, 0x5140u), cd23 = byte_perm(c, d, 0x7362u);
    stored[q] = byte_perm(ab01, cd01, 0x5410u);  // bytes 0 of a, b, c, d
    stored[4 + q] = byte_perm(ab01, cd01, 0x7632u);
    stored[8 + q] = byte_perm(ab23, cd23, 0x5410u);
    stored[12 + q] = byte_perm(ab23, cd23, 0x7632u);
  }
}

}  // namespace sm90
}  // namespace jax_nvfp4
