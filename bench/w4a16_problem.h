// The GEMM kernel benchmarks' problem: bf16 activations x [m, k], NVFP4 weights [n, k] (codes,
// tiled scales, tensor scale s_dec), bf16 output y [m, n]; no bias, no workspace.
#pragma once

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
