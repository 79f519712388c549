// The sm_100a ragged path's grouped GEMM (ragged_sm100_cutlass.cuh), launched with the problem
// shapes on the device only: the persistent tile scheduler walks the groups' tiles there (a group
// of 0 rows has none).
#include "gemm/sm100/ragged_sm100_cutlass.cuh"

namespace jax_nvfp4 {
namespace sm100 {

size_t ragged_cutlass_workspace_bytes(int groups, int sm_count) {
  RaggedCutlassArgs shape_only;
  shape_only.groups = groups;
  return GroupedGemm::Gemm::get_workspace_size(GroupedGemm::arguments(shape_only, sm_count));
}

cudaError_t run_ragged_cutlass(const RaggedCutlassArgs& args, int sm_count, cudaStream_t stream) {
  return run_gemm<GroupedGemm::Gemm>(GroupedGemm::arguments(args, sm_count), args.workspace, stream);
}

}  // namespace sm100
}  // namespace jax_nvfp4
