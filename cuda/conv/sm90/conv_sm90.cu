// sm_90a shifted-operand convolution with NVFP4 weights (DESIGN.md §4, docs/conv.md): the
// launches of the register-A kernel, the choice between it and the warp-specialized kernel
// (choose_kernel), and the entry point conv_sm90. The kernels are in conv_sm90_register_a.cuh and
// conv_sm90_ws_kernel.cuh (what they share in conv_sm90_stage.cuh), the
// warp-specialized launches in conv_sm90_ws_launch.cuh.
#include <algorithm>
#include <cstdint>

#include "conv/sm90/conv_sm90.h"
#include "conv/sm90/conv_sm90_register_a.cuh"
#include "conv/sm90/conv_sm90_ws_kernel.cuh"
#include "conv/sm90/conv_sm90_ws.h"

namespace jax_nvfp4 {
namespace conv90 {
namespace {

// How a problem runs: stage buffers, shared memory, and the split of the stages over a cluster.
struct LaunchPlan {
  int nbuf = 2, smem = 0, splits = 1;
};

// Three stage buffers when the CTA runs more than two stages and they still leave room for two
// CTAs per SM, else two.
inline LaunchPlan plan_for(int stage_bytes, int table_bytes, int stages, int splits) {
  LaunchPlan plan;
  plan.splits = splits;
  plan.nbuf = ceil_div(stages, splits) > 2 && 3 * stage_bytes + table_bytes <= 112 * 1024 ? 3 : 2;
  plan.smem = plan.nbuf * stage_bytes + table_bytes;
  return plan;
}

// Split-K when the grid leaves SMs idle: the stages of each tile are divided over a cluster of
// `splits` CTAs along z. The largest split (at most 8, the portable cluster size) that keeps the
// grid within two CTAs per SM (a third CTA per SM was slower, on an H200), each CTA at three stages
// or more (split_takes), and the partial sums within the stage buffers.
inline bool split_takes(int splits, int64_t tiles, int stages, int sms) {
  return splits <= 8 && tiles * splits <= 2 * sms && stages >= 3 * splits;
}

inline LaunchPlan choose_plan(int stage_bytes, int table_bytes, int partial_bytes, int64_t tiles, int stages,
                              int sms) {
  LaunchPlan plan = plan_for(stage_bytes, table_bytes, stages, 1);
  for (int splits = 2; split_takes(splits, tiles, stages, sms); ++splits) {
    const LaunchPlan wider = plan_for(stage_bytes, table_bytes, stages, splits);
    if (partial_bytes > wider.nbuf * stage_bytes) break;
    plan = wider;
  }
  return plan;
}
template <ActKind kAct, int kBN, int kWGM, int kS>
cudaError_t launch(const ConvProblem& pb, cudaStream_t stream, int max_smem, int sms) {
  using K = Kernel<kAct, kBN, kWGM, kS, false>;
  const Geometry g = make_geometry(pb, kBN);
  const int stage = stage_layout(pb, g, K::kBM).total(), table = slot_table_bytes(g);
  const int64_t tiles = g.pixel_tiles * ceil_div(pb.k, K::kBM);
  if (plan_for(stage, table, pb.r * g.c_chunks, 1).smem > max_smem) return cudaErrorInvalidValue;
  // Split-K only for one-warpgroup CTAs (the narrow tiles that small grids get).
  const LaunchPlan plan = kWGM == 1 ? choose_plan(stage, table, K::kAcc * K::kThreads * 4, tiles, pb.r * g.c_chunks, sms)
                                    : plan_for(stage, table, pb.r * g.c_chunks, 1);
  // The shared-memory epilogue needs 2-byte outputs, 16-byte aligned pixel rows, and room for
  // its [BN][BM + 8] tile in the stage buffers.
  const bool staged = (pb.out_dtype == DType::kBF16 || pb.out_dtype == DType::kF16) && pb.k % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(pb.out) % 16 == 0 &&
                      kBN * (K::kBM + 8) * 2 <= plan.nbuf * stage;
  const dim3 grid(static_cast<unsigned>(g.pixel_tiles), static_cast<unsigned>(ceil_div(pb.k, K::kBM)),
                  static_cast<unsigned>(plan.splits));
  if constexpr (kWGM == 1) {
    if (plan.splits > 1) {
      return launch_ex(conv_sm90_kernel<kAct, kBN, kWGM, kS, true>, grid, K::kThreads, plan.smem, stream,
                       /*cluster_z=*/true, /*pdl=*/false, pb, g, plan.nbuf, staged);
    }
  }
  return launch_ex(conv_sm90_kernel<kAct, kBN, kWGM, kS, false>, grid, K::kThreads, plan.smem, stream,
                   /*cluster_z=*/false, /*pdl=*/false, pb, g, plan.nbuf, staged);
}

// bf16 activations with 3, 5 or 7 taps along W get the unrolled tap loop (tap s+1 decodes while
// tap s's wgmmas run); other widths and activation dtypes the runtime loop, which drains after
// every tap (with one tap the two are the same).
template <ActKind kAct, int kBN, int kWGM>
cudaError_t launch_taps(const ConvProblem& pb, cudaStream_t stream, int max_smem, int sms) {
  if constexpr (kAct == ActKind::kBF16) {
    switch (pb.s) {
      case 3: return launch<kAct, kBN, kWGM, 3>(pb, stream, max_smem, sms);
      case 5: return launch<kAct, kBN, kWGM, 5>(pb, stream, max_smem, sms);
      case 7: return launch<kAct, kBN, kWGM, 7>(pb, stream, max_smem, sms);
      default: break;
    }
  }
  return launch<kAct, kBN, kWGM, 0>(pb, stream, max_smem, sms);
}

// What the warp-specialized kernel takes: bf16 activations, 1, 3, 5 or 7 filter taps along W,
// and a 2-byte output whose pixel rows are 16-byte aligned (its epilogue stores 8 channels at a
// time).
bool ws_supported(const ConvProblem& pb) {
  return !pb.x_is_nvfp4 && pb.x_dtype == DType::kBF16 && ws_has_taps(pb.s) &&
         (pb.out_dtype == DType::kBF16 || pb.out_dtype == DType::kF16) && pb.k % 8 == 0 &&
         reinterpret_cast<uintptr_t>(pb.out) % 16 == 0;
}

// The register-A kernel: one warpgroup per CTA when K fits in 64 channels, or when 128-channel
// tiles would give fewer CTAs than two per SM (more, smaller CTAs keep every SM busy).
bool register_a_narrow(const ConvProblem& p, int sms) {
  return p.k <= 64 || make_geometry(p, 128).pixel_tiles * ceil_div(p.k, 128) < 2 * sms;
}

// Its pixels per tile with bf16 activations (the fallbacks where a tile's stages do not fit in
// shared memory aside): 256 when they still give every SM two CTAs (more reuse per weight decode);
// 64 when 128-pixel tiles would fill at most half the SMs (batch 1: 1.2-2x faster; at 7x7x512
// batch 32, 128 CTAs, they were 6 % slower).
int register_a_bn(const ConvProblem& p, int sms) {
  const bool narrow = register_a_narrow(p, sms);
  const int64_t k_tiles = ceil_div(p.k, narrow ? 64 : 128);
  if (narrow && 2 * make_geometry(p, 128).pixel_tiles * k_tiles <= sms) return 64;
  if (make_geometry(p, 256).pixel_tiles * k_tiles >= 2 * sms) return 256;
  return 128;
}

// How the two consumer warpgroups of a warp-specialized tile share it: 64 of its 128 output
// channels each (ws128xBN), alternate stages (ws64xBNks), or half its pixels each (ws64x256,
// ws64x416).
enum class ConsumerShare { kChannels, kStages, kPixels };

// Estimated microseconds of a warp-specialized launch whose tiles of `tile_pixels` pixels run
// `stages` stages of `taps` taps, split over clusters of `splits` CTAs, in `waves` rounds of
// tiles per SM (persistent CTAs; split-K runs one wave): a fixed cost, each consumer's serial
// chain of stages per tile (a stage of a wider wgmma takes longer, but far less than in
// proportion; a stage-split or pixel-split consumer's a little longer again), a persistent CTA's
// switch to its next tile, and the split's reduction. Only the comparison matters; a stage is
// taken as proportional to its taps. Fitted to the kernel alone on an H100, with a fixed cost per
// grid: the one-wave terms on every one-wave candidate of 24 grids of 3x3 filters (stride 1 and 2,
// batch 8 to 32, C and K 128 to 512), ranking the fastest first on all 24
// (bench/results/conv_decode_prmt_h100_2026-11-27.md); the pixel-split and next-tile terms, with
// those kept, on every tiling of 35 grids (batch 12 to 128, 3x3, 5x5 and 7x7 filters, C and K 64
// to 512, 25 of them over one wave): its choice is within 0.2 % of the fastest on all 35, where the
// widest tiling, taken before wherever nothing fit one wave, ran up to 1.42x slower
// (bench/results/conv_multi_wave_h100_2026-11-27.md).
double ws_estimate_us(int stages, int taps, int tile_pixels, int splits, ConsumerShare share, int64_t waves) {
  const int64_t chain = ceil_div(stages, splits * (share == ConsumerShare::kStages ? 2 : 1));  // a consumer's, a tile
  const int width = share == ConsumerShare::kPixels ? tile_pixels / 2 : tile_pixels;     // a consumer's wgmma N
  const double share_cost = share == ConsumerShare::kStages ? 0.054 : share == ConsumerShare::kPixels ? 0.0665 : 0.0;
  const double per_stage = (0.60 + 0.0044 * width + share_cost) * taps / 3.0;
  const double next_tile = 0.70 + 0.0066 * width;
  const double reduce = (splits - 1) * (2.2 + 0.011 * width);
  return 4.0 + static_cast<double>(waves * chain) * per_stage + static_cast<double>(waves - 1) * next_tile + reduce;
}

constexpr ConvSm90Choice kRegisterA{ConvSm90Kernel::kRegisterA, 1};

// Clusters of two run in one wave up to one CTA per SM; larger ones only up to 7/8 of the SMs (at
// 126-128 CTAs, clusters of three, four and eight ran like two waves: H100, kernel alone,
// bench/results/conv_stage_split_k_h100_2026-11-26.md).
bool clusters_fit(int splits, int64_t ctas, int sms) {
  return splits <= 2 ? ctas <= sms : 8 * ctas <= int64_t{7} * sms;
}

// Grids too small for choose_kernel's one-wave rule, with TMA loads: the stage split on 64- or
// 128-pixel tiles (ws64x64ks, ws64x128ks); the register-A kernel where neither's stages fit in
// shared memory. A consumer's time is its serial chain of stages and taps, so more CTAs with
// shorter chains win until a split's exchange of partial sums costs more than it saves; 64-pixel
// tiles give twice the CTAs without an exchange, each stage's taps taking ~0.3 us against ~0.4
// (the same weight decodes, half the MMAs). Of the candidates whose CTAs fit in one wave, the one
// of least estimated time: 3.18 us + consumer 0's chain x (0.311 a tap + 0.267 a stage on 64
// pixels, 0.402 + 0.230 on 128) + the split's exchange, 2.21 or 2.17 us over 2 or 4 CTAs on 64
// pixels, 2.47, 3.26, 2.88 or 3.46 over 2, 3, 4 or 8 on 128 (over three, six owners share eight
// 16-pixel epilogue passes: WsKernel::pass_pixels). Where each consumer runs at most two stages,
// or three of at most three taps, unsplit only (split, such short chains ran 4-10 % slower than
// estimated). Fitted to the kernel alone on 101 grids of batch 1 to 32 on an H100 (0.43 us rms;
// the 3-CTA split from another run, as the 4-CTA one + 0.38 us), and against the choice before
// (128-pixel tiles only) in the same run: bench/results/conv_pass_width_h100_2026-11-26.md.
ConvSm90Choice small_grid_choice(const ConvProblem& pb, const Geometry& base, int sms, int max_smem) {
  if (!ws_tma_supported(pb)) return kRegisterA;
  struct Width {  // a tiling and what each tap and stage of a consumer's chain costs on it
    int bn;
    ConvSm90Kernel kernel;
    double per_tap, per_stage;
  };
  constexpr Width k64{64, ConvSm90Kernel::kWs64x64Ks, 0.311, 0.267};
  constexpr Width k128{128, ConvSm90Kernel::kWs64x128Ks, 0.402, 0.230};
  struct Candidate {
    Width width;
    int splits;
    double exchange;  // the split's exchange of partial sums
  };
  constexpr Candidate kCandidates[] = {{k64, 1, 0.0},   {k64, 2, 2.21},  {k64, 4, 2.17},  {k128, 1, 0.0},
                                       {k128, 2, 2.47}, {k128, 3, 3.26}, {k128, 4, 2.88}, {k128, 8, 3.46}};
  const int stages = pb.r * base.c_chunks;  // as choose_kernel counts them
  const int consumer_stages = ceil_div(stages, 2);
  const bool short_chain = consumer_stages <= 2 || (consumer_stages <= 3 && consumer_stages * pb.s <= 9);
  ConvSm90Choice best = kRegisterA;
  double best_us = 0;
  for (const Candidate& c : kCandidates) {
    if ((short_chain && c.splits > 1) || c.splits > stages) continue;
    const Width& w = c.width;
    const int64_t tiles = with_tile(base, w.bn).pixel_tiles * ceil_div(pb.k, 64);
    if (!clusters_fit(c.splits, tiles * c.splits, sms) ||
        !ws_tma_stages_fit(pb, base, w.bn, 64, max_smem, /*stage_split=*/true)) {
      continue;
    }
    const int chain = static_cast<int>(ceil_div(ceil_div(stages, c.splits), 2));  // consumer 0's stages
    const double us = 3.18 + chain * (w.per_tap * static_cast<double>(pb.s) + w.per_stage) + c.exchange;
    if (best.kernel == ConvSm90Kernel::kRegisterA || us < best_us) {
      best = {w.kernel, c.splits};
      best_us = us;
    }
  }
  return best;
}

// The library's choice (H200 and H100 kernel timings, docs/conv.md). The warp-specialized kernel
// where it takes the problem and its CTAs give at least three quarters of the SMs work (S = 3; two
// thirds for the tilings with TMA loads and K >= 128), or half of them (other S: there the
// register-A kernel runs its taps in a loop that drains after each, and lost to a 68 %-full
// warp-specialized grid by 2.3x, 7x1 filter on an H100); otherwise (small_grid_choice) the stage
// split on 64- or 128-pixel tiles, split-K over the cluster size, whose chains and exchange are
// estimated shortest, or, with TMA loads where none of those fits in one wave, the
// warp-specialized tiling anyway.
// - TMA loads, K >= 128: of the tilings whose stages fit in shared memory (wide filters with a
//   stride may not), the one of least ws_estimate_us: 128-channel ones, 64-channel ones whose
//   consumers split the stages, each unsplit or split-K over a cluster of two (in one wave), and
//   the pixel split unsplit. The kernel is bound by each consumer's serial chain of decodes and
//   wgmmas, so more CTAs with less work each win while they fit in a wave, and past one wave the
//   tiling whose busiest SM has the least work. On a tie the earlier in that order. Clusters of
//   three and four lost to two on the H200 (128 CTAs in clusters of four timed like two waves).
// - TMA loads, K <= 64: the pixel split (64 channels x 256 or 416 pixels), the width whose
//   busiest SM has the fewest pixels (waves times width; the wider on a tie: fewer tiles), 416
//   only where two of its stages fit in shared memory (not with two phase arrays).
// - cp.async loads (C % 32 == 16, or what the im2col walk cannot take), K >= 128: 256-pixel
//   tiles, else 128-pixel ones.
ConvSm90Choice choose_kernel(const ConvProblem& pb, int sms, int max_smem) {
  if (!ws_supported(pb)) return kRegisterA;
  const Geometry base = problem_geometry(pb);  // with_tile(base, bn) for each width weighed
  const int64_t enough = pb.s == 3 ? (3 * sms + 3) / 4 : (sms + 1) / 2;
  // The tilings below with TMA loads and K >= 128 from two thirds of the SMs on: at 3x3 b24 their
  // 88-96 CTAs ran as fast as small_grid_choice's tiling or faster (7x7x512: ws64x224ks/s2 17.0
  // against 18.5 us, H100, kernel alone).
  const int64_t one_wave_enough = std::min(enough, int64_t{(2 * sms + 2) / 3});
  auto pick = [&](ConvSm90Kernel kind, int64_t ctas, int splits = 1, int64_t need = 0) {
    if (ctas >= (need > 0 ? need : enough)) return ConvSm90Choice{kind, splits};
    const ConvSm90Choice small = small_grid_choice(pb, base, sms, max_smem);
    // A grid too large for every small-grid candidate to run in one wave, yet short of the CTAs
    // wanted with this tiling (3x3 28x28x128 b22: ws128x208, 86 CTAs): this tiling, not the
    // register-A kernel (at b24 with the 3/4 threshold: 14.5 against 38.5 us, H100, kernel alone).
    return small.kernel == ConvSm90Kernel::kRegisterA && ws_tma_supported(pb) ? ConvSm90Choice{kind, splits} : small;
  };
  if (ws_tma_supported(pb) && pb.k <= 64) {
    const int64_t tiles256 = with_tile(base, 256).pixel_tiles, tiles416 = with_tile(base, 416).pixel_tiles;
    if (ws_tma_stages_fit(pb, base, 416, 64, max_smem) &&
        ceil_div(tiles416, sms) * 416 <= ceil_div(tiles256, sms) * 256) {
      return pick(ConvSm90Kernel::kWs64x416, tiles416);
    }
    return pick(ConvSm90Kernel::kWs64x256, tiles256);
  }
  if (pb.k < 128) return kRegisterA;
  if (ws_tma_supported(pb)) {
    struct Tiling {
      ConvSm90Kernel kernel;
      int pixels, channels;
      ConsumerShare share;
    };
    constexpr ConsumerShare kChannels = ConsumerShare::kChannels, kStages = ConsumerShare::kStages,
                            kPixels = ConsumerShare::kPixels;
    constexpr Tiling kTilings[] = {
        {ConvSm90Kernel::kWs128x64, 64, 128, kChannels},   {ConvSm90Kernel::kWs128x112, 112, 128, kChannels},
        {ConvSm90Kernel::kWs128x128, 128, 128, kChannels}, {ConvSm90Kernel::kWs128x208, 208, 128, kChannels},
        {ConvSm90Kernel::kWs128x256, 256, 128, kChannels}, {ConvSm90Kernel::kWs64x128Ks, 128, 64, kStages},
        {ConvSm90Kernel::kWs64x224Ks, 224, 64, kStages},   {ConvSm90Kernel::kWs64x256Ks, 256, 64, kStages},
        {ConvSm90Kernel::kWs64x256, 256, 64, kPixels},     {ConvSm90Kernel::kWs64x416, 416, 64, kPixels}};
    const int stages = pb.r * base.c_chunks;
    ConvSm90Choice best = kRegisterA;
    int64_t best_ctas = 0;
    double best_us = 0;
    for (const Tiling& t : kTilings) {
      // Split-K (a cluster per tile, in one wave) for the 128-channel and the stage-split tilings.
      const int max_splits = t.share == kPixels ? 1 : 2;
      for (int splits = 1; splits <= max_splits && splits * (t.share == kStages ? 2 : 1) <= stages; ++splits) {
        const int64_t tiles = with_tile(base, t.pixels).pixel_tiles * ceil_div(pb.k, t.channels);
        const int64_t ctas = tiles * splits;
        if ((splits > 1 && ctas > sms) ||
            !ws_tma_stages_fit(pb, base, t.pixels, t.channels, max_smem, t.share == kStages,
                               /*one_tile_per_cta=*/ctas <= sms)) {
          continue;
        }
        const double us = ws_estimate_us(stages, static_cast<int>(pb.s), t.pixels, splits, t.share,
                                         ceil_div(ctas, int64_t{sms}));
        if (best.kernel == ConvSm90Kernel::kRegisterA || us < best_us) {
          best = {t.kernel, splits};
          best_ctas = ctas;
          best_us = us;
        }
      }
    }
    if (best.kernel == ConvSm90Kernel::kRegisterA) return best;
    return pick(best.kernel, best_ctas, best.splits, one_wave_enough);
  }
  const int64_t k_tiles = ceil_div(pb.k, 128);
  if (with_tile(base, 256).pixel_tiles * k_tiles >= enough) return {ConvSm90Kernel::kWs128x256, 1};
  return pick(ConvSm90Kernel::kWs128x128, with_tile(base, 128).pixel_tiles * k_tiles);
}
// Launches warp-specialized tiling `kernel` (not kAuto or kRegisterA); cudaErrorInvalidValue,
// with nothing enqueued, when it does not take the problem. With `plan`, fills it instead.
cudaError_t launch_warp_specialized(const ConvProblem& p, cudaStream_t stream, ConvSm90Kernel kernel, int max_smem,
                                    int sms, int splits, ConvSm90WsPlan* plan = nullptr) {
  switch (p.s) {
    case 1: return launch_ws_taps<1>(p, stream, kernel, max_smem, sms, splits, plan);
    case 3: return launch_ws_taps<3>(p, stream, kernel, max_smem, sms, splits, plan);
    case 5: return launch_ws_taps<5>(p, stream, kernel, max_smem, sms, splits, plan);
    case 7: return launch_ws_taps<7>(p, stream, kernel, max_smem, sms, splits, plan);
    default: return cudaErrorInvalidValue;
  }
}

int device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&value, attr, device);
  return value;
}

}  // namespace
}  // namespace conv90

ConvSm90Choice conv_sm90_choice(const ConvProblem& p, int sms, int max_smem) {
  return conv90::choose_kernel(p, sms, max_smem);
}

ConvSm90Tile conv_sm90_tile(const ConvProblem& p, ConvSm90Kernel kernel, int sms) {
  switch (kernel) {
    case ConvSm90Kernel::kWs128x64: return {128, 64};
    case ConvSm90Kernel::kWs128x112: return {128, 112};
    case ConvSm90Kernel::kWs128x128:
    case ConvSm90Kernel::kWs128x128CpAsync: return {128, 128};
    case ConvSm90Kernel::kWs128x208: return {128, 208};
    case ConvSm90Kernel::kWs128x256:
    case ConvSm90Kernel::kWs128x256CpAsync: return {128, 256};
    case ConvSm90Kernel::kWs64x256: return {64, 256};
    case ConvSm90Kernel::kWs64x416: return {64, 416};
    case ConvSm90Kernel::kWs64x64Ks: return {64, 64};
    case ConvSm90Kernel::kWs64x128Ks: return {64, 128};
    case ConvSm90Kernel::kWs64x224Ks: return {64, 224};
    case ConvSm90Kernel::kWs64x256Ks: return {64, 256};
    default: return {conv90::register_a_narrow(p, sms) ? 64 : 128, conv90::register_a_bn(p, sms)};
  }
}

cudaError_t conv_sm90_ws_plan(const ConvProblem& p, ConvSm90Kernel kernel, int splits, ConvSm90WsPlan* plan) {
  using namespace conv90;
  if (kernel == ConvSm90Kernel::kAuto || kernel == ConvSm90Kernel::kRegisterA || !ws_supported(p)) {
    return cudaErrorInvalidValue;
  }
  return launch_warp_specialized(p, nullptr, kernel, device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin),
                                 device_attribute(cudaDevAttrMultiProcessorCount), std::max(splits, 1), plan);
}

cudaError_t conv_sm90(const ConvProblem& p, cudaStream_t stream, ConvSm90Kernel kernel, int splits) {
  using namespace conv90;
  if (p.n * p.p * p.q == 0 || p.k == 0) return cudaSuccess;
  const int max_smem = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  const bool ws = kernel != ConvSm90Kernel::kAuto && kernel != ConvSm90Kernel::kRegisterA;
  if ((ws && !ws_supported(p)) || (!ws && splits > 1)) return cudaErrorInvalidValue;
  if (kernel == ConvSm90Kernel::kAuto) {
    const ConvSm90Choice choice = choose_kernel(p, sms, max_smem);
    if (choice.kernel != ConvSm90Kernel::kRegisterA) {
      const cudaError_t err = launch_warp_specialized(p, stream, choice.kernel, max_smem, sms, choice.splits);
      // What choose_kernel does not check may still not fit (a split's partial sums in its stage
      // ring, the cp.async tilings' stages): then nothing was enqueued, and the register-A kernel
      // takes the problem.
      if (err != cudaErrorInvalidValue) return err;
    }
  } else if (ws) {
    return launch_warp_specialized(p, stream, kernel, max_smem, sms, std::max(splits, 1));
  }
  const bool narrow = register_a_narrow(p, sms);
  if (p.x_is_nvfp4) {
    return narrow ? launch_taps<ActKind::kNvfp4, 128, 1>(p, stream, max_smem, sms)
                  : launch_taps<ActKind::kNvfp4, 128, 2>(p, stream, max_smem, sms);
  }
  if (p.x_dtype == DType::kF32) {
    return narrow ? launch_taps<ActKind::kF32, 128, 1>(p, stream, max_smem, sms)
                  : launch_taps<ActKind::kF32, 128, 2>(p, stream, max_smem, sms);
  }
  if (p.x_dtype == DType::kF16) {
    return narrow ? launch_taps<ActKind::kF16, 128, 1>(p, stream, max_smem, sms)
                  : launch_taps<ActKind::kF16, 128, 2>(p, stream, max_smem, sms);
  }
  const int bn = register_a_bn(p, sms);
  if (bn == 64) {
    const cudaError_t err = launch_taps<ActKind::kBF16, 64, 1>(p, stream, max_smem, sms);
    if (err != cudaErrorInvalidValue) return err;
  }
  if (bn == 256) {
    const cudaError_t err = narrow ? launch_taps<ActKind::kBF16, 256, 1>(p, stream, max_smem, sms)
                                   : launch_taps<ActKind::kBF16, 256, 2>(p, stream, max_smem, sms);
    if (err != cudaErrorInvalidValue) return err;
  }
  return narrow ? launch_taps<ActKind::kBF16, 128, 1>(p, stream, max_smem, sms)
                : launch_taps<ActKind::kBF16, 128, 2>(p, stream, max_smem, sms);
}

}  // namespace jax_nvfp4

