// Element types the kernels take for float operands and outputs.
#pragma once

namespace jax_nvfp4 {

enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

constexpr int dtype_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

}  // namespace jax_nvfp4
