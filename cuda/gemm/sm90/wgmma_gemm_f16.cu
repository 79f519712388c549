// The prefill wgmma GEMM with f16 output (see wgmma_gemm.cuh).
// Device-side asserts in CUTLASS's kernel would be a function call between wgmma issue and
// wait, which makes ptxas serialize the wgmma pipeline (warning C7510): build without them.
#ifndef NDEBUG
#define NDEBUG
#endif
#include "gemm/sm90/wgmma_gemm.cuh"

namespace jax_nvfp4 {
namespace sm90 {

size_t wgmma_gemm_workspace_f16(int m, int n, int k) { return WgmmaGemm<cutlass::half_t>::workspace_bytes(m, n, k); }

cudaError_t wgmma_gemm_f16(const WgmmaGemmArgs& g, cudaStream_t stream,
                           const std::function<cudaError_t()>& prepare) {
  return WgmmaGemm<cutlass::half_t>::run(g, stream, prepare);
}

}  // namespace sm90
}  // namespace jax_nvfp4
