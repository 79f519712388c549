// CUTLASS 4.x block-scaled tcgen05 GEMM for NVFP4 x NVFP4 (TN, fp32 accumulation), configured
// as in CUTLASS example 72b: D = alpha * A·B + bias[n], alpha read from device memory; with
// NVFP4 output the LinCombBlockScaleFactor epilogue also quantizes D (E4M3 block scales in the
// tiled layout, encode scale = the caller's S_enc).
#pragma once

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gemm/sm100/cutlass_launch.h"
#include "gemm/sm100/gemm_sm100_kernels.h"

namespace jax_nvfp4 {
namespace sm100 {

template <OutKind kKind, bool kTwoSm>
struct CutlassGemm {
  using ElementAB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  static constexpr int kAlignAB = 32;  // 16 bytes of 4-bit codes
  using ElementD = std::conditional_t<
      kKind == OutKind::kF32, float,
      std::conditional_t<kKind == OutKind::kBF16, cutlass::bfloat16_t, cutlass::float_e2m1_t>>;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using ElementC = void;  // no source matrix (beta = 0)
  using ElementSFD = cutlass::float_ue4m3_t;

  using MmaTile = std::conditional_t<kTwoSm, cute::Shape<cute::_256, cute::_128, cute::_256>,
                                     cute::Shape<cute::_128, cute::_128, cute::_256>>;
  using Cluster = std::conditional_t<kTwoSm, cute::Shape<cute::_2, cute::_1, cute::_1>,
                                     cute::Shape<cute::_1, cute::_1, cute::_1>>;
  using MainloopSchedule =
      std::conditional_t<kTwoSm, cutlass::gemm::KernelTmaWarpSpecialized2SmNvf4Sm100,
                         cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100>;
  using EpilogueSchedule = std::conditional_t<kTwoSm, cutlass::epilogue::TmaWarpSpecialized2Sm,
                                              cutlass::epilogue::TmaWarpSpecialized1Sm>;

  // Bias is f32 (the launcher converts other dtypes) read with alignment 1: any N, no padding.
  using Fusion = std::conditional_t<
      kKind == OutKind::kNvfp4,
      cutlass::epilogue::fusion::LinCombPerColBiasBlockScaleFactor<
          kBlockSize, ElementD, float, ElementSFD, cutlass::layout::RowMajor, float, ElementC,
          float, 1>,
      cutlass::epilogue::fusion::LinCombPerColBias<ElementD, float, float, ElementC, float, 1>>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC,
      cutlass::layout::RowMajor, kAlignD, ElementD, cutlass::layout::RowMajor, kAlignD,
      EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementAB,
      cutlass::layout::RowMajor, kAlignAB, ElementAB, cutlass::layout::ColumnMajor, kAlignAB,
      float, MmaTile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // The argument builder's types are CUTLASS's own.
  static_assert(std::is_same_v<typename Kernel::StrideA, Stride>);
  static_assert(std::is_same_v<typename Kernel::StrideB, Stride>);
  static_assert(std::is_same_v<typename Kernel::StrideD, Stride>);
  static_assert(std::is_same_v<typename Mainloop::LayoutSFA, LayoutSF>);
  static_assert(std::is_same_v<typename Mainloop::LayoutSFB, LayoutSF>);

  static typename Gemm::Arguments arguments(const Args& a, int sm_count) {
    using Data = typename ElementAB::DataType;
    using Scale = typename ElementAB::ScaleFactorType;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {a.m, a.n, a.k, 1},
        {reinterpret_cast<const Data*>(a.a), a.stride_a, reinterpret_cast<const Data*>(a.b),
         a.stride_b, reinterpret_cast<const Scale*>(a.sfa), a.layout_sfa,
         reinterpret_cast<const Scale*>(a.sfb), a.layout_sfb},
        {{}, nullptr, a.stride_d, static_cast<ElementD*>(a.d), a.stride_d},
        hardware_info(sm_count)};
    auto& fusion = args.epilogue.thread;
    fusion.alpha_ptr = a.alpha;
    fusion.bias_ptr = a.bias;
    if constexpr (kKind == OutKind::kNvfp4) {
      static_assert(std::is_same_v<typename Fusion::GmemLayoutTagScalefactor, cutlass::layout::RowMajor>);
      fusion.block_scale_factor_ptr = reinterpret_cast<ElementSFD*>(a.sfd);
      fusion.norm_constant_ptr = a.norm_constant;
    }
    return args;
  }
};

template <OutKind kKind, bool kTwoSm>
size_t cutlass_workspace_bytes(const Args& args, int sm_count) {
  using G = CutlassGemm<kKind, kTwoSm>;
  return G::Gemm::get_workspace_size(G::arguments(args, sm_count));
}

template <OutKind kKind, bool kTwoSm>
cudaError_t run_cutlass(const Args& args, int sm_count, cudaStream_t stream) {
  using G = CutlassGemm<kKind, kTwoSm>;
  return run_gemm<typename G::Gemm>(G::arguments(args, sm_count), args.workspace, stream);
}

}  // namespace sm100
}  // namespace jax_nvfp4
