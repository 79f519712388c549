// Mid-M NVFP4 GEMM for sm_90a: the weights are dequantized inside the main loop, straight into
// the A-operand registers of wgmma, and multiply activations held in shared memory (B).
//
// Between decode (a few activation rows: a weight stream) and prefill (thousands: MMA-bound,
// where a separate pass dequantizing the weights to bf16 costs little) lies a range where that
// pass's 16-bit write and re-read of every weight costs more than the GEMM itself. Here each
// weight byte is read once per CTA from HBM/L2 and never written back.
//
// Work split: a CTA of two warpgroups owns 128 weight rows (64 per warpgroup, the wgmma's M; one
// scale tile) and MT rows of activations (the wgmma's N, 64 or 128), over a range of K chunks of
// 128 elements. Shared memory holds two cp.async rings:
//   weights      the chunk's codes (128 rows x 64 bytes) and its two 512-byte scale tiles,
//                kLw chunks ahead (from HBM); a buffer is free again once every thread has read
//                it;
//   activations  the chunk's [MT x 128] bf16 tile, kLx chunks ahead (from L2); the asynchronous
//                wgmma reads it, so a buffer is refilled only after the wgmmas of the chunk
//                before have retired everywhere (two chunks later).
// A thread's cp.async groups complete in order, so one thread loading both would wait for its
// young weight copies whenever it waits for an activation tile: the first warpgroup copies the
// activations, the second the weights, and each waits on its own ring's depth.
// Each thread dequantizes 32 elements of two weight rows per chunk (the decode kernel's lane
// layout: 16 bytes per row, pair j of a word = elements j and j + 4, nvfp4_bf16x2.h) into the
// registers of 8 wgmma k-steps while the previous chunk's wgmmas run.
//
// The MMA contracts its 16 k slots in any order shared by A and B, so the activations are laid
// out in the order the weights come out of the dequantization: the staging kernel
// (fused_staging.cu) writes x once per call as bf16 tiles in that K order and in wgmma's
// swizzled K-major layout, which makes a stage one contiguous copy; f16 and f32 x become a bf16
// hi row and lo row, whose two results the epilogue adds.
//
// Split-K over a thread-block cluster when the output tiles alone do not fill the GPU; the
// partial sums meet through distributed shared memory in rank order (cluster_split.cuh,
// split_sum.cuh).
// Epilogue: each warpgroup's results leave through a shared-memory tile in 16-byte pieces of
// output rows (tile_epilogue.cuh), split-K ranks taking alternate blocks of its rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/launch_config.cuh"
#include "common/scale_layout.h"
#include "common/sm90_async.cuh"
#include "gemm/sm90/cluster_split.cuh"
#include "gemm/sm90/fused_staging.h"
#include "gemm/sm90/fused_weights.cuh"
#include "gemm/sm90/gemm_sm90_internal.h"
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

constexpr int kThreads = 256;  // two warpgroups
constexpr int kLoaderThreads = 128;  // per ring: warpgroup 0 activations, 1 weights
constexpr int kMinChunksPerSplit = 4;  // the weight ring needs a few chunks to fill

// Ring depths per activation tile width (shared memory stays under the 227 KB limit).
template <int MT>
struct Tile {
  static constexpr int kXStageBytes = MT * kChunk * 2;
  static constexpr int kLx = 2;  // activation chunks in flight (they come from L2)
  static constexpr int kSx = kLx + 2;
  static constexpr int kLw = MT == 64 ? 10 : 8;  // weight chunks in flight (from HBM)
  static constexpr int kSw = kLw + 1;
  static constexpr int kSmemBytes = kSx * kXStageBytes + kSw * kWeightStageBytes;
  static constexpr int kAcc = MT / 2;  // accumulators per thread of an m64 x MT wgmma
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kThreads == fused::kSplitThreads &&
                    fused::split_partial_bytes<kAcc>() + 2 * fused::kEpilogueTileBytes <= kSx * kXStageBytes,
                "the activation ring holds the split-K partials and the epilogue tiles after them");
};

// --- The GEMM kernel ------------------------------------------------------------------------

template <int MT, bool kVec16>
__global__ void __launch_bounds__(kThreads, 1)
    fused_kernel(const GemmProblem p, const uint8_t* xs, int64_t chunks, int rows_per_x_row) {
  using Cfg = Tile<MT>;
  extern __shared__ __align__(1024) uint8_t smem[];  // swizzle atoms are 1024-byte aligned
  uint8_t* x_ring = smem;
  uint8_t* w_ring = smem + Cfg::kSx * Cfg::kXStageBytes;

  const int split = static_cast<int>(gridDim.z), rank = static_cast<int>(blockIdx.z);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t c_begin = chunks * rank / split;
  const int n_local = static_cast<int>(chunks * (rank + 1) / split - c_begin);
  const uint8_t* x_tiles = xs + static_cast<int64_t>(blockIdx.y) * chunks * Cfg::kXStageBytes;
  const int64_t k_blocks = p.k / kBlockSize, k_tiles = scale_k_tiles(k_blocks);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16 + g;  // warpgroup warp / 4 owns rows 64 (warp / 4) .. + 63
  const bool gated = is_gated(p.activation);
  const int2 rows = fused::mma_row_sources(r0, gated);
  const bool x_loader = threadIdx.x < kLoaderThreads;
  const int lid = threadIdx.x % kLoaderThreads;

  auto w_stage = [&](int j) { return w_ring + (j % Cfg::kSw) * kWeightStageBytes; };
  auto x_stage = [&](int j) { return x_ring + (j % Cfg::kSx) * Cfg::kXStageBytes; };
  const uint8_t* x_src = x_tiles + lid * 16;  // this thread's 16-byte pieces, kLoaderThreads apart
  auto load_x = [&](int j) {
    const uint8_t* src = x_src + (c_begin + j) * Cfg::kXStageBytes;
    uint8_t* dst = x_stage(j) + lid * 16;
#pragma unroll
    for (int u = 0; u < Cfg::kXStageBytes / 16 / kLoaderThreads; ++u) {
      cp_async<16>(dst + u * kLoaderThreads * 16, src + u * kLoaderThreads * 16, true);
    }
  };
  constexpr int kPiece = kVec16 ? 16 : 8;
  fused::WeightCopier<kLoaderThreads, kPiece> wc;
  wc.setup(p, n0, lid);
  auto load_w = [&](int j) { wc.copy(p, c_begin + j, k_tiles, w_stage(j)); };

  float acc[Cfg::kAcc];
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.f;

  // Every thread commits one group per prologue round and per iteration. A weight loader's
  // group j holds weight chunk j (prologue round j, or iteration j - kLw); an activation
  // loader's holds chunk j in prologue round j < kLx, chunk j + kLx in iteration j. So before
  // iteration j commits, kLw - 1 (weights) or kLx - 1 (activations) younger groups may pend.
  // Programmatic dependent launch (launch_gemm): the grid before this one, the staging kernel,
  // may still be running; nothing above touched global memory.
  wait_for_prior_grids();
#pragma unroll 1
  for (int j = 0; j < Cfg::kLw; ++j) {
    if (!x_loader && j < n_local) load_w(j);
    if (x_loader && j < Cfg::kLx && j < n_local) load_x(j);
    cp_async_commit();
  }

  auto step = [&](int j, uint32_t(&frag)[kSteps][4]) {
    if (x_loader) {
      cp_async_wait<Cfg::kLx - 1>();
      fence_proxy_async();  // this thread's copies, visible to the wgmma (async proxy)
    } else {
      cp_async_wait<Cfg::kLw - 1>();
    }
    __syncthreads();  // everyone's copies landed; chunk j - 2's wgmmas retired everywhere
    if (!x_loader && j + Cfg::kLw < n_local) load_w(j + Cfg::kLw);
    if (x_loader && j + Cfg::kLx < n_local) load_x(j + Cfg::kLx);
    cp_async_commit();
    fused::dequant_chunk(w_stage(j), rows, t, (c_begin + j) * (kChunk / kBlockSize) + 2 * t, k_blocks, frag);
    const uint32_t x_addr = smem_addr(x_stage(j));
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      WgmmaRS<MT>::run(acc, frag[s], smem_descriptor_swizzle128(x_addr + staged_k_step_offset<MT>(s), 1024));
    }
    wgmma_commit();
    wgmma_wait<1>();  // chunk j - 1 retired: its registers are free for chunk j + 1
  };

  // Two register buffers, alternating (static indices: ptxas sees no in-flight operand written).
  uint32_t frag[2][kSteps][4];
  fence_accumulators(acc);
  int j = 0;
#pragma unroll 1
  for (; j + 2 <= n_local; j += 2) {
    step(j, frag[0]);
    step(j + 1, frag[1]);
  }
  if (j < n_local) step(j, frag[0]);
  wgmma_wait<0>();
  fence_accumulators(acc);

  const float alpha = fused::alpha(p);
  const int64_t staged0 = static_cast<int64_t>(blockIdx.y) * MT;
  if (split == 1) {
    // Every wgmma has retired and, after this, every copy has landed: the activation ring is
    // free to hold the warpgroups' epilogue tiles.
    cp_async_wait<0>();
    __syncthreads();
    const int w = threadIdx.x / 128;
    with_activation(p.activation, [&](auto act) {
      constexpr Activation kAct = decltype(act)::value;
      if (!fused::store_through_tile<kAct, MT>(p, rows_per_x_row, n0 + 64 * w, staged0, acc, alpha,
                                               x_ring + w * fused::kEpilogueTileBytes, threadIdx.x % 128, 1 + w)) {
        fused::store_fragment<kAct>(p, n0, r0, staged0, t, rows_per_x_row, alpha, acc);
      }
    });
    return;
  }
  // Split-K: partials through the (now idle) activation ring, summed over the ranks in rank order
  // (split_sum.cuh). H100, through JAX: 4096 x 4096 at M = 96-256 1.08-1.14x, 6144 x 4096 at
  // M = 128 1.17x faster with the rows leaving through the tiles than element by element.
  cp_async_wait<0>();
  __syncthreads();
  with_activation(p.activation, [&](auto act) {
    fused::sum_split_and_store<decltype(act)::value, MT>(p, rows_per_x_row, n0, staged0, alpha, acc, x_ring,
                                                         threadIdx.x);
  });
}

// --- Host side ------------------------------------------------------------------------------

struct Plan {
  StagedActivations x;
  int64_t n_tiles = 0;
};

Plan make_plan(const GemmProblem& p) {
  Plan pl;
  pl.x = staged_activations(p, 128);
  if (p.m * pl.x.rows_per_x_row <= 64) pl.x = staged_activations(p, 64);
  pl.n_tiles = ceil_div(p.n, kRows);
  return pl;
}

template <int MT, bool kVec16>
cudaError_t launch_gemm(const GemmProblem& p, const Plan& pl, cudaStream_t stream) {
  const ResidentBlocks capacity = resident_blocks<fused_kernel<MT, kVec16>>(dim3(kThreads), Tile<MT>::kSmemBytes);
  if (capacity[1] == 0) return cudaErrorInvalidConfiguration;  // the kernel cannot run here
  const int split = one_wave_split(pl.n_tiles * pl.x.m_tiles, pl.x.chunks, kMinChunksPerSplit, capacity);
  const LaunchConfig launch(
      dim3(static_cast<unsigned>(pl.n_tiles), static_cast<unsigned>(pl.x.m_tiles), static_cast<unsigned>(split)),
      dim3(kThreads), Tile<MT>::kSmemBytes, stream, static_cast<unsigned>(split), /*pdl=*/true);
  return cudaLaunchKernelEx(&launch.cfg, fused_kernel<MT, kVec16>, p, static_cast<const uint8_t*>(p.workspace),
                            pl.x.chunks, pl.x.rows_per_x_row);
}

// Rows of K/2 bytes are 16-byte aligned when K % 32 == 0; otherwise the weights come in 8-byte
// pieces.
template <int MT>
cudaError_t run(const GemmProblem& p, const Plan& pl, cudaStream_t stream) {
  if (cudaError_t err = stage_activations(p, pl.x, stream); err != cudaSuccess) return err;
  return p.k % 32 == 0 ? launch_gemm<MT, true>(p, pl, stream) : launch_gemm<MT, false>(p, pl, stream);
}

}  // namespace

size_t fused_workspace_bytes(const GemmProblem& p) { return make_plan(p).x.bytes; }

cudaError_t fused_gemm(const GemmProblem& p, cudaStream_t stream) {
  const Plan pl = make_plan(p);
  if (pl.x.m_tiles > 65535 || pl.n_tiles > INT32_MAX || p.workspace_bytes < pl.x.bytes) {
    return cudaErrorInvalidValue;
  }
  return pl.x.mt == 64 ? run<64>(p, pl, stream) : run<128>(p, pl, stream);
}

}  // namespace sm90
}  // namespace jax_nvfp4
