// Small device helpers around the CUTLASS kernel: copies that pad or unpad matrices (and convert
// their element type) and the epilogue scalars. Host-callable launchers, no CUTLASS.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jax_nvfp4 {
namespace sm100 {

enum class Elem : int { kU8 = 0, kF32 = 1, kBF16 = 2, kF16 = 3 };

// A row-major matrix view: rows x cols elements, rows `pitch` elements apart.
struct MatrixRef {
  const void* data = nullptr;
  Elem elem = Elem::kU8;
  int64_t rows = 0, cols = 0, pitch = 0;
};

// dst[r, c] = src[r, c] converted to dst's element type for r < src.rows and c < src.cols,
// zero elsewhere, over dst's rows x cols. Supported: same type (any), and f32 <-> f16 / bf16.
cudaError_t copy_matrix(const MatrixRef& src, const MatrixRef& dst, cudaStream_t stream);

// alpha = a_s_dec * b_s_dec (skipped when alpha is null); out_s_dec = 1 / out_s_enc when
// out_s_enc is given.
cudaError_t epilogue_scalars(const float* a_s_dec, const float* b_s_dec, float* alpha,
                             const float* out_s_enc, float* out_s_dec, cudaStream_t stream);

}  // namespace sm100
}  // namespace jax_nvfp4
