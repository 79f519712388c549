// The sm_90a warp-specialized convolution kernel's launch for each filter width S it is compiled
// for (its tap loop is unrolled over S), one translation unit per S (conv_sm90_ws_s<S>.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "conv/conv_problem.h"
#include "conv/sm90/conv_sm90.h"

namespace jax_nvfp4 {
namespace conv90 {

// The filter widths S the warp-specialized kernel is compiled for.
constexpr bool ws_has_taps(int64_t s) { return s == 1 || s == 3 || s == 5 || s == 7; }

// Launches warp-specialized tiling `kernel` (one of the kWs* values) on `pb`, whose S is kS;
// cudaErrorInvalidValue, with nothing enqueued, when the tiling does not take the problem. With
// `plan`, fills it instead of launching (conv_sm90_ws_plan).
template <int kS>
cudaError_t launch_ws_taps(const ConvProblem& pb, cudaStream_t stream, ConvSm90Kernel kernel, int max_smem, int sms,
                           int splits, ConvSm90WsPlan* plan = nullptr);

}  // namespace conv90
}  // namespace jax_nvfp4
