// The sm_90a warp-specialized convolution kernel for filters 5 taps wide (conv_sm90_ws.h).
#include "conv/sm90/conv_sm90_ws_launch.cuh"

namespace jax_nvfp4 {
namespace conv90 {

template cudaError_t launch_ws_taps<5>(const ConvProblem&, cudaStream_t, ConvSm90Kernel, int, int, int,
                                          ConvSm90WsPlan*);

}  // namespace conv90
}  // namespace jax_nvfp4
