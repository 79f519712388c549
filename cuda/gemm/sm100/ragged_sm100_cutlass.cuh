// CUTLASS 4.x grouped block-scaled tcgen05 GEMM (ptr-array, 1-SM 128x128x256 tiles) for the
// sm_100a ragged path, configured as in CUTLASS example 75 (grouped block-scaled GEMM): D = A·B in
// float32 for every group, alpha 1 and no bias (the output pass applies alpha_g and bias_g).
// Included by ragged_sm100_cutlass.cu (the launch) and tests/host/ragged_sm100_can_implement.cu.
#pragma once

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gemm/sm100/cutlass_launch.h"
#include "gemm/sm100/ragged_sm100_cutlass.h"

namespace jax_nvfp4 {
namespace sm100 {

struct GroupedGemm {
  using ElementAB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  static constexpr int kAlignAB = 32;  // 16 bytes of 4-bit codes
  static constexpr int kAlignD = 4;    // 16 bytes of float32
  using ProblemShape = cutlass::gemm::GroupProblemShape<GroupShape>;
  using MmaTile = cute::Shape<cute::_128, cute::_128, cute::_256>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;

  using Fusion = cutlass::epilogue::fusion::LinearCombination<float, float, void, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::RowMajor*, kAlignD, float, cutlass::layout::RowMajor*, kAlignD,
      cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementAB,
      cutlass::layout::RowMajor*, kAlignAB, ElementAB, cutlass::layout::ColumnMajor*, kAlignAB,
      float, MmaTile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // The setup kernel writes these types (ragged_sm100_plan.h); they are CUTLASS's own.
  static_assert(std::is_same_v<typename Kernel::InternalStrideA, GroupStride>);
  static_assert(std::is_same_v<typename Kernel::InternalStrideB, GroupStride>);
  static_assert(std::is_same_v<typename Kernel::InternalStrideD, GroupStride>);
  static_assert(std::is_same_v<typename Mainloop::InternalLayoutSFA, LayoutSF>);
  static_assert(std::is_same_v<typename Mainloop::InternalLayoutSFB, LayoutSF>);
  static_assert(std::is_same_v<typename ProblemShape::UnderlyingProblemShape, GroupShape>);

  // host_shapes: the groups' shapes on the host, for CUTLASS's can_implement to check (the
  // launcher has none: the sizes stay on the device).
  static typename Gemm::Arguments arguments(const RaggedCutlassArgs& a, int sm_count,
                                            const GroupShape* host_shapes = nullptr) {
    using Data = typename ElementAB::DataType;
    using Scale = typename ElementAB::ScaleFactorType;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {a.groups, a.shapes, host_shapes},
        {reinterpret_cast<const Data**>(a.a), a.stride_a, reinterpret_cast<const Data**>(a.b),
         a.stride_b, reinterpret_cast<const Scale**>(a.sfa), a.layout_sfa,
         reinterpret_cast<const Scale**>(a.sfb), a.layout_sfb},
        {{}, nullptr, nullptr, a.d, a.stride_d},
        hardware_info(sm_count)};
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 1.0f;  // alpha_g is the pass's
    fusion.beta = 0.0f;
    return args;
  }
};


}  // namespace sm100
}  // namespace jax_nvfp4
