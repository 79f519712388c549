// Times the prefill path's preparation kernel (gemm_prefill.cu) with bf16 x, i.e. the weight
// dequantization pass (NVFP4 -> bf16), alone on the Llama-3-8B weight shapes, operand copies
// rotating through more than the L2:
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -I cuda
//        -o dequant_pass_bench bench/dequant_pass_bench.cu cuda/gemm/sm90/sm_count.cu
//   ./dequant_pass_bench [label]
//
// Prints us per call (median of CUDA-event timed back-to-back calls), the bandwidth counting
// bytes read and written, and an FNV hash of the output so variants of the pass can be compared
// bit for bit. The prefill source is included whole to reach its launcher; the GEMM entry points
// it refers to are stubbed out (this binary never calls them).
#include "gemm/sm90/gemm_prefill.cu"

#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "event_timing.h"
#include "fnv_hash.h"

namespace jax_nvfp4 {
namespace sm90 {
size_t wgmma_gemm_workspace_f32(int, int, int) { return 0; }
size_t wgmma_gemm_workspace_bf16(int, int, int) { return 0; }
size_t wgmma_gemm_workspace_f16(int, int, int) { return 0; }
using Prepare = std::function<cudaError_t()>;
cudaError_t wgmma_gemm_f32(const WgmmaGemmArgs&, cudaStream_t, const Prepare&) { return cudaErrorNotSupported; }
cudaError_t wgmma_gemm_bf16(const WgmmaGemmArgs&, cudaStream_t, const Prepare&) { return cudaErrorNotSupported; }
cudaError_t wgmma_gemm_f16(const WgmmaGemmArgs&, cudaStream_t, const Prepare&) { return cudaErrorNotSupported; }
}  // namespace sm90
}  // namespace jax_nvfp4

using namespace jax_nvfp4;

int main(int argc, char** argv) {
  const char* label = argc > 1 ? argv[1] : "ours";
  struct S { int64_t n, k; } shapes[] = {{4096, 4096}, {6144, 4096}, {14336, 4096}, {4096, 14336}};
  std::mt19937 rng(1);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  constexpr int kCopies = 4;
  for (auto sh : shapes) {
    const size_t code_bytes = sh.n * sh.k / 2, scale_bytes = scale_matrix_bytes(sh.n, sh.k / 16);
    std::vector<uint8_t> codes(code_bytes), scales(scale_bytes);
    for (auto& c : codes) c = uint8_t(rng());
    for (auto& c : scales) c = uint8_t(0x28 + rng() % 24);
    uint8_t *dc[kCopies], *ds[kCopies];
    for (int i = 0; i < kCopies; ++i) {
      CUDA_CHECK(cudaMalloc(&dc[i], code_bytes));
      CUDA_CHECK(cudaMalloc(&ds[i], scale_bytes));
      CUDA_CHECK(cudaMemcpy(dc[i], codes.data(), code_bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(ds[i], scales.data(), scale_bytes, cudaMemcpyHostToDevice));
    }
    // A W4A16 problem (bf16 x, which needs no conversion): the preparation kernel then writes
    // the bf16 weights, alpha and the float32 bias row; the weights dominate its bytes.
    float* s_dec;
    CUDA_CHECK(cudaMalloc(&s_dec, sizeof(float)));
    CUDA_CHECK(cudaMemset(s_dec, 0, sizeof(float)));
    GemmProblem p;
    p.m = 1;
    p.n = sh.n;
    p.k = sh.k;
    p.b.s_dec = s_dec;
    const sm90::Plan plan = sm90::make_plan(p);
    uint8_t* ws;
    CUDA_CHECK(cudaMalloc(&ws, plan.total));
    const __nv_bfloat16* out = reinterpret_cast<const __nv_bfloat16*>(ws + plan.off_w);
    auto call = [&](int i) {
      p.b.codes = dc[i % kCopies];
      p.b.scales = ds[i % kCopies];
      CUDA_CHECK(sm90::prepare(p, plan, ws, stream));
    };
    for (int i = 0; i < 8; ++i) call(i);
    const double us = median_us_per_call(stream, 7, 40, call);
    std::vector<uint16_t> host(sh.n * sh.k);
    CUDA_CHECK(cudaMemcpy(host.data(), out, host.size() * 2, cudaMemcpyDeviceToHost));
    const uint64_t h = fnv_hash(host);
    const double bytes = code_bytes + scale_bytes + sh.n * sh.k * 2.0;
    std::printf("| %s | %lld x %lld | %.1f us | %.2f TB/s | %016llx |\n", label, (long long)sh.n, (long long)sh.k, us,
                bytes / us * 1e-6, (unsigned long long)h);
    for (int i = 0; i < kCopies; ++i) { cudaFree(dc[i]); cudaFree(ds[i]); }
    cudaFree(ws);
    cudaFree(s_dec);
  }
}
