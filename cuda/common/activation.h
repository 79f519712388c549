// The activations an epilogue can apply (the GEMM's GemmProblem::activation; the FFI attribute
// "activation" of jax_nvfp4_gemm carries these values). Host-compilable.
#pragma once

namespace jax_nvfp4 {

enum class Activation : int { kNone = 0, kRelu = 1, kGelu = 2, kSilu = 3 };

}  // namespace jax_nvfp4
