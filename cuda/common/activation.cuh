// An epilogue activation of a float32 value (or of a gate/up pair), with the formulas of
// jax_nvfp4.reference.activation.
// gelu's tanhf is CUDA's accurate function (2 ulp). silu's exponential and division are the fast
// hardware ones (__expf, __fdividef: within 3e-6 relative for |x| <= 20; past that silu(x) is x,
// or below 5e-8 in magnitude, and below -87 it gives -0), because the accurate pair cost the wide
// fused_ws epilogue, 128 values a thread, 18% of its GEMM time (H100, M = 256, 14336 x 4096: 65.6
// against 55.7 us for the plain call plus XLA's silu).
#pragma once

#include <type_traits>

#include "common/activation.h"

namespace jax_nvfp4 {

__device__ __forceinline__ float apply_activation(float v, Activation act) {
  switch (act) {
    case Activation::kRelu: return v < 0.f ? 0.f : v;  // NaN and -0 pass unchanged
    case Activation::kGelu: {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      return 0.5f * v * (1.f + tanhf(kSqrt2OverPi * (v + 0.044715f * (v * v * v))));
    }
    case Activation::kSilu: return __fdividef(v, 1.f + __expf(-v));
    default: return v;
  }
}

// A gated activation's output from its gate and up values (both after alpha and the bias).
__device__ __forceinline__ float apply_gated(float gate, float up, Activation act) {
  return apply_activation(gate, gate_activation(act)) * up;
}

// Calls f(std::integral_constant<Activation, A>{}) for the runtime activation act == A, so that
// an epilogue unrolled over many accumulators runs one activation's contiguous code, not every
// activation's behind a branch per element (H100: fused_ws's bf16 epilogue through its tile,
// M = 256, 14336 x 4096, 88.0 us of kernel time with the branches, 63.3 without).
template <typename F>
__device__ __forceinline__ void with_activation(Activation act, F&& f) {
  using A = Activation;
  switch (act) {
    case A::kRelu: f(std::integral_constant<A, A::kRelu>{}); break;
    case A::kGelu: f(std::integral_constant<A, A::kGelu>{}); break;
    case A::kSilu: f(std::integral_constant<A, A::kSilu>{}); break;
    case A::kSwiglu: f(std::integral_constant<A, A::kSwiglu>{}); break;
    case A::kGeglu: f(std::integral_constant<A, A::kGeglu>{}); break;
    default: f(std::integral_constant<A, A::kNone>{}); break;
  }
}

}  // namespace jax_nvfp4
