// The activation of the GEMM paths whose GEMM library's epilogue has none (the sm_90a prefill
// path, sm_100a): one elementwise pass over the GEMM's result that applies it and converts to the
// output dtype, in place or from a staged copy (a gated one halves the columns: it always reads a
// staged copy). Included by one launcher per architecture; internal linkage, so each
// architecture's object file has its own kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

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

// out[i] = act(y[2i], y[2i + 1]) for a gated act over `count` outputs: y [rows, 2 * cols]
// contiguous is the flat pair sequence of out [rows, cols]. A thread reads 16 bytes of pairs and
// writes the 8 bytes of their outputs per step, so a warp's loads and stores are contiguous.
template <typename T>
__global__ void gated_kernel(const T* y, T* out, int64_t count, Activation act) {
  constexpr int kPer = 8 / sizeof(T);  // outputs per step
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const uint4* pairs = reinterpret_cast<const uint4*>(y);
  uint2* outputs = reinterpret_cast<uint2*>(out);
  for (int64_t v = first; v < count / kPer; v += stride) {
    const uint4 in = pairs[v];
    const T* e = reinterpret_cast<const T*>(&in);
    uint2 raw;
    T* o = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      o[j] = from_float<T>(apply_gated(to_float(e[2 * j]), to_float(e[2 * j + 1]), act));
    }
    outputs[v] = raw;
  }
  for (int64_t i = count / kPer * kPer + first; i < count; i += stride) {
    out[i] = from_float<T>(apply_gated(to_float(y[2 * i]), to_float(y[2 * i + 1]), act));
  }
}

// out[r, c] (contiguous, out_dtype) = act(y[r, c]) (y_dtype, row pitch y_pitch), or with a gated
// act act(y[r, 2c], y[r, 2c + 1]): from a staged, padded float32 result into the output, or in
// place where the vector kernels cannot run (each element read and written by one thread).
__global__ void activation_copy_kernel(const void* y, DType y_dtype, int64_t rows, int64_t cols,
                                       int64_t y_pitch, void* out, DType out_dtype, Activation act) {
  const bool gated = is_gated(act);
  const int64_t out_cols = gated ? cols / 2 : cols, count = rows * out_cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / out_cols, c = i - r * out_cols;
    float v;
    if (gated) {
      const int64_t at = r * y_pitch + 2 * c;
      v = apply_gated(load_as_float(y, y_dtype, at), load_as_float(y, y_dtype, at + 1), act);
    } else {
      v = apply_activation(load_as_float(y, y_dtype, r * y_pitch + c), act);
    }
    store_as(out, out_dtype, i, v);
  }
}

// The activation over y [rows, cols] (pitch y_pitch) into out [rows, cols] (contiguous; a gated
// act: [rows, cols / 2]); out may be y itself (not gated, the same dtype, y_pitch == cols).
inline cudaError_t activation_pass(const void* y, DType y_dtype, int64_t rows, int64_t cols,
                                   int64_t y_pitch, void* out, DType out_dtype, Activation act,
                                   cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const auto grid = [](int64_t threads) {  // at most enough blocks to fill any GPU: loops do the rest
    return static_cast<unsigned>(std::min<int64_t>((threads + kThreads - 1) / kThreads, 8 * 132 * 8));
  };
  const bool gated = is_gated(act);
  const int64_t count = rows * (gated ? cols / 2 : cols);  // output elements
  // The vector kernels load 16 bytes and store 16 (gated: 8) from the buffers' starts: an element
  // of a stack run in turn may start off those boundaries (its offset is M * N * bytes).
  const auto aligned = [](const void* p, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  const bool vectorized = y_dtype == out_dtype && y_pitch == cols &&
                          (gated ? y != out : y == out) && aligned(y, 16) &&
                          aligned(out, gated ? 8 : 16);
  if (!vectorized) {
    activation_copy_kernel<<<grid(count), kThreads, 0, stream>>>(y, y_dtype, rows, cols, y_pitch,
                                                                 out, out_dtype, act);
    return cudaGetLastError();
  }
  // One thread per 16 bytes of output (gated: of input), at least one for the tail.
  const auto launch = [&](auto* typed_out) {
    using T = std::remove_pointer_t<decltype(typed_out)>;
    const unsigned blocks = grid(count / ((gated ? 8 : 16) / sizeof(T)) + 1);
    if (gated) {
      gated_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(y), typed_out, count, act);
    } else {
      activation_in_place_kernel<<<blocks, kThreads, 0, stream>>>(typed_out, count, act);
    }
  };
  switch (out_dtype) {
    case DType::kF32: launch(static_cast<float*>(out)); break;
    case DType::kBF16: launch(static_cast<__nv_bfloat16*>(out)); break;
    default: launch(static_cast<__half*>(out));
  }
  return cudaGetLastError();
}

}  // namespace
}  // namespace jax_nvfp4
