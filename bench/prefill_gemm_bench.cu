// Times configurations of the prefill path's CUTLASS wgmma GEMM (cuda/gemm/sm90/wgmma_gemm.cuh)
// on the device without JAX, to choose the library's tile, cluster and scheduler.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -I cuda
//        [-DWITH_CUBLAS -lcublas] -DVARIANT=n -o prefill_gemm_bench_n bench/prefill_gemm_bench.cu
//        cuda/gemm/sm90/sm_count.cu
//   ./prefill_gemm_bench_n
//
// One configuration per binary (VARIANT, below), so they compile in parallel. Each shape runs
// with every tile order of kOrders (the scheduler's raster direction and swizzle), and, with
// WITH_CUBLAS, cuBLAS's bf16 GEMM on the same operands as the anchor. bf16 operands with random
// values, bf16 output; a few output elements are checked against a float64 host dot product.
// Prints one table row per shape.
#ifndef NDEBUG
#define NDEBUG  // see wgmma_gemm_bf16.cu: device asserts would serialize the wgmma pipeline
#endif
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "cuda_check.h"
#ifdef WITH_CUBLAS
#include <cublas_v2.h>

#define CUBLAS_CHECK(x)                                                          \
  do {                                                                           \
    cublasStatus_t s_ = (x);                                                     \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                           \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, s_); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)
#endif
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
#elif VARIANT == 5
using Config = WgmmaGemm<cutlass::bfloat16_t, Shape<_256, _128, _64>, Shape<_1, _2, _1>, PersistentScheduler>;
static const char* kName = "256x128 c1x2 persistent";
#elif VARIANT == 6
using Config =
    WgmmaGemm<cutlass::bfloat16_t, Shape<_128, _128, _64>, Shape<_1, _2, _1>, PersistentScheduler, true>;
static const char* kName = "128x128 c1x2 pingpong persistent";
#elif VARIANT == 7
using Config = WgmmaGemm<cutlass::bfloat16_t, Shape<_256, _128, _64>, Shape<_2, _1, _1>, PersistentScheduler>;
static const char* kName = "256x128 c2x1 persistent";
#endif

// The tile orders every shape is timed with.
struct NamedOrder {
  const char* name;
  TileOrder order;
};
using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
const NamedOrder kOrders[] = {{"auto s4", {4, Raster::Heuristic}},
                               {"M s8", {8, Raster::AlongM}},
                               {"N s8", {8, Raster::AlongN}},
                               {"auto s1 (library)", {1, Raster::Heuristic}}};

#ifdef WITH_CUBLAS
// cuBLAS's bf16 GEMM on the same operands, as the in-run anchor: row-major D[m, n] = A . B^T is
// column-major D^T[n, m] = B^T(op T of the [k, n] column-major B) . A.
void cublas_gemm(cublasHandle_t handle, int m, int n, int k, const void* a, const void* b, void* d) {
  const float one = 1.f, zero = 0.f;
  CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, k, a,
                            CUDA_R_16BF, k, &zero, d, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
#endif

// Median us per call of each candidate, timed round-robin (20 calls of each in turn, 7 rounds):
// the GPU's clock falls as it heats under back-to-back GEMMs, and timing the candidates one after
// the other would favour whichever ran first.
std::vector<double> round_robin_us(cudaStream_t stream, const std::vector<std::function<void()>>& calls) {
  constexpr int kRounds = 7, kCalls = 20;
  for (const auto& call : calls) {
    for (int i = 0; i < 3; ++i) call();
  }
  std::vector<std::vector<double>> samples(calls.size());
  for (int round = 0; round < kRounds; ++round) {
    for (size_t c = 0; c < calls.size(); ++c) {
      samples[c].push_back(median_us_per_call(stream, 1, kCalls, [&](int) { calls[c](); }));
    }
  }
  std::vector<double> out;
  for (auto& v : samples) {
    std::sort(v.begin(), v.end());
    out.push_back(v[v.size() / 2]);
  }
  return out;
}

int main() {
  struct Shape3 { int m, n, k; };
  const Shape3 shapes[] = {{1024, 14336, 4096}, {4096, 14336, 4096}, {8192, 14336, 4096},
                           {4096, 4096, 4096},  {8192, 4096, 4096},  {4096, 6144, 4096},
                           {8192, 6144, 4096},  {4096, 4096, 14336}, {8192, 4096, 14336}};
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, variant %s; us per GEMM (TFLOP/s) for each tile order\n\n| M | N | K |", prop.name,
              kName);
#ifdef WITH_CUBLAS
  std::printf(" cuBLAS |");
#endif
  for (const NamedOrder& o : kOrders) std::printf(" %s |", o.name);
  std::printf(" check |\n|---|---|---|");
#ifdef WITH_CUBLAS
  std::printf("---|");
#endif
  for (size_t i = 0; i < sizeof(kOrders) / sizeof(kOrders[0]); ++i) std::printf("---|");
  std::printf("---|\n");
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
#ifdef WITH_CUBLAS
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  CUBLAS_CHECK(cublasSetStream(handle, stream));
#endif

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

    const double flops = 2.0 * s.m * s.n * s.k;
    std::vector<std::function<void()>> calls;
#ifdef WITH_CUBLAS
    calls.push_back([&] { cublas_gemm(handle, s.m, s.n, s.k, da, db, dd); });
#endif
    for (const NamedOrder& o : kOrders) {
      const WgmmaGemmArgs g{s.m, s.n, s.k, da, db, dd, alpha, bias, ws};
      calls.push_back([&, g, o] { CUDA_CHECK(Config::run(g, stream, {}, o.order)); });
    }
    std::printf("| %d | %d | %d |", s.m, s.n, s.k);
    for (double us : round_robin_us(stream, calls)) std::printf(" %.1f (%.0f) |", us, flops / us * 1e-6);
    // A few outputs of the last call timed (ours, kOrders' last order) against a float64 dot
    // product of the same bf16 operands.
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
    std::printf(" %.1e%s |\n", worst, worst < 1e-2 ? "" : " FAIL");
    CUDA_CHECK(cudaFree(da));
    CUDA_CHECK(cudaFree(db));
    CUDA_CHECK(cudaFree(dd));
    CUDA_CHECK(cudaFree(alpha));
    CUDA_CHECK(cudaFree(bias));
    if (ws) CUDA_CHECK(cudaFree(ws));
  }
  return 0;
}
