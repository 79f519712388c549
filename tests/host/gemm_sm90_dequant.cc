// Host check of the sm_90a GEMM's NVFP4 -> bf16 dequantization (gemm/sm90/nvfp4_bf16x2.h):
// for every E2M1 code in every position of a word and every finite E4M3 scale, the bf16 bits
// built by e2m1_pair_bits times the widened scale must be e2m1 * e4m3 * 2^-7, and that product
// must be exactly representable in bf16 (so the kernel's bf16 multiply is exact). Also checks the
// kernels' scale pointer arithmetic against scale_offset: the per-row block offset of the
// dequantize pass and the decode cursor's step per 128-element chunk.
// Prints "checked <count>" and "layout ok", or the first mismatch.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "common/nvfp4_decode.cuh"
#include "gemm/sm90/nvfp4_bf16x2.h"

using namespace jax_nvfp4;

static float bf16_bits_to_float(uint32_t bits16) { return bits_to_float(bits16 << 16); }

static bool is_bf16(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return (b & 0xFFFFu) == 0;
}

template <int J>
static uint32_t pair(uint32_t word) { return sm90::e2m1_pair_bits<J>(word); }

int main() {
  long checked = 0;
  for (uint32_t scale = 0; scale < 256; ++scale) {
    const float s = e4m3_to_float(scale);
    if (std::isnan(s)) continue;
    const float widened = s * sm90::kScaleBoost;
    if (!is_bf16(widened) || std::isinf(widened)) {
      std::printf("scale 0x%02x widens to %g, not a finite bf16\n", scale, widened);
      return 1;
    }
    for (uint32_t code = 0; code < 16; ++code) {
      for (int pos = 0; pos < 8; ++pos) {
        // The code at element `pos`, distinct junk codes elsewhere.
        uint32_t word = 0;
        for (int e = 0; e < 8; ++e) word |= (e == pos ? code : (code + 5u * e + 3u) & 0xFu) << (4 * e);
        const int j = pos % 4, half = pos / 4;
        uint32_t bits = 0;
        switch (j) {
          case 0: bits = pair<0>(word); break;
          case 1: bits = pair<1>(word); break;
          case 2: bits = pair<2>(word); break;
          default: bits = pair<3>(word); break;
        }
        if (sm90::pair_element(j, half) != pos) return 2;
        const float unscaled = bf16_bits_to_float((bits >> (16 * half)) & 0xFFFFu);
        const double got = static_cast<double>(unscaled) * static_cast<double>(widened);
        const double want = static_cast<double>(e2m1_to_float(code)) * s * sm90::kDequantFactor;
        if (got != want || !is_bf16(static_cast<float>(want))) {
          std::printf("mismatch: code %u at %d, scale 0x%02x: got %.9g want %.9g\n", code, pos,
                      scale, got, want);
          return 1;
        }
        ++checked;
      }
    }
  }
  std::printf("checked %ld\n", checked);

  for (int64_t kb : {1, 3, 4, 5, 8, 64, 257, 896}) {
    for (int64_t r : {0, 1, 31, 32, 127, 128, 129, 300, 14335}) {
      for (int64_t b = 0; b < kb; ++b) {
        if (scale_offset(r, 0, kb) + sm90::row_scale_offset(b) != scale_offset(r, b, kb)) {
          std::printf("row offset: r %ld b %ld kb %ld\n", (long)r, (long)b, (long)kb);
          return 1;
        }
        // Decode: a lane's first block is even (e0 = chunk*128 + 32t), one chunk = 8 blocks.
        if (b % 2 == 0 && b + 8 < kb &&
            scale_offset(r, b + 8, kb) - scale_offset(r, b, kb) != sm90::row_scale_step(128)) {
          std::printf("chunk step: r %ld b %ld kb %ld\n", (long)r, (long)b, (long)kb);
          return 1;
        }
      }
    }
  }
  std::printf("layout ok\n");
  return 0;
}
