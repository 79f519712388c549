// The GEMM kernel benchmarks' problem: bf16 activations x [m, k], NVFP4 weights [n, k] (codes,
// tiled scales, tensor scale s_dec), bf16 output y [m, n]; no bias, no workspace. Also the
// weight shapes they time and how many weight copies they rotate through.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "gemm/gemm_problem.h"

inline jax_nvfp4::GemmProblem w4a16_problem(int64_t m, int64_t n, int64_t k, const void* x, const uint8_t* codes,
                                            const uint8_t* scales, const float* s_dec, void* y) {
  jax_nvfp4::GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = x;
  p.a_dtype = jax_nvfp4::DType::kBF16;
  p.b.codes = codes;
  p.b.scales = scales;
  p.b.s_dec = s_dec;
  p.out = y;
  p.out_dtype = jax_nvfp4::DType::kBF16;
  return p;
}

// Llama-3-8B projections (N, K), as in bench/bench_matmul.py.
constexpr int64_t kLlamaShapes[][2] = {{14336, 4096}, {4096, 14336}, {4096, 4096}, {6144, 4096}};

// Weights rotate through copies larger than the L2 together (> 5x the 60 MB), so each call reads
// its weights from HBM: the number of copies of `bytes` that takes (at least 2).
constexpr size_t kRotateBytes = size_t{320} << 20;
inline int rotation_copies(size_t bytes) {
  return static_cast<int>(std::max<size_t>(2, (kRotateBytes + bytes - 1) / bytes));
}
