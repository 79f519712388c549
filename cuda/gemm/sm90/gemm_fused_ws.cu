// Large-M NVFP4 GEMM for sm_90a without a dequantization pass: the fused kernel's math
// (gemm_fused.cu: weights dequantized straight into wgmma A registers, activations staged once
// per call by fused_staging.cu as the shared-memory B operand) in a warp-specialized, persistent
// kernel.
//
// The fused kernel runs one output tile per CTA as one chain (copies, a CTA barrier per chunk,
// decode, wgmma) and is bound by that chain's latency; at large M it loses to dequantize + GEMM.
// Here the roles are split:
//   producer   one warp. Per K chunk of 128: lane 0 copies the staged [kMT x 128] activation tile
//              (32 or 64 KB, contiguous) with one bulk copy (TMA, completion counted in bytes on the
//              stage's full barrier); all lanes copy the chunk's codes and scale tiles with
//              cp.async and arrive on the same barrier when those land
//              (cp.async.mbarrier.arrive). A ring of kStages stages; each is refilled once both
//              consumer warpgroups have released it.
//   consumers  two warpgroups, 64 weight rows each (wgmma M) x the tile's kMT activation rows
//              (N): wait for a stage, dequantize their rows' codes into registers, issue 8
//              register-A wgmmas; release the stage once the next chunk's wgmmas are issued and
//              this one's have retired (wgmma.wait_group 1), so the decode of chunk c + 1
//              overlaps the wgmmas of chunk c.
//   persistent one CTA per SM walks the 128 x kMT output tiles in groups of kGroupN weight tiles
//              (the tiles in flight at once share weight and activation tiles in L2); the
//              producer runs into the next tile's chunks while the consumers store this one.
//   split-K    where the tiles are too few to fill the GPU, a cluster of up to 8 CTAs shares
//              each tile, one part of K each, and one_wave_split (cluster_split.cuh) keeps the
//              whole grid one wave: one tile per cluster. The parts meet through distributed
//              shared memory in the idle stage ring (split_sum.cuh). The tiles of a last partial
//              wave take such a launch of their own after the whole waves' persistent one.
// Two tile widths: kMT = 128, and kMT = 256 ("wide"), whose m64n256 wgmmas share each decoded
// weight fragment between twice the activation rows (half the decode instructions per flop). Its
// 128 accumulators a thread need more registers than 9 warps leave (168), so there the producer
// is a warpgroup that gives its registers to the consumers (setmaxnreg); its 64 KB activation
// stages leave no room for separate epilogue tiles, so the consumers write their tiles into the
// x half of the tile's last stage and release that stage after the epilogue.
// Ragged GEMMs (GemmProblem::group_sizes) run on tiles of 64, 128 or 256 staged rows (the first
// for them only: few rows a group): the staging kernel stages each group's rows from a tile
// boundary, and a tile is a weight tile of one group and a staged tile of that group's rows
// (MMAs on other rows only in a group's last, partial tile). The tiles are found on the device
// (ragged_groups.cuh), so one launch serves any routing; a small kernel before it writes the
// zeros of the rows outside every group.
// Epilogue: alpha, bias, activation, output cast, through a per-warpgroup shared-memory tile whose
// rows leave as 16-byte pieces (tile_epilogue.cuh); element by element where the output rows are
// not whole pieces or f16/f32 x gives two staged rows per x row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "common/launch_config.cuh"
#include "common/scale_layout.h"
#include "common/sm90_async.cuh"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "gemm/sm90/cluster_split.cuh"
#include "gemm/sm90/fused_staging.h"
#include "gemm/sm90/fused_weights.cuh"
#include "gemm/sm90/gemm_sm90_internal.h"
#include "gemm/sm90/ragged_groups.cuh"
#include "gemm/sm90/split_sum.cuh"
#include "gemm/sm90/tile_epilogue.cuh"

namespace jax_nvfp4 {
namespace sm90 {
namespace {

using namespace hopper;
using fused::kChunk;
using fused::kRows;
using fused::kSteps;
using fused::kWeightStageBytes;
using Barrier = cutlass::arch::ClusterBarrier;
using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

constexpr int kConsumers = 2;  // warpgroups
constexpr int kGroupN = 16;    // weight tiles per raster group
// K chunks a split part needs at least. H100, M = 128, split 2: with 4 chunks a part (8192 x 1024)
// the split lost to the unsplit kernel, 13.8 against 12.8 us; with 8 (8192 x 2048) it won, 17.3
// against 19.1.
constexpr int kMinChunksPerSplit = 8;
// Full barrier: the producer lanes' cp.async arrivals plus lane 0's arrival with the byte count.
constexpr int kFullArrivals = 32 + 1;
constexpr int kEmptyArrivals = 128 * kConsumers;
constexpr int kConsumersBarrier = 1 + kConsumers;  // named barrier of both consumer warpgroups
                                                   // (1 + w: warpgroup w's epilogue)

// Staged rows a tile of the narrow or the wide kernel, and of the kernel that runs ragged GEMMs only
// (few rows a group: half the narrow tile's MMAs on rows of other groups).
constexpr int tile_rows(bool wide) { return wide ? 256 : 128; }
constexpr int kRaggedOnlyRows = 64;

// Shared memory and threads of the kernel whose tiles are kMT staged rows wide.
template <int kMT>
struct Config {
  static constexpr bool kWide = kMT == tile_rows(true);
  static constexpr int kAcc = kMT / 2;
  static constexpr int kXStageBytes = kMT * kChunk * 2;
  static constexpr int kStageBytes = kXStageBytes + kWeightStageBytes;
  // 64-row tiles: half the MMAs a stage, so more stages in flight.
  static constexpr int kStages = kWide ? 3 : kMT == kRaggedOnlyRows ? 6 : 4;
  static constexpr int kProducerThreads = kWide ? 128 : 32;  // setmaxnreg moves a warpgroup's registers
  static constexpr int kThreads = 128 * kConsumers + kProducerThreads;
  // kWide: the epilogue tiles live in the last stage of the tile (see the top of the file).
  static constexpr int kEpilogueBytes = kWide ? 0 : kConsumers * fused::kEpilogueTileBytes;
  static constexpr int kBarrierOffset = kStages * kStageBytes + kEpilogueBytes;
  static constexpr int kSmemBytes = kBarrierOffset + 2 * kStages * 8;
  // setmaxnreg only moves registers within what the CTA got at launch (65536 / kThreads a thread,
  // rounded down to 8: 168; asking for more hangs). A consumer needs up to 198 (128
  // accumulators); the producer's unrolled copies spilled with 80.
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  static constexpr int kProducerRegs = 104, kConsumerRegs = 200;
  static_assert(kStageBytes % 1024 == 0, "stages keep the activation tiles' swizzle atoms 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(!kWide || kConsumers * fused::kEpilogueTileBytes <= kXStageBytes, "epilogue tiles in a stage");
  static_assert(128 * kConsumers == fused::kSplitThreads &&
                    fused::split_partial_bytes<kAcc>() + kConsumers * fused::kEpilogueTileBytes <= kStages * kStageBytes,
                "split-K's partial tile and epilogue tiles in the stage ring");
  static_assert(!kWide || kProducerRegs * kProducerThreads + kConsumerRegs * 128 * kConsumers <= kLaunchRegs * kThreads,
                "the registers the CTA got at launch");
};

// The K chunks of this CTA's part of its tiles: all of them unless split over a cluster along z.
// (32-bit: a 64-bit division's registers spilled in the producer.)
struct ChunkRange {
  int begin, end;
  __device__ __forceinline__ static ChunkRange of_this_rank(int64_t chunks) {
    const int n = static_cast<int>(chunks), split = static_cast<int>(gridDim.z), rank = static_cast<int>(blockIdx.z);
    return {n * rank / split, n * (rank + 1) / split};
  }
};

struct Tiles {
  int64_t n_tiles, m_tiles;  // m_tiles: of a ragged GEMM, its items (see Work), set on the device
  int64_t first, end;  // the tiles of this launch, in the order of coords
  // Tile t: groups of kGroupN weight tiles, the activation tiles in order within a group, so the
  // tiles of one round share about kGroupN weight tiles and (tiles a round) / kGroupN activation
  // tiles.
  __device__ __forceinline__ void coords(int64_t t, int64_t& n_tile, int64_t& m_tile) const {
    const int64_t group = t / (kGroupN * m_tiles), group_n0 = group * kGroupN;
    const int64_t width = min(static_cast<int64_t>(kGroupN), n_tiles - group_n0);
    const int64_t idx = t - group_n0 * m_tiles;
    n_tile = group_n0 + idx % width;
    m_tile = idx / width;
  }
};

// What output tile t of a launch holds: weight tile n_tile of group `group` (0 unless ragged),
// staged activation tile m_tile, and the output rows [row_begin, row_end) it stores. A ragged
// GEMM's staged tiles are, group by group, its groups' rows in tiles of x_rows rows
// (group_tile_rows, as fused_staging.cu stages them); Tiles::m_tiles counts them.
struct Work {
  int64_t n_tile, m_tile, group, row_begin, row_end;
};

template <bool kRagged>
__device__ __forceinline__ Work work_of(const GemmProblem& p, const Tiles& tiles, int64_t t, int64_t x_rows) {
  Work w;
  tiles.coords(t, w.n_tile, w.m_tile);
  w.group = 0;
  w.row_begin = 0;
  w.row_end = p.m;
  if constexpr (kRagged) {
    const TileRows rows = group_tile_rows(p, w.m_tile, x_rows);
    w.group = rows.group;
    w.row_begin = rows.begin;
    w.row_end = rows.end;
  }
  return w;
}

// The weights (codes, scales, s_dec) and bias of the tile's group.
template <bool kRagged>
__device__ __forceinline__ GemmProblem group_problem(const GemmProblem& p, const Work& w) {
  GemmProblem q = p;
  if constexpr (kRagged) {
    const GemmStack& s = p.stack;
    q.b = {advanced(p.b.codes, w.group * s.b_codes), advanced(p.b.scales, w.group * s.b_scales),
           advanced(p.b.s_dec, w.group * s.b_s_dec)};
    q.bias = advanced(p.bias, w.group * s.bias);
    q.m = w.row_end;
  }
  return q;
}

template <int kMT, int kPiece, bool kRagged>
__device__ void produce(const GemmProblem& p, const uint8_t* xs, int64_t chunks, int64_t x_rows, const Tiles& tiles,
                        uint8_t* smem, uint64_t* full, uint64_t* empty) {
  using S = Config<kMT>;
  constexpr int kStages = S::kStages, kStageBytes = S::kStageBytes, kXStageBytes = S::kXStageBytes;
  const int lane = threadIdx.x % 32;
  const int64_t k_tiles = scale_k_tiles(p.k / kBlockSize);
  const ChunkRange part = ChunkRange::of_this_rank(chunks);
  int it = 0;
  for (int64_t tile = tiles.first + blockIdx.x; tile < tiles.end; tile += gridDim.x) {
    const Work w = work_of<kRagged>(p, tiles, tile, x_rows);
    const GemmProblem q = group_problem<kRagged>(p, w);
    fused::WeightCopier<32, kPiece> wc;
    wc.setup(q, w.n_tile * kRows, lane);
    const uint8_t* x_src = xs + w.m_tile * chunks * kXStageBytes;
    for (int c = part.begin; c < part.end; ++c, ++it) {
      const int buf = it % kStages;
      Barrier::wait(&empty[buf], ((it / kStages) & 1) ^ 1);
      uint8_t* stage = smem + buf * kStageBytes;
      if (lane == 0) {
        TxBarrier::arrive_and_expect_tx(&full[buf], kXStageBytes);
        cute::SM90_BULK_COPY_G2S::copy(x_src + c * kXStageBytes, &full[buf], stage, kXStageBytes);
      }
      wc.copy(q, c, k_tiles, stage + kXStageBytes);
      cutlass::arch::cpasync_barrier_arrive_noinc(&full[buf]);
    }
  }
}

template <int kMT, bool kRagged>
__device__ void consume(const GemmProblem& p, int64_t chunks, int rows_per_x_row, const Tiles& tiles, uint8_t* smem,
                        uint64_t* full, uint64_t* empty) {
  using S = Config<kMT>;
  constexpr int kStages = S::kStages, kStageBytes = S::kStageBytes, kXStageBytes = S::kXStageBytes;
  const int w = threadIdx.x / 128, ct = threadIdx.x % 128;
  const int lane = ct % 32, t = lane % 4;
  const int r0 = w * 64 + (ct / 32) * 16 + lane / 4;  // this thread's rows r0, r0 + 8 of the tile
  const bool gated = is_gated(p.activation);
  const int2 rows = fused::mma_row_sources(r0, gated);
  const int64_t k_blocks = p.k / kBlockSize;
  float acc[S::kAcc];
  // A chunk is decoded and multiplied in two halves of 4 k-steps, alternating between two
  // register buffers: half h + 1 is decoded while half h's wgmmas run. (Whole-chunk buffers need
  // more registers than the 168 a thread that 9 warps leave: ptxas would serialize the wgmmas.)
  uint32_t frag[2][kSteps / 2][4];
  int it = 0;

  const ChunkRange part = ChunkRange::of_this_rank(chunks);
  auto half_step = [&](int c, int h) {
    const int buf = it % kStages;
    if (h == 0) Barrier::wait(&full[buf], (it / kStages) & 1);
    const uint8_t* stage = smem + buf * kStageBytes;
    fused::dequant_half(stage + kXStageBytes, rows, t, h, c * (kChunk / kBlockSize) + 2 * t, k_blocks, frag[h]);
    const uint32_t x_addr = smem_addr(stage);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps / 2; ++s) {
      const uint32_t offset = staged_k_step_offset<kMT>(h * (kSteps / 2) + s);
      WgmmaRS<kMT>::run(acc, frag[h][s], smem_descriptor_swizzle128(x_addr + offset, 1024));
    }
    wgmma_commit();
    wgmma_wait<1>();  // the previous half retired: its registers (and, after a chunk, its stage) are free
    if (h == 0 && c > part.begin) Barrier::arrive(&empty[(it - 1) % kStages]);
    if (h == 1) ++it;
  };

  for (int64_t tile = tiles.first + blockIdx.x; tile < tiles.end; tile += gridDim.x) {
    const Work work = work_of<kRagged>(p, tiles, tile, kMT / rows_per_x_row);
    const int64_t n_tile = work.n_tile;
#pragma unroll
    for (int i = 0; i < S::kAcc; ++i) acc[i] = 0.f;
    fence_accumulators(acc);
#pragma unroll 1
    for (int c = part.begin; c < part.end; ++c) {
      half_step(c, 0);
      half_step(c, 1);
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    const GemmProblem q = group_problem<kRagged>(p, work);
    const float alpha = fused::alpha(q);
    // The tile's first staged row, in the epilogue's terms (output row times rows_per_x_row).
    const int64_t m0 = kRagged ? work.row_begin * rows_per_x_row : work.m_tile * kMT;
    const int64_t n0 = n_tile * kRows + w * 64;
    if (!kRagged && gridDim.z > 1) {  // split-K: this cluster's only tile, so the whole ring is idle now
      fused::named_sync(kConsumersBarrier, 128 * kConsumers);  // both warpgroups' wgmmas are done with it
      with_activation(p.activation, [&](auto act) {
        fused::sum_split_and_store<decltype(act)::value, kMT>(p, rows_per_x_row, n_tile * kRows, m0, alpha, acc, smem,
                                                              threadIdx.x);
      });
      continue;
    }
    uint8_t* epi = smem + kStages * kStageBytes + w * fused::kEpilogueTileBytes;
    if constexpr (S::kWide) {
      fused::named_sync(kConsumersBarrier, 128 * kConsumers);  // both warpgroups' wgmmas are done with the stage
      epi = smem + ((it - 1) % kStages) * kStageBytes + w * fused::kEpilogueTileBytes;
    } else {
      Barrier::arrive(&empty[(it - 1) % kStages]);
    }

    with_activation(p.activation, [&](auto act) {
      constexpr Activation kAct = decltype(act)::value;
      if (!fused::store_through_tile<kAct, kMT>(q, rows_per_x_row, n0, m0, acc, alpha, epi, ct, 1 + w, ~0u,
                                                 work.row_begin)) {
        fused::store_fragment<kAct>(q, n_tile * kRows, r0, m0, t, rows_per_x_row, alpha, acc, work.row_begin);
      }
    });
    if constexpr (S::kWide) {
      fence_proxy_async();  // this thread's tile writes, ordered before the producer's next bulk copy there
      Barrier::arrive(&empty[(it - 1) % kStages]);
    }
  }
}

template <int kMT, int kPiece, bool kRagged>
__global__ void __launch_bounds__(Config<kMT>::kThreads, 1)
    fused_ws_kernel(const GemmProblem p, const uint8_t* xs, int64_t chunks, int rows_per_x_row, Tiles tiles) {
  using S = Config<kMT>;
  extern __shared__ __align__(1024) uint8_t smem[];
  auto* full = reinterpret_cast<uint64_t*>(smem + S::kBarrierOffset);
  uint64_t* empty = full + S::kStages;
  if (threadIdx.x == 0) {
    for (int i = 0; i < S::kStages; ++i) {
      Barrier::init(&full[i], kFullArrivals);
      Barrier::init(&empty[i], kEmptyArrivals);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  // Programmatic dependent launch (launch): the grid before this one, the staging kernel, may
  // still be writing the activations; nothing above touched global memory.
  wait_for_prior_grids();
  if constexpr (kRagged) {  // every warp counts the items (all its lanes: a full warp)
    tiles.m_tiles = group_item_count(p, group_tiles(kMT / rows_per_x_row));
    tiles.end = tiles.n_tiles * tiles.m_tiles;
  }
  if (threadIdx.x >= 128 * kConsumers) {
    if constexpr (S::kWide) cutlass::arch::warpgroup_reg_dealloc<S::kProducerRegs>();
    // Split-K's cluster barriers (sum_split_and_store) wait for the non-exited threads only: the
    // producer's leave at once.
    if (threadIdx.x < 128 * kConsumers + 32) {
      produce<kMT, kPiece, kRagged>(p, xs, chunks, kMT / rows_per_x_row, tiles, smem, full, empty);
    }
  } else {
    if constexpr (S::kWide) cutlass::arch::warpgroup_reg_alloc<S::kConsumerRegs>();
    consume<kMT, kRagged>(p, chunks, rows_per_x_row, tiles, smem, full, empty);
  }
}

// One launch over tiles.first .. end - 1: `split` > 1, a cluster of that many CTAs along z per
// tile (one wave); else persistent CTAs, at most one per SM.
template <int kMT, int kPiece, bool kRagged = false>
cudaError_t launch_tiles(const GemmProblem& p, const StagedActivations& x, const Tiles& tiles, int split,
                         cudaStream_t stream) {
  using S = Config<kMT>;
  const int64_t count = tiles.end - tiles.first;  // ragged: a bound (the kernel counts them)
  const int64_t grid = split > 1 ? count : std::min<int64_t>(count, sm_count());
  const LaunchConfig config(dim3(static_cast<unsigned>(grid), 1, static_cast<unsigned>(split)), dim3(S::kThreads),
                            S::kSmemBytes, stream, /*cluster_z=*/split > 1 ? split : 0, /*pdl=*/true);
  return cudaLaunchKernelEx(&config.cfg, fused_ws_kernel<kMT, kPiece, kRagged>, p,
                            static_cast<const uint8_t*>(p.workspace),
                            x.chunks, x.rows_per_x_row, tiles);
}

template <int kMT, int kPiece>
cudaError_t launch(const GemmProblem& p, const StagedActivations& x, cudaStream_t stream) {
  using S = Config<kMT>;
  // Also raises the kernel's shared-memory limit on this device (once).
  const ResidentBlocks capacity =
      resident_blocks<fused_ws_kernel<kMT, kPiece, false>>(dim3(S::kThreads), S::kSmemBytes);
  if (capacity[1] == 0) return cudaErrorInvalidConfiguration;  // the kernel cannot run here
  const int64_t n_tiles = ceil_div(p.n, kRows), count = n_tiles * x.m_tiles, sms = sm_count();
  const int split = one_wave_split(count, x.chunks, kMinChunksPerSplit, capacity);
  // Past whole waves, a last partial wave of tiles would leave most SMs idle: those tiles get a
  // launch of their own, split over clusters where they are few enough.
  const int64_t in_whole_waves = count / sms * sms;
  const int tail_split = one_wave_split(count - in_whole_waves, x.chunks, kMinChunksPerSplit, capacity);
  if (split == 1 && in_whole_waves > 0 && in_whole_waves < count && tail_split > 1) {
    if (cudaError_t err = launch_tiles<kMT, kPiece>(p, x, {n_tiles, x.m_tiles, 0, in_whole_waves}, 1, stream);
        err != cudaSuccess) {
      return err;
    }
    return launch_tiles<kMT, kPiece>(p, x, {n_tiles, x.m_tiles, in_whole_waves, count}, tail_split, stream);
  }
  return launch_tiles<kMT, kPiece>(p, x, {n_tiles, x.m_tiles, 0, count}, split, stream);
}

// The zeros of a ragged GEMM's output rows outside every group: those before *first_row and those
// after the last group. Each warp finds those rows (a sum of the group sizes) and clears its share.
__global__ void zero_ungrouped_rows(const GemmProblem p) {
  wait_for_prior_grids();  // programmatic dependent launch: the grid before may still be running
  const int lane = threadIdx.x % 32;
  int64_t rows = 0;
  for (int64_t g = lane; g < p.stack.count; g += 32) rows += max(static_cast<int64_t>(p.group_sizes[g]), int64_t{0});
  for (int o = 16; o > 0; o /= 2) rows += __shfl_xor_sync(0xffffffffu, rows, o);
  const int64_t first = ragged_first_row(p), after = min(first + rows, p.m);
  const int64_t cols = out_cols(p), outside = first + (p.m - after);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; i < outside; i += warps) {
    const int64_t row = i < first ? i : after + (i - first);
    for (int64_t c = lane; c < cols; c += 32) store_as(p.out, p.out_dtype, row * cols + c, 0.f);
  }
}

// A ragged GEMM: the zeros, then one persistent launch over a bound of the tiles (the staged
// tiles, ceil(M / x rows a tile) + min(G, M): each group with rows ends in at most one partial
// tile), which the kernel counts exactly. No split-K: the tiles are not known here.
template <int kMT, int kPiece>
cudaError_t launch_ragged(const GemmProblem& p, const StagedActivations& x, cudaStream_t stream) {
  using S = Config<kMT>;
  // Also raises the kernel's shared-memory limit on this device (once).
  if (resident_blocks<fused_ws_kernel<kMT, kPiece, true>>(dim3(S::kThreads), S::kSmemBytes)[1] == 0) {
    return cudaErrorInvalidConfiguration;  // the kernel cannot run here
  }
  const LaunchConfig zeros(dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div(p.m, 8), 4 * sm_count()))), dim3(256),
                           0, stream, /*cluster_z=*/0, /*pdl=*/true);
  if (cudaError_t err = cudaLaunchKernelEx(&zeros.cfg, zero_ungrouped_rows, p); err != cudaSuccess) return err;
  const int64_t n_tiles = ceil_div(p.n, kRows);
  return launch_tiles<kMT, kPiece, true>(p, x, {n_tiles, x.m_tiles, 0, n_tiles * x.m_tiles}, 1, stream);
}

template <int kMT>
cudaError_t run(const GemmProblem& p, cudaStream_t stream) {
  // Ragged GEMMs run on every tile width, the others on the 128- and 256-row ones.
  if (kMT == kRaggedOnlyRows && !p.ragged()) return cudaErrorInvalidValue;
  const StagedActivations x = staged_activations(p, kMT);
  if (p.workspace_bytes < x.bytes) return cudaErrorInvalidValue;
  if (cudaError_t err = stage_activations(p, x, stream); err != cudaSuccess) return err;
  // Rows of K/2 bytes are 16-byte aligned when K % 32 == 0; otherwise the codes come in 8-byte pieces.
  const bool vec16 = p.k % 32 == 0;
  if (p.ragged()) return vec16 ? launch_ragged<kMT, 16>(p, x, stream) : launch_ragged<kMT, 8>(p, x, stream);
  if constexpr (kMT != kRaggedOnlyRows) return vec16 ? launch<kMT, 16>(p, x, stream) : launch<kMT, 8>(p, x, stream);
  return cudaErrorInvalidValue;  // not reached: a dense GEMM on 64-row tiles was refused above
}

}  // namespace

size_t fused_ws_workspace_bytes(const GemmProblem& p, int mt) { return staged_activations(p, mt).bytes; }

int64_t fused_ws_output_tiles(const GemmProblem& p, int mt) {
  return ceil_div(p.n, kRows) * staged_activations(p, mt).m_tiles;
}

cudaError_t fused_ws_gemm(const GemmProblem& p, int mt, cudaStream_t stream) {
  switch (mt) {
    case kRaggedOnlyRows: return run<kRaggedOnlyRows>(p, stream);
    case tile_rows(false): return run<tile_rows(false)>(p, stream);
    case tile_rows(true): return run<tile_rows(true)>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace sm90
}  // namespace jax_nvfp4
