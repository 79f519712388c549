// Times the prefill path's weight dequantization pass (NVFP4 -> bf16, gemm_prefill.cu) alone on
// the Llama-3-8B weight shapes, operand copies rotating through more than the L2:
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

namespace jax_nvfp4 {
namespace sm90 {
size_t wgmma_gemm_workspace_f32(int, int, int) { return 0; }
size_t wgmma_gemm_workspace_bf16(int, int, int) { return 0; }
size_t wgmma_gemm_workspace_f16(int, int, int) { return 0; }
cudaError_t wgmma_gemm_f32(const WgmmaGemmArgs&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t wgmma_gemm_bf16(const WgmmaGemmArgs&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t wgmma_gemm_f16(const WgmmaGemmArgs&, cudaStream_t) { return cudaErrorNotSupported; }
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
    __nv_bfloat16* out;
    CUDA_CHECK(cudaMalloc(&out, sh.n * sh.k * 2));
    auto call = [&](int i) {
      Nvfp4Operand op{dc[i % kCopies], ds[i % kCopies], nullptr};
      CUDA_CHECK(sm90::dequantize_to_bf16(op, sh.n, sh.n, sh.k, 1, out, stream));
    };
    for (int i = 0; i < 8; ++i) call(i);
    const double us = median_us_per_call(stream, 7, 40, call);
    std::vector<uint16_t> host(sh.n * sh.k);
    CUDA_CHECK(cudaMemcpy(host.data(), out, host.size() * 2, cudaMemcpyDeviceToHost));
    uint64_t h = 1469598103934665603ull;
    for (uint16_t v : host) h = (h ^ v) * 1099511628211ull;
    const double bytes = code_bytes + scale_bytes + sh.n * sh.k * 2.0;
    std::printf("| %s | %lld x %lld | %.1f us | %.2f TB/s | %016llx |\n", label, (long long)sh.n, (long long)sh.k, us,
                bytes / us * 1e-6, (unsigned long long)h);
    for (int i = 0; i < kCopies; ++i) { cudaFree(dc[i]); cudaFree(ds[i]); }
    cudaFree(out);
  }
}
