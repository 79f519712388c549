// Host check of the sm_90a conv kernels' E2M1 weight decode (conv/sm90/conv_weight_decode.h, run
// with the header's host model of prmt): for all 65536 values of the 4 codes it reads, the two
// bf16x2 words must hold exactly the E2M1 values of codes 0, 1 and 2, 3, signs of zeros included,
// whatever the upper 16 bits of the input hold.
// Prints "checked <count>", or the first mismatch.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common/nvfp4_decode.cuh"
#include "conv/sm90/conv_weight_decode.h"

using namespace jax_nvfp4;

// The bf16 bits of an E2M1 value (exact: at most 2 significant bits).
static uint32_t bf16_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b >> 16;
}

int main() {
  long checked = 0;
  for (uint32_t low = 0; low < 0x10000u; ++low) {
    const uint32_t x = low | ((low * 0x9E37u) << 16);  // junk above the 4 codes
    uint32_t w[2];
    conv90::decode_e2m1x4(x, w[0], w[1]);
    for (int i = 0; i < 4; ++i) {
      const uint32_t got = (w[i / 2] >> (16 * (i % 2))) & 0xFFFFu;
      const uint32_t want = bf16_bits(e2m1_to_float((low >> (4 * i)) & 0xFu));
      if (got != want) {
        std::printf("x %08x code %d: got %04x want %04x\n", x, i, got, want);
        return 1;
      }
      ++checked;
    }
  }
  std::printf("checked %ld\n", checked);
  return 0;
}
