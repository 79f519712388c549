// The prefill path's bf16 GEMM through cuBLASLt (compiled where the build finds cublasLt.h:
// JAX_NVFP4_HAS_CUBLASLT). The library is not linked: it is opened by its soname at the first
// call, which finds the copy XLA has already loaded into the process (XLA's own GEMMs are
// cuBLASLt's). Where it cannot be opened, or offers no algorithm for a problem, the prefill
// path runs CUTLASS's GEMM instead (same numerics contract: float32 accumulation, then
// alpha * acc + bias[n] in float32, then the output cast).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/dtype.h"

namespace jax_nvfp4 {
namespace sm90 {

// Workspace handed to cuBLASLt (NVIDIA's recommendation for Hopper).
constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;

// D[m, n] (row-major, ld n, bf16 or float32 d_type) = *scalars[0] * A[m, k] . B[n, k]^T + bias[n]
// (+ *scalars[1] * D, which the caller sets to 0): bf16 row-major A (ld k) and B (ld k, at
// least n rows), float32 scalars in device memory. bias (may be null) is a vector of d_type.
struct CublasLtGemmArgs {
  int64_t m, n, k;
  const void* a;
  const void* b;
  void* d;
  DType d_type;
  const float* scalars;
  const void* bias;
  void* workspace;  // kCublasLtWorkspaceBytes, 256-byte aligned
};

// Enqueues `prepare` (the kernel that writes A, B, the scalars and the bias), then the GEMM, on
// `stream`. Where cuBLASLt cannot run `g` on the current device (the library not opened, no
// algorithm; both looked up once and cached) it enqueues nothing and returns
// cudaErrorNotSupported, so the caller can run another GEMM. In the initialize stage's warm-up
// capture (common/initialize_stage.h) it records every candidate algorithm after `prepare`.
cudaError_t cublaslt_gemm(const CublasLtGemmArgs& g, cudaStream_t stream,
                          const std::function<cudaError_t()>& prepare);

// Prefill GEMMs enqueued through cuBLASLt since the process started, warm-up captures not counted
// (tests check that the path they force runs the backend they mean).
int64_t cublaslt_gemm_calls();

}  // namespace sm90
}  // namespace jax_nvfp4
