// sm_100a (Blackwell) quantize / dequantize: E2M1 rounding by cvt.rn.satfinite.e2m1x2.f32,
// which rounds to nearest even, saturates to +-6 and keeps the sign of zero, like the software
// rounding of the sm_90a build.
#include "quantize/quantize_kernels.cuh"

namespace jax_nvfp4 {
namespace {

struct HardwareE2m1 {
  // Packs the codes of y[0..7], element 2i in the low nibble of byte i. The instruction puts its
  // first source operand in the high nibble.
  __device__ __forceinline__ static uint32_t pack8(const float* y) {
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      uint16_t byte;
      asm("{\n .reg .b8 q;\n cvt.rn.satfinite.e2m1x2.f32 q, %1, %2;\n cvt.u16.u8 %0, q;\n}"
          : "=h"(byte)
          : "f"(y[2 * b + 1]), "f"(y[2 * b]));
      word |= static_cast<uint32_t>(byte) << (8 * b);
    }
    return word;
  }
};

}  // namespace

cudaError_t quantize_sm100(const QuantizeProblem& p, cudaStream_t stream) {
  return quantize_detail::launch_quantize<HardwareE2m1>(p, stream);
}

cudaError_t dequantize_sm100(const DequantizeProblem& p, cudaStream_t stream) {
  return quantize_detail::launch_dequantize(p, stream);
}

}  // namespace jax_nvfp4
