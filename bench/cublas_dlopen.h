// cuBLAS's bf16 GEMM through dlopen, for the kernel benchmarks' peer timings (the device image
// has the library in the pip wheels, not always its headers). CUBLAS_LIB names the .so.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

struct Cublas {
  using Create = int (*)(void**);
  using SetStream = int (*)(void*, cudaStream_t);
  using GemmEx = int (*)(void*, int, int, int, int, int, const void*, const void*, int, int,
                         const void*, int, int, const void*, void*, int, int, int, int);
  void* h = nullptr;
  GemmEx gemm = nullptr;
  bool ok = false;
  void init(cudaStream_t s) {
    const char* path = std::getenv("CUBLAS_LIB");
    void* lib = dlopen(path ? path : "libcublas.so", RTLD_NOW);
    if (!lib) {
      std::printf("cuBLAS not loaded: %s\n", dlerror());
      return;
    }
    auto create = reinterpret_cast<Create>(dlsym(lib, "cublasCreate_v2"));
    auto set_stream = reinterpret_cast<SetStream>(dlsym(lib, "cublasSetStream_v2"));
    gemm = reinterpret_cast<GemmEx>(dlsym(lib, "cublasGemmEx"));
    if (!create || !set_stream || !gemm || create(&h) != 0 || set_stream(h, s) != 0) return;
    ok = true;
  }
  // y[M, N] = x[M, K] . w[N, K]^T, bf16 row-major, f32 compute.
  int run(const void* w, const void* x, void* y, int m, int n, int k) const {
    const float alpha = 1.f, beta = 0.f;
    constexpr int kOpN = 0, kOpT = 1, kBF16 = 14, kCompute32F = 68, kAlgoDefault = -1;
    return gemm(h, kOpT, kOpN, n, m, k, &alpha, w, kBF16, k, x, kBF16, k, &beta, y, kBF16, n,
                kCompute32F, kAlgoDefault);
  }
};

