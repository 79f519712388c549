// The wgmma GEMM of the prefill path, one explicit instantiation per output type
// (wgmma_gemm_{f32,bf16,f16}.cu, compiled in parallel).
//
// CUTLASS's sm90 kernel built from its collective builders: TMA loads into a multi-stage
// shared-memory pipeline (256x128x64 tiles; clusters of 2 along N share each A tile by TMA
// multicast), a producer warp and two consumer warpgroups issuing wgmma (HGMMA) with float32
// accumulators, a persistent stream-K tile scheduler (it splits K, deterministically, when M x N
// has too few tiles to fill the GPU), and an epilogue computing alpha * acc + bias[n] (alpha read
// from device memory) with a TMA store.
//
// The GEMM is a programmatic dependent launch of the kernel that prepares its operands, so its
// launch overlaps that kernel's tail; it runs CUTLASS's kernel behind a griddepcontrol.wait.
// (CUTLASS's own wait, compiled in by CUTLASS_ENABLE_GDC_FOR_SM90, does not compile with the
// stream-K scheduler of CUTLASS 4.2: `is_last_tile` binds a member to a non-const reference.)
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cluster_launch.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "common/launch_config.cuh"
#include "common/library_failure.h"
#include "gemm/sm90/gemm_sm90_internal.h"

namespace jax_nvfp4 {
namespace sm90 {

using cute::Shape;
using cute::_1;
using cute::_2;
using cute::_64;
using cute::_128;
using cute::_256;

// CUTLASS's kernel `Kernel` once every grid before it in the stream has completed (what
// cutlass::device_kernel runs, behind the wait): the GEMM can then be a programmatic dependent
// launch of the kernel that writes its operands.
template <class Kernel>
__global__ void __launch_bounds__(Kernel::MaxThreadsPerBlock, Kernel::MinBlocksPerMultiprocessor)
gemm_after_prior_grids(CUTLASS_GRID_CONSTANT const typename Kernel::Params params) {
  wait_for_prior_grids();
  extern __shared__ char smem[];
  Kernel op;
  op(params, smem);
}

// The most SMs a Hopper has (a full GH100; an H100 SXM or H200 enables 132, an H100 PCIe 114, a
// MIG slice fewer).
constexpr int kMaxSm90Sms = 144;

// The order in which the persistent scheduler hands out output tiles: along M or N (or as
// CUTLASS's heuristic picks from the tile counts), in groups of `swizzle` (1, 2, 4, 8) tiles
// across that direction, so that the tiles in flight at once share operand rows in L2. Measured:
// within 2% of each other on the Llama shapes (bench/prefill_gemm_bench.cu); the library uses the
// default.
struct TileOrder {
  int swizzle = 1;
  cutlass::gemm::kernel::detail::RasterOrderOptions raster =
      cutlass::gemm::kernel::detail::RasterOrderOptions::Heuristic;
};

// D[M, N] (row-major) = alpha * A[M, K] (row-major) . B[N, K]^T + bias[N], A and B bf16.
// The tile, the cluster, the tile scheduler and the kernel schedule (cooperative: both consumer
// warpgroups on one tile; ping-pong: one tile each, one's epilogue under the other's MMAs) are
// parameters so bench/prefill_gemm_bench.cu can time alternatives; the defaults are the
// configuration the library uses.
template <class ElementD, class TileShape_ = Shape<_256, _128, _64>,
          class ClusterShape_ = Shape<_1, _2, _1>, class Scheduler = cutlass::gemm::StreamKScheduler,
          bool kPingpong = false>
struct WgmmaGemm {
  using ElementAB = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;  // [K, N] column-major == [N, K] row-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 8;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBias<ElementD, float, float, ElementD, float>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD,
      ElementD, LayoutD, kAlignD,
      std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                         cutlass::epilogue::TmaWarpSpecializedCooperative>,
      Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, kAlignAB, ElementAB,
      LayoutB, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      Scheduler>;

  static typename Kernel::Arguments arguments(int m, int n, int k, const void* a, const void* b,
                                              void* d, const float* alpha, const float* bias, int sms,
                                              TileOrder order = {}) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    cutlass::KernelHardwareInfo hw;
    hw.sm_count = sms;
    typename Kernel::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const ElementAB*>(a), cutlass::make_cute_packed_stride(StrideA{}, {m, k, 1}),
         static_cast<const ElementAB*>(b), cutlass::make_cute_packed_stride(StrideB{}, {n, k, 1})},
        {{}, nullptr, cutlass::make_cute_packed_stride(StrideC{}, {m, n, 1}),
         static_cast<ElementD*>(d), cutlass::make_cute_packed_stride(StrideD{}, {m, n, 1})},
        hw};
    args.epilogue.thread.alpha_ptr = alpha;
    args.epilogue.thread.beta = 0.f;
    args.epilogue.thread.bias_ptr = bias;
    args.scheduler.max_swizzle_size = order.swizzle;
    args.scheduler.raster_order = order.raster;
    return args;
  }

  // Bytes of CUTLASS's workspace for an M x N x K GEMM on any Hopper. Stream-K's depends on the SM
  // count (2048 x 4096 x 4096: none on 132 SMs, 18.6 MB on 114), and a call lowered on one GPU, its
  // workspace sized then, may run on another (jax.export): the most over every SM count from a
  // cluster's to kMaxSm90Sms (CUTLASS divides by zero below a cluster), once per shape.
  static size_t workspace_bytes(int m, int n, int k) {
    static std::mutex mutex;
    static std::map<std::tuple<int, int, int>, size_t> sizes;
    const std::lock_guard<std::mutex> lock(mutex);
    const auto [it, added] = sizes.try_emplace({m, n, k}, 0);
    if (added) {
      for (int sms = cute::size(ClusterShape{}); sms <= kMaxSm90Sms; ++sms) {
        const auto args = arguments(m, n, k, nullptr, nullptr, nullptr, nullptr, nullptr, sms);
        it->second = std::max(it->second, Kernel::get_workspace_size(args));
      }
    }
    return it->second;
  }

  // Sets CUTLASS's workspace up (stream-K zeroes its barriers with a memset), enqueues
  // `prepare` (the kernels that write A, B, alpha and bias; may be empty), then the GEMM as a
  // programmatic dependent launch of the last of them.
  static cudaError_t run(const WgmmaGemmArgs& g, cudaStream_t stream,
                         const std::function<cudaError_t()>& prepare, TileOrder order = {}) {
    const auto args = arguments(g.m, g.n, g.k, g.a, g.b, g.d, g.alpha, g.bias, sm_count(), order);
    if (!Kernel::can_implement(args)) return cudaErrorInvalidValue;
    if (Kernel::initialize_workspace(args, g.workspace, stream) != cutlass::Status::kSuccess) {
      return library_failure();
    }
    if (prepare) {
      if (const cudaError_t err = prepare(); err != cudaSuccess) return err;
    }
    const void* kernel = reinterpret_cast<const void*>(gemm_after_prior_grids<Kernel>);
    constexpr int kSmem = Kernel::SharedStorageSize;
    if (const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        err != cudaSuccess) {
      return err;
    }
    auto params = Kernel::to_underlying_arguments(args, g.workspace);
    void* kernel_params[] = {&params};
    const dim3 cluster(cute::size<0>(ClusterShape{}), cute::size<1>(ClusterShape{}), cute::size<2>(ClusterShape{}));
    if (cutlass::ClusterLauncher::launch(Kernel::get_grid_shape(params), cluster, Kernel::get_block_shape(), kSmem,
                                         stream, kernel, kernel_params, /*launch_with_pdl=*/true) !=
        cutlass::Status::kSuccess) {
      return library_failure();
    }
    return cudaGetLastError();
  }
};

}  // namespace sm90
}  // namespace jax_nvfp4
