// CUTLASS sm_100a NVFP4 GEMM instantiations with nvfp4 output (1-SM and 2-SM tiles).
#include "gemm/sm100/gemm_sm100_cutlass.cuh"

namespace jax_nvfp4 {
namespace sm100 {

template size_t cutlass_workspace_bytes<OutKind::kNvfp4, false>(const Args&, int);
template size_t cutlass_workspace_bytes<OutKind::kNvfp4, true>(const Args&, int);
template cudaError_t run_cutlass<OutKind::kNvfp4, false>(const Args&, int, cudaStream_t);
template cudaError_t run_cutlass<OutKind::kNvfp4, true>(const Args&, int, cudaStream_t);

}  // namespace sm100
}  // namespace jax_nvfp4
