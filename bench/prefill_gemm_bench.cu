// Times configurations of the prefill path's CUTLASS wgmma GEMM (cuda/gemm/sm90/wgmma_gemm.cuh)
// on the device without JAX, to choose the library's tile, cluster and scheduler.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -I cuda
//        -DVARIANT=n -o prefill_gemm_bench_n bench/prefill_gemm_bench.cu cuda/gemm/sm90/sm_count.cu
//   ./prefill_gemm_bench_n
//
// One configuration per binary (VARIANT, below), so they compile in parallel. Each shape runs
// with max_swizzle_size 1 and 4; bf16 operands with random values, bf16 output; a few output
// elements are checked against a float64 host dot product. Prints one table row per shape.
#ifndef NDEBUG
#define NDEBUG  // see wgmma_gemm_bf16.cu: device asserts would serialize the wgmma pipeline
#endif
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "event_timing.h"
#include "gemm/sm90/wgmma_gemm.cuh"


using namespace jax_nvfp4::sm90;
using cutlass::gemm::PersistentScheduler;
using cutlass::gemm::StreamKScheduler;

#ifndef VARIANT
#define VARIANT 0
#endif
#if VARIANT == 0
using Config = WgmmaGemm<cutlass::bfloat16_t, Shape<_128, _256, _64>, Shape<_1, _1, _1>>;
static const char* kName = "128x256 c1x1 streamK";
#elif VARIANT == 1
using Config = WgmmaGemm<cutlass::bfloat16_t, Shape<_128, _256, _64>, Shape<_2, _1, _1>>;
static const char* kName = "128x256 c2x1 streamK";
#elif VARIANT == 2
using Config = WgmmaGemm<cutlass::bfloat16_t, Shape<_128, _256, _64>, Shape<_1, _2, _1>>;
static const char* kName = "128x256 c1x2 streamK";
#elif VARIANT == 3
using Config =
    WgmmaGemm<cutlass::bfloat16_t, Shape<_128, _256, _64>, Shape<_2, _1, _1>, PersistentScheduler>;
static const char* kName = "128x256 c2x1 persistent";
#elif VARIANT == 4
using Config = WgmmaGemm<cutlass::bfloat16_t>;  // the library's: 256x128, cluster 1x2, stream-K
static const char* kName = "256x128 c1x2 streamK";
#endif

int main() {
  struct Shape3 { int m, n, k; };
  const Shape3 shapes[] = {{256, 14336, 4096}, {1024, 14336, 4096}, {4096, 14336, 4096},
                           {8192, 14336, 4096}, {256, 4096, 4096},   {4096, 4096, 4096},
                           {4096, 4096, 14336}, {8192, 6144, 4096}};
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, variant %s\n", prop.name, kName);
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));

  for (const Shape3& s : shapes) {
    std::vector<__nv_bfloat16> a(size_t(s.m) * s.k), b(size_t(s.n) * s.k);
    for (auto& v : a) v = __float2bfloat16(normal(rng));
    for (auto& v : b) v = __float2bfloat16(normal(rng) * 0.05f);
    void *da, *db, *dd, *ws = nullptr;
    float *alpha, *bias;
    CUDA_CHECK(cudaMalloc(&da, a.size() * 2));
    CUDA_CHECK(cudaMalloc(&db, b.size() * 2));
    CUDA_CHECK(cudaMalloc(&dd, size_t(s.m) * s.n * 2));
    CUDA_CHECK(cudaMalloc(&alpha, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&bias, size_t(s.n) * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    const float one = 1.f;
    CUDA_CHECK(cudaMemcpy(alpha, &one, sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(bias, 0, size_t(s.n) * sizeof(float)));
    const size_t ws_bytes = Config::workspace_bytes(s.m, s.n, s.k);
    if (ws_bytes) CUDA_CHECK(cudaMalloc(&ws, ws_bytes));

    std::printf("| %s | %d | %d | %d |", kName, s.m, s.n, s.k);
    for (int swizzle : {1, 4}) {
      auto call = [&] {
        CUDA_CHECK(Config::run(s.m, s.n, s.k, da, db, dd, alpha, bias, ws, stream, swizzle));
      };
      for (int i = 0; i < 3; ++i) call();
      const double us = median_us_per_call(stream, 5, 20, [&](int) { call(); });
      std::printf(" %.1f us %.0f TF/s |", us, 2.0 * s.m * s.n * s.k / us * 1e-6);
    }
    // A few outputs against a float64 dot product of the same bf16 operands.
    std::vector<__nv_bfloat16> d(size_t(s.m) * s.n);
    CUDA_CHECK(cudaMemcpy(d.data(), dd, d.size() * 2, cudaMemcpyDeviceToHost));
    double worst = 0.0;
    for (int t = 0; t < 64; ++t) {
      const int i = int(rng() % s.m), j = int(rng() % s.n);
      double want = 0.0, scale = 0.0;
      for (int q = 0; q < s.k; ++q) {
        const double p = double(__bfloat162float(a[size_t(i) * s.k + q])) *
                         double(__bfloat162float(b[size_t(j) * s.k + q]));
        want += p;
        scale += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(double(__bfloat162float(d[size_t(i) * s.n + j])) - want) / scale);
    }
    std::printf(" err %.1e%s\n", worst, worst < 1e-2 ? "" : " FAIL");
    CUDA_CHECK(cudaFree(da));
    CUDA_CHECK(cudaFree(db));
    CUDA_CHECK(cudaFree(dd));
    CUDA_CHECK(cudaFree(alpha));
    CUDA_CHECK(cudaFree(bias));
    if (ws) CUDA_CHECK(cudaFree(ws));
  }
  return 0;
}
