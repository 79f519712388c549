// PRMT, the byte permute, on the device and (for host tests of kernels' bit manipulation) the host.
#pragma once

#include <cstdint>

#include "common/scale_layout.h"

namespace jax_nvfp4 {

// __byte_perm (PRMT): result byte i is byte (selector >> 4i) & 7 of the pair {b:a}.
NVFP4_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, selector);
#else
  const uint64_t pool = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    r |= static_cast<uint32_t>((pool >> (8 * ((selector >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  }
  return r;
#endif
}

}  // namespace jax_nvfp4
