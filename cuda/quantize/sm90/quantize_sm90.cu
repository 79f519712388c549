// sm_90a (Hopper) quantize / dequantize: E2M1 rounding in software (Hopper has no FP4 convert).
#include "quantize/quantize_kernels.cuh"

namespace jax_nvfp4 {
namespace {

struct SoftwareE2m1 {
  // Packs the codes of y[0..7], element 2i in the low nibble of byte i.
  __device__ __forceinline__ static uint32_t pack8(const float* y) {
    return e2m1_pack8_software(y);
  }
};

}  // namespace

cudaError_t quantize_sm90(const QuantizeProblem& p, cudaStream_t stream) {
  return quantize_detail::launch_quantize<SoftwareE2m1>(p, stream);
}

cudaError_t dequantize_sm90(const DequantizeProblem& p, cudaStream_t stream) {
  return quantize_detail::launch_dequantize(p, stream);
}

}  // namespace jax_nvfp4
