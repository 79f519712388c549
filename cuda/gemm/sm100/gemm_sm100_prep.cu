// Pad/unpad copies and epilogue scalars of the sm_100a GEMM (see gemm_sm100_prep.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "common/dtype_io.cuh"
#include "gemm/sm100/gemm_sm100_prep.h"

namespace jax_nvfp4 {
namespace sm100 {
namespace {

template <class Dst, class Src>
__device__ __forceinline__ Dst convert(Src x) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return x;
  } else {
    return from_float<Dst>(to_float(x));
  }
}

template <class Src, class Dst>
__global__ void copy_matrix_kernel(const Src* src, int64_t src_rows, int64_t src_cols,
                                   int64_t src_pitch, Dst* dst, int64_t dst_rows,
                                   int64_t dst_cols, int64_t dst_pitch) {
  const int64_t total = dst_rows * dst_cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / dst_cols, c = i % dst_cols;
    dst[r * dst_pitch + c] =
        (r < src_rows && c < src_cols) ? convert<Dst>(src[r * src_pitch + c]) : Dst(0.0f);
  }
}

template <class Src, class Dst>
cudaError_t launch_copy(const MatrixRef& s, const MatrixRef& d, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t total = d.rows * d.cols;
  if (total == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
  copy_matrix_kernel<Src, Dst><<<blocks, kThreads, 0, stream>>>(
      static_cast<const Src*>(s.data), s.rows, s.cols, s.pitch,
      static_cast<Dst*>(const_cast<void*>(d.data)), d.rows, d.cols, d.pitch);
  return cudaGetLastError();
}

template <class Src>
cudaError_t launch_copy_from(const MatrixRef& s, const MatrixRef& d, cudaStream_t stream) {
  switch (d.elem) {
    case Elem::kF32: return launch_copy<Src, float>(s, d, stream);
    case Elem::kBF16: return launch_copy<Src, __nv_bfloat16>(s, d, stream);
    case Elem::kF16: return launch_copy<Src, __half>(s, d, stream);
    default: return cudaErrorInvalidValue;
  }
}

__global__ void epilogue_scalars_kernel(const float* a_s_dec, const float* b_s_dec, float* alpha,
                                        const float* out_s_enc, float* out_s_dec) {
  if (alpha != nullptr) *alpha = *a_s_dec * *b_s_dec;
  if (out_s_enc != nullptr) *out_s_dec = 1.0f / *out_s_enc;
}

}  // namespace

cudaError_t copy_matrix(const MatrixRef& src, const MatrixRef& dst, cudaStream_t stream) {
  if (src.elem == Elem::kU8 || dst.elem == Elem::kU8) {
    if (src.elem != dst.elem) return cudaErrorInvalidValue;
    return launch_copy<uint8_t, uint8_t>(src, dst, stream);
  }
  switch (src.elem) {
    case Elem::kF32: return launch_copy_from<float>(src, dst, stream);
    case Elem::kBF16: return launch_copy_from<__nv_bfloat16>(src, dst, stream);
    case Elem::kF16: return launch_copy_from<__half>(src, dst, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t epilogue_scalars(const float* a_s_dec, const float* b_s_dec, float* alpha,
                             const float* out_s_enc, float* out_s_dec, cudaStream_t stream) {
  epilogue_scalars_kernel<<<1, 1, 0, stream>>>(a_s_dec, b_s_dec, alpha, out_s_enc, out_s_dec);
  return cudaGetLastError();
}

}  // namespace sm100
}  // namespace jax_nvfp4
