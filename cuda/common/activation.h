// The activations an epilogue can apply (the GEMM's GemmProblem::activation; the FFI attribute
// "activation" of jax_nvfp4_gemm carries these values). Host-compilable.
//
// The gated ones (GLU variants: swiglu = silu(gate) * up, geglu = gelu(gate) * up) read the
// weight's rows in interleaved pairs, row 2j the gate and row 2j+1 the up projection of output
// column j: the output has half the weight's N columns.
#pragma once

namespace jax_nvfp4 {

enum class Activation : int { kNone = 0, kRelu = 1, kGelu = 2, kSilu = 3, kSwiglu = 4, kGeglu = 5 };

constexpr bool is_gated(Activation act) {
  return act == Activation::kSwiglu || act == Activation::kGeglu;
}

// The activation a gated one applies to its gate.
constexpr Activation gate_activation(Activation act) {
  return act == Activation::kSwiglu ? Activation::kSilu
         : act == Activation::kGeglu ? Activation::kGelu
                                     : act;
}

}  // namespace jax_nvfp4
