// The activation of the GEMM paths whose GEMM library's epilogue has none (the sm_90a prefill
// path, sm_100a): one elementwise pass over the GEMM's result that applies it and converts to the
// output dtype, in place or from a staged copy. Included by one launcher per architecture;
// internal linkage, so each architecture's object file has its own kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/activation.cuh"
#include "common/dtype_io.cuh"

namespace jax_nvfp4 {
namespace {

// y[i] = act(y[i]) over `count` contiguous elements of T (16-byte aligned), 16 bytes per thread
// and step: the sm_90a prefill path's output in place, at the speed of its bytes.
template <typename T>
__global__ void activation_in_place_kernel(T* y, int64_t count, Activation act) {
  constexpr int kPer = 16 / sizeof(T);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  uint4* vectors = reinterpret_cast<uint4*>(y);
  for (int64_t v = first; v < count / kPer; v += stride) {
    uint4 raw = vectors[v];
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < kPer; ++j) e[j] = from_float<T>(apply_activation(to_float(e[j]), act));
    vectors[v] = raw;
  }
  for (int64_t i = count / kPer * kPer + first; i < count; i += stride) {
    y[i] = from_float<T>(apply_activation(to_float(y[i]), act));
  }
}

// out[r, c] (row pitch cols, out_dtype) = act(y[r, c]) (y_dtype, row pitch y_pitch): from a
// staged, padded float32 result into the output.
__global__ void activation_copy_kernel(const void* y, DType y_dtype, int64_t rows, int64_t cols,
                                       int64_t y_pitch, void* out, DType out_dtype, Activation act) {
  const int64_t count = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    store_as(out, out_dtype, i, apply_activation(load_as_float(y, y_dtype, r * y_pitch + c), act));
  }
}

// The activation over y [rows, cols] (pitch y_pitch) into out [rows, cols] (contiguous); out may be
// y itself (the same dtype, y_pitch == cols).
inline cudaError_t activation_pass(const void* y, DType y_dtype, int64_t rows, int64_t cols,
                                   int64_t y_pitch, void* out, DType out_dtype, Activation act,
                                   cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const auto grid = [](int64_t threads) {  // at most enough blocks to fill any GPU: loops do the rest
    return static_cast<unsigned>(std::min<int64_t>((threads + kThreads - 1) / kThreads, 8 * 132 * 8));
  };
  const int64_t count = rows * cols;
  if (y == out && y_dtype == out_dtype && y_pitch == cols) {
    switch (out_dtype) {  // threads: one per 16 bytes, at least one for the tail
      case DType::kF32:
        activation_in_place_kernel<<<grid(count / 4 + 1), kThreads, 0, stream>>>(
            static_cast<float*>(out), count, act);
        break;
      case DType::kBF16:
        activation_in_place_kernel<<<grid(count / 8 + 1), kThreads, 0, stream>>>(
            static_cast<__nv_bfloat16*>(out), count, act);
        break;
      default:
        activation_in_place_kernel<<<grid(count / 8 + 1), kThreads, 0, stream>>>(
            static_cast<__half*>(out), count, act);
    }
  } else {
    activation_copy_kernel<<<grid(count), kThreads, 0, stream>>>(y, y_dtype, rows, cols, y_pitch,
                                                                 out, out_dtype, act);
  }
  return cudaGetLastError();
}

}  // namespace
}  // namespace jax_nvfp4
