// The CUTLASS grouped block-scaled GEMM of the sm_100a ragged path (ragged_sm100_cutlass.cu):
// every group's NVFP4 A (rows of the group) times its NVFP4 weights, float32 D, D = A·B (alpha,
// bias and activation are the pass's after it). Group arguments live in device memory (written
// by the setup kernel), so the launch needs only the group count on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "gemm/sm100/ragged_sm100_plan.h"

namespace jax_nvfp4 {
namespace sm100 {

// Device arrays of `groups` entries each (ragged_sm100_plan.h's regions).
struct RaggedCutlassArgs {
  int groups = 0;
  GroupShape* shapes = nullptr;
  const uint8_t** a = nullptr;
  const uint8_t** b = nullptr;
  const uint8_t** sfa = nullptr;
  const uint8_t** sfb = nullptr;
  float** d = nullptr;
  GroupStride* stride_a = nullptr;
  GroupStride* stride_b = nullptr;
  GroupStride* stride_d = nullptr;
  LayoutSF* layout_sfa = nullptr;
  LayoutSF* layout_sfb = nullptr;
  void* workspace = nullptr;  // CUTLASS's own
};

// The arrays of a plan inside workspace `ws`.
inline RaggedCutlassArgs ragged_cutlass_args(const RaggedPlan& plan, void* ws) {
  RaggedCutlassArgs a;
  a.groups = static_cast<int>(plan.groups);
  a.shapes = at<GroupShape>(ws, plan.shapes);
  a.a = at<const uint8_t*>(ws, plan.ptr_a);
  a.b = at<const uint8_t*>(ws, plan.ptr_b);
  a.sfa = at<const uint8_t*>(ws, plan.ptr_sfa);
  a.sfb = at<const uint8_t*>(ws, plan.ptr_sfb);
  a.d = at<float*>(ws, plan.ptr_d);
  a.stride_a = at<GroupStride>(ws, plan.stride_a);
  a.stride_b = at<GroupStride>(ws, plan.stride_b);
  a.stride_d = at<GroupStride>(ws, plan.stride_d);
  a.layout_sfa = at<LayoutSF>(ws, plan.layout_sfa);
  a.layout_sfb = at<LayoutSF>(ws, plan.layout_sfb);
  a.workspace = at<void>(ws, plan.cutlass_ws);
  return a;
}

// Bytes of CUTLASS's own workspace for `groups` groups on sm_count SMs.
size_t ragged_cutlass_workspace_bytes(int groups, int sm_count);

// Enqueues the grouped GEMM; cudaErrorInvalidValue when CUTLASS rejects the arguments.
cudaError_t run_ragged_cutlass(const RaggedCutlassArgs& args, int sm_count, cudaStream_t stream);

}  // namespace sm100
}  // namespace jax_nvfp4
