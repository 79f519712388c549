// The launches of the sm_90a warp-specialized convolution kernel for one filter width S, included
// by conv_sm90_ws_s<S>.cu, which instantiates launch_ws_taps<S> (conv_sm90_ws.h).
#pragma once

#include "conv/sm90/conv_sm90_ws_kernel.cuh"
#include "conv/sm90/conv_sm90_ws.h"

namespace jax_nvfp4 {
namespace conv90 {
namespace {

// Encodes the TMA maps of the warp-specialized kernel (bn pixels x bm channels a tile); false
// when the problem does not allow TMA loads (the cp.async producers run instead) or the driver
// refuses a map.
bool encode_ws_maps(const ConvProblem& pb, const Geometry& g, int bn, int bm, WsTmaMaps* maps) {
  if (!ws_tma_supported(pb)) return false;
  const Im2colBox box = im2col_box(pb, g);
  const auto c = static_cast<cuuint64_t>(pb.c), w = static_cast<cuuint64_t>(pb.w), h = static_cast<cuuint64_t>(pb.h);
  const cuuint64_t x_dims[4] = {c, w, h, static_cast<cuuint64_t>(pb.n)};
  const cuuint64_t x_strides[3] = {c * 2, w * c * 2, h * w * c * 2};  // bytes, dims 1..3
  const int lower[2] = {box.lower_w, box.lower_h}, upper[2] = {box.upper_w, box.upper_h};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  // The im2col walk's traversal strides: the conv's, along W and H.
  const cuuint32_t traversal[4] = {1, static_cast<cuuint32_t>(pb.stride_w), static_cast<cuuint32_t>(pb.stride_h), 1};
  auto im2col = [&](CUtensorMap* map, int pixels) {
    return CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeIm2col)(
               map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(pb.x), x_dims, x_strides, lower, upper,
               kChunkC, static_cast<cuuint32_t>(pixels), traversal, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  const cuuint64_t code_dims[3] = {c / 2, static_cast<cuuint64_t>(pb.k), static_cast<cuuint64_t>(pb.r) * pb.s};
  const cuuint64_t code_strides[2] = {c / 2, static_cast<cuuint64_t>(pb.k) * (c / 2)};
  const cuuint32_t code_box[3] = {kCodeRowBytes, static_cast<cuuint32_t>(bm), static_cast<cuuint32_t>(pb.s)};
  return im2col(&maps->act, bn) && im2col(&maps->act_halo, kHaloPixels) &&
         CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
             &maps->codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(pb.wgt.codes), code_dims,
             code_strides, code_box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The warp-specialized kernel with the deepest ring (ws_min_stages to 4 stages) that fits, as a
// programmatic dependent launch (back to back on an H200: 28x28x128 b32 20.6 against 22.2 us,
// 14x14x256 22.5 against 23.8; 56x56x64 unchanged). Unsplit: one CTA per SM looping over the
// tiles (the stage split's partial sums in the ring where that is one tile per CTA). Split-K over
// `splits` CTAs: one cluster per tile, whose partial sums need the stage ring to hold a CTA's
// accumulators (the stage split's: its partial-sum region), and each CTA at least one stage.
// With `plan`, fills it from the layout instead of launching.
template <int kBN, bool kTma, int kBM, int kS, bool kStageSplit = false>
cudaError_t launch_ws_kernel(const ConvProblem& pb, const Geometry& g, const WsTmaMaps& maps, cudaStream_t stream,
                             int max_smem, int sms, int splits, ConvSm90WsPlan* plan) {
  using K = WsKernel<kBN, kTma, kBM, false, kS, kStageSplit>;
  const int64_t k_tiles = ceil_div(pb.k, kBM);
  const int64_t tiles = g.pixel_tiles * k_tiles;
  if (!indices_fit_32(g, K::kTileN, tiles)) return cudaErrorInvalidValue;
  const FastDivide by_k_tiles = FastDivide::by(static_cast<uint32_t>(k_tiles));
  WsLayout L;
  for (int nbuf = 4; nbuf >= ws_min_stages(kStageSplit); --nbuf) {
    L = ws_layout(pb, g, kBM, K::kConsumers * K::kEpiBytes, nbuf, kTma, K::kPartialBytes,
                  /*partials_in_ring=*/splits > 1 || tiles <= sms);
    if (L.total <= max_smem) break;
  }
  if (L.total > max_smem) return cudaErrorInvalidValue;
  auto planned = [&] {
    *plan = {L.total, L.nbuf, L.inbox_offset != 0};
    return cudaSuccess;
  };
  if (splits == 1) {
    if (plan != nullptr) return planned();
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, sms)));
    return launch_ex(conv_sm90_ws_kernel<kBN, kTma, kBM, false, kS, kStageSplit>, grid, K::kThreads, L.total,
                     stream, /*cluster_z=*/false, /*pdl=*/true, pb, g, L, by_k_tiles, maps);
  }
  if constexpr (kTma && (kBM == 128 || kStageSplit)) {  // the tilings with a kSplitK instantiation
    const int64_t partial_bytes = kStageSplit ? 0 : int64_t{K::kAcc} * K::kConsumerThreads * 4;
    if (splits > kMaxWsSplits || splits > pb.r * g.c_chunks ||
        partial_bytes > int64_t{L.nbuf} * L.stage.total()) {
      return cudaErrorInvalidValue;
    }
    // An inbox for the other CTA's pushed sums, where it fits (K is the unsplit kernel: its kPushes
    // is false).
    if (kStageSplit && ws_stage_split_pushes(kBN, kS) && splits == 2) {
      const int inbox = (L.total + 15) / 16 * 16;
      const int total = inbox + K::kConsumers * ws_inbox_bytes(kBN, K::pass_pixels(2)) + K::kConsumers * 8;
      if (total <= max_smem) {
        L.inbox_offset = inbox;
        L.total = total;
      }
    }
    if (plan != nullptr) return planned();
    return launch_ex(conv_sm90_ws_kernel<kBN, kTma, kBM, true, kS, kStageSplit>,
                     dim3(static_cast<unsigned>(tiles), 1, static_cast<unsigned>(splits)), K::kThreads, L.total, stream,
                     /*cluster_z=*/true, /*pdl=*/true, pb, g, L, by_k_tiles, maps);
  }
  return cudaErrorInvalidValue;
}

// Pixel tile widths of the warp-specialized kernel: 128 and 256 with TMA or cp.async loads, the
// others (sizes that fill the SMs in one wave on ResNet stages) with TMA loads only.
constexpr bool ws_has_cp_async(int bn) { return bn == 128 || bn == 256; }

// TMA loads where encode_ws_maps allows them and `tma` asks for them, else cp.async (where the
// width has them; cudaErrorInvalidValue otherwise).
template <int kBN, int kS>
cudaError_t launch_ws(const ConvProblem& pb, cudaStream_t stream, int max_smem, int sms, bool tma, int splits,
                      ConvSm90WsPlan* plan) {
  WsTmaMaps maps{};
  const Geometry g_tma = make_geometry(pb, kBN, /*im2col=*/true);
  if (tma && encode_ws_maps(pb, g_tma, kBN, 128, &maps)) {
    return launch_ws_kernel<kBN, true, 128, kS>(pb, g_tma, maps, stream, max_smem, sms, splits, plan);
  }
  if constexpr (ws_has_cp_async(kBN)) {
    return launch_ws_kernel<kBN, false, 128, kS>(pb, make_geometry(pb, kBN), maps, stream, max_smem, sms, splits,
                                                  plan);
  }
  return cudaErrorInvalidValue;
}

// The 64-channel kernels, TMA loads only: the pixel split (64 channels x 2 * kBN pixels a tile,
// for K <= 64) or the stage split (64 channels x kBN pixels, the stages alternating between the
// consumers).
template <int kBN, int kS, bool kStageSplit>
cudaError_t launch_ws_64(const ConvProblem& pb, cudaStream_t stream, int max_smem, int sms, int splits,
                         ConvSm90WsPlan* plan) {
  using K = WsKernel<kBN, true, 64, false, kS, kStageSplit>;
  WsTmaMaps maps{};
  const Geometry g = make_geometry(pb, K::kTileN, /*im2col=*/true);
  if (!encode_ws_maps(pb, g, K::kTileN, 64, &maps)) return cudaErrorInvalidValue;
  return launch_ws_kernel<kBN, true, 64, kS, kStageSplit>(pb, g, maps, stream, max_smem, sms, splits, plan);
}

}  // namespace

template <int kS>
cudaError_t launch_ws_taps(const ConvProblem& pb, cudaStream_t stream, ConvSm90Kernel kernel, int max_smem, int sms,
                           int splits, ConvSm90WsPlan* plan) {
  switch (kernel) {
    case ConvSm90Kernel::kWs128x64: return launch_ws<64, kS>(pb, stream, max_smem, sms, true, splits, plan);
    case ConvSm90Kernel::kWs128x112: return launch_ws<112, kS>(pb, stream, max_smem, sms, true, splits, plan);
    case ConvSm90Kernel::kWs128x128: return launch_ws<128, kS>(pb, stream, max_smem, sms, true, splits, plan);
    case ConvSm90Kernel::kWs128x208: return launch_ws<208, kS>(pb, stream, max_smem, sms, true, splits, plan);
    case ConvSm90Kernel::kWs128x256: return launch_ws<256, kS>(pb, stream, max_smem, sms, true, splits, plan);
    case ConvSm90Kernel::kWs128x128CpAsync: return launch_ws<128, kS>(pb, stream, max_smem, sms, false, splits, plan);
    case ConvSm90Kernel::kWs128x256CpAsync: return launch_ws<256, kS>(pb, stream, max_smem, sms, false, splits, plan);
    case ConvSm90Kernel::kWs64x256: return launch_ws_64<128, kS, false>(pb, stream, max_smem, sms, splits, plan);
    case ConvSm90Kernel::kWs64x416: return launch_ws_64<208, kS, false>(pb, stream, max_smem, sms, splits, plan);
    case ConvSm90Kernel::kWs64x64Ks: return launch_ws_64<64, kS, true>(pb, stream, max_smem, sms, splits, plan);
    case ConvSm90Kernel::kWs64x128Ks: return launch_ws_64<128, kS, true>(pb, stream, max_smem, sms, splits, plan);
    case ConvSm90Kernel::kWs64x224Ks: return launch_ws_64<224, kS, true>(pb, stream, max_smem, sms, splits, plan);
    case ConvSm90Kernel::kWs64x256Ks: return launch_ws_64<256, kS, true>(pb, stream, max_smem, sms, splits, plan);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace conv90
}  // namespace jax_nvfp4
