// Times the sm_90a GEMM families that serve M > 16 (fused, fused_ws on 128- and 256-row tiles,
// prefill) alone, without JAX, beside cuBLAS's bf16 GEMM on the same shapes, to choose the path
// thresholds and to see what the JAX-level figures add. The fused kernels' activation staging
// pass, which each of their calls begins with, is also timed alone (256-row tiles).
//
//   bash bench/fused_gemm_bench.sh      (builds this file with the kernels it times; on the GPU)
//   ./fused_gemm_bench [--ms 256,512,...] [--only-n N] [--w4a4]
//
// W4A16: random NVFP4 weights (all 16 codes, E4M3 scales in [2^-4, 2]) and bf16 activations,
// bf16 output; with --w4a4 the activations are random NVFP4 as well (cuBLAS still gets bf16). Every candidate runs 20 back-to-back calls in turn, 7 rounds, median per call
// (clock drift as the GPU warms hits all alike); the weights rotate over copies larger than the
// L2, as in the JAX benchmark. The three families' outputs are compared with each other
// (relative Frobenius difference; they compute the same products in different orders).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/scale_layout.h"
#include "cublas_dlopen.h"
#include "cuda_check.h"
#include "event_timing.h"
#include "gemm/sm90/gemm_sm90_internal.h"
#include "w4a16_problem.h"

using namespace jax_nvfp4;

namespace {

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoll(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

double rel_diff(const std::vector<__nv_bfloat16>& a, const std::vector<__nv_bfloat16>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ms = {256, 512, 1024, 2048, 4096, 8192};
  int64_t only_n = 0;
  bool w4a4 = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ms") && i + 1 < argc) ms = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--only-n") && i + 1 < argc) only_n = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--w4a4")) w4a4 = true;
  }
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, %s\n", prop.name, prop.multiProcessorCount, w4a4 ? "W4A4" : "W4A16");
  Cublas cublas;
  cublas.init(s);

  std::printf("\n| M | N | K | fused us | fused_ws us | fused_ws_wide us | prefill us | staging alone us | "
              "cuBLAS bf16 us | wide TFLOP/s | wide / cuBLAS | max rel diff |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(11);
  for (auto& sh : kLlamaShapes) {
    const int64_t n = sh[0], k = sh[1];
    if (only_n > 0 && n != only_n) continue;
    const size_t code_bytes = n * k / 2, scale_bytes = scale_matrix_bytes(n, k / kBlockSize);
    const int copies = rotation_copies(code_bytes + scale_bytes);
    std::vector<uint8_t> codes(code_bytes), scales(scale_bytes, 0);
    std::uniform_int_distribution<int> byte(0, 255), sc(0x20, 0x40);  // E4M3 2^-4 .. 2
    for (auto& c : codes) c = static_cast<uint8_t>(byte(rng));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < k / kBlockSize; ++b) scales[scale_offset(r, b, k / kBlockSize)] = static_cast<uint8_t>(sc(rng));
    uint8_t *d_codes, *d_scales;
    CUDA_CHECK(cudaMalloc(&d_codes, code_bytes * copies));
    CUDA_CHECK(cudaMalloc(&d_scales, scale_bytes * copies));
    for (int c = 0; c < copies; ++c) {
      CUDA_CHECK(cudaMemcpy(d_codes + c * code_bytes, codes.data(), code_bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(d_scales + c * scale_bytes, scales.data(), scale_bytes, cudaMemcpyHostToDevice));
    }
    const size_t wb_bytes = n * k * 2;
    const int wb_copies = rotation_copies(wb_bytes);
    void* wb;
    CUDA_CHECK(cudaMalloc(&wb, wb_bytes * wb_copies));
    CUDA_CHECK(cudaMemset(wb, 0x3C, wb_bytes * wb_copies));
    float* s_dec;
    CUDA_CHECK(cudaMalloc(&s_dec, 4));
    const float s_dec_h = 0.37f;
    CUDA_CHECK(cudaMemcpy(s_dec, &s_dec_h, 4, cudaMemcpyHostToDevice));

    for (int64_t m : ms) {
      std::vector<__nv_bfloat16> hx(m * k);
      std::normal_distribution<float> nd;
      for (auto& v : hx) v = __float2bfloat16(nd(rng));
      void *x, *y;
      CUDA_CHECK(cudaMalloc(&x, hx.size() * 2));
      CUDA_CHECK(cudaMalloc(&y, m * n * 2));
      CUDA_CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
      GemmProblem p = w4a16_problem(m, n, k, x, d_codes, d_scales, s_dec, y);
      uint8_t *x_codes = nullptr, *x_scales = nullptr;
      if (w4a4) {
        const size_t xc_bytes = m * k / 2, xs_bytes = scale_matrix_bytes(m, k / kBlockSize);
        std::vector<uint8_t> xc(xc_bytes), xs(xs_bytes, 0);
        for (auto& c : xc) c = static_cast<uint8_t>(byte(rng));
        for (int64_t r = 0; r < m; ++r)
          for (int64_t b = 0; b < k / kBlockSize; ++b) xs[scale_offset(r, b, k / kBlockSize)] = static_cast<uint8_t>(sc(rng));
        CUDA_CHECK(cudaMalloc(&x_codes, xc_bytes));
        CUDA_CHECK(cudaMalloc(&x_scales, xs_bytes));
        CUDA_CHECK(cudaMemcpy(x_codes, xc.data(), xc_bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(x_scales, xs.data(), xs_bytes, cudaMemcpyHostToDevice));
        p.a_is_nvfp4 = true;
        p.a_q = {x_codes, x_scales, s_dec};
      }
      p.workspace_bytes = std::max({sm90::fused_workspace_bytes(p), sm90::fused_ws_workspace_bytes(p, 128),
                                    sm90::fused_ws_workspace_bytes(p, 256), sm90::prefill_workspace_bytes(p)});
      CUDA_CHECK(cudaMalloc(&p.workspace, p.workspace_bytes));

      using Path = cudaError_t (*)(const GemmProblem&, cudaStream_t);
      constexpr int kFamilies = 4;
      const Path paths[kFamilies] = {
          sm90::fused_gemm, [](const GemmProblem& q, cudaStream_t st) { return sm90::fused_ws_gemm(q, 128, st); },
          [](const GemmProblem& q, cudaStream_t st) { return sm90::fused_ws_gemm(q, 256, st); }, sm90::prefill_gemm};
      // Outputs of copy 0, compared across the families.
      std::vector<std::vector<__nv_bfloat16>> outs(kFamilies, std::vector<__nv_bfloat16>(m * n));
      const char* names[kFamilies] = {"fused", "fused_ws", "fused_ws_wide", "prefill"};
      for (int f = 0; f < kFamilies; ++f) {
        if (const cudaError_t err = paths[f](p, s); err != cudaSuccess) {
          std::fprintf(stderr, "%s failed: %s\n", names[f], cudaGetErrorString(err));
          std::exit(1);
        }
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaMemcpy(outs[f].data(), y, m * n * 2, cudaMemcpyDeviceToHost));
      }
      double diff = 0;
      for (int f = 0; f + 1 < kFamilies; ++f) diff = std::max(diff, rel_diff(outs[f], outs[kFamilies - 1]));

      std::vector<std::function<void(int)>> calls;
      for (int f = 0; f < kFamilies; ++f) {
        calls.push_back([&, f](int i) {
          GemmProblem q = p;
          q.b.codes = d_codes + (i % copies) * code_bytes;
          q.b.scales = d_scales + (i % copies) * scale_bytes;
          CUDA_CHECK(paths[f](q, s));
        });
      }
      const sm90::StagedActivations staged = sm90::staged_activations(p, 256);
      calls.push_back([&](int) { CUDA_CHECK(sm90::stage_activations(p, staged, s)); });
      if (cublas.ok) {
        calls.push_back([&](int i) {
          if (cublas.run(static_cast<uint8_t*>(wb) + (i % wb_copies) * wb_bytes, x, y, m, n, k) != 0) {
            std::fprintf(stderr, "cublasGemmEx failed\n");
            std::exit(1);
          }
        });
      }
      std::vector<std::vector<double>> us(calls.size());
      for (int round = 0; round < 7; ++round) {
        for (size_t c = 0; c < calls.size(); ++c) us[c].push_back(median_us_per_call(s, 1, 20, calls[c]));
      }
      std::vector<double> med(kFamilies + 2, NAN);
      for (size_t c = 0; c < calls.size(); ++c) {
        std::sort(us[c].begin(), us[c].end());
        med[c] = us[c][us[c].size() / 2];
      }
      const double flops = 2.0 * m * n * k;
      std::printf("| %lld | %lld | %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f | %.2f | %.1e |\n",
                  (long long)m, (long long)n, (long long)k, med[0], med[1], med[2], med[3], med[4], med[5],
                  flops / med[2] * 1e-6, med[5] / med[2], diff);
      std::fflush(stdout);
      CUDA_CHECK(cudaFree(p.workspace));
      CUDA_CHECK(cudaFree(x));
      CUDA_CHECK(cudaFree(y));
      if (w4a4) {
        CUDA_CHECK(cudaFree(x_codes));
        CUDA_CHECK(cudaFree(x_scales));
      }
    }
    CUDA_CHECK(cudaFree(d_codes));
    CUDA_CHECK(cudaFree(d_scales));
    CUDA_CHECK(cudaFree(wb));
    CUDA_CHECK(cudaFree(s_dec));
  }
  return 0;
}
