// Division by a run-time constant with a multiply and a shift (Granlund & Montgomery, 1994), the
// divisor's constants computed once on the host: the quantize kernels turn a half-tile index into
// (matrix, row tile, k tile) once per block of 16 elements, where the hardware's integer division
// sequence would cost as much as the block; the convolution's warp-specialized kernel splits
// pixel and tile indices with it on the serial paths of one thread (its producer's set-up).
#pragma once

#include <cstdint>

#include "common/scale_layout.h"

namespace jax_nvfp4 {

NVFP4_HD uint32_t mul_high(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// n / divisor for 0 <= n < 2^31 and 1 <= divisor < 2^31.
struct FastDivide {
  uint32_t divisor = 1, multiplier = 1, shift = 0;

  NVFP4_HD static FastDivide by(uint32_t d) {
    FastDivide f;
    f.divisor = d;
    while ((uint64_t{1} << f.shift) < d) ++f.shift;
    // multiplier = floor(2^32 * (2^shift - d) / d) + 1: then n/d = (mulhi(n, m) + n) >> shift.
    const uint64_t excess = (uint64_t{1} << f.shift) - d;
    f.multiplier = static_cast<uint32_t>((excess << 32) / d + 1);
    return f;
  }

  NVFP4_HD uint32_t quotient(uint32_t n) const { return (mul_high(n, multiplier) + n) >> shift; }
};

}  // namespace jax_nvfp4
