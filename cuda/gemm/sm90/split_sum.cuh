// Split-K's end in the fused sm_90a GEMM kernels (gemm_fused.cu, gemm_fused_ws.cu): each rank of a
// thread-block cluster holds one K part of the same output tile in its two consumer warpgroups'
// accumulators. The parts meet through distributed shared memory and are summed in rank order
// (deterministic: the same order on every run and rank), each rank finishing its share of the
// tile's rows.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "gemm/gemm_problem.h"
#include "gemm/sm90/fused_weights.cuh"
#include "gemm/sm90/tile_epilogue.cuh"

namespace jax_nvfp4 {
namespace sm90 {
namespace fused {

constexpr int kSplitThreads = 256;  // the two consumer warpgroups, threads 0-255 of the CTA

// Shared memory a rank's partial tile takes (kAcc accumulators a consumer thread).
template <int kAcc>
constexpr int split_partial_bytes() {
  return kSplitThreads * kAcc * 4;
}

// Called by the consumer threads (tid < kSplitThreads) of every rank once their wgmmas have
// retired, with `smem` idle: split_partial_bytes() of partial tile, then the two warpgroups'
// epilogue tiles. Its cluster barriers wait for every thread of the cluster that has not exited:
// the CTA's other threads exit or call cluster.sync() twice meanwhile. Through the tiles, rank r
// finishes the blocks of 16 staged rows b = r, r + split, ...; else the output units
// u = r, r + split, ... (store_fragment's accumulator pairs, or gated quadruples) element by
// element. n_tile0, staged0: the tile's first weight row and staged row.
template <Activation kAct, int kMT>
__device__ __forceinline__ void sum_split_and_store(const GemmProblem& p, int rows_per_x_row, int64_t n_tile0,
                                                    int64_t staged0, float alpha, float (&acc)[kMT / 2],
                                                    uint8_t* smem, int tid) {
  constexpr int kAcc = kMT / 2;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  float* partial = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < kAcc; ++i) partial[i * kSplitThreads + tid] = acc[i];
  cluster.sync();
  const int w = tid / 128, lane = tid % 32, t = lane % 4;
  const int r0 = w * 64 + (tid % 128 / 32) * 16 + lane / 4;  // MMA rows r0 and r0 + 8
  // A rank sums whole blocks for the tile: with fewer than two blocks a rank, the units spread
  // the DSMEM reads wider (H100, the fused kernel: 1024 x 4096 at M = 64-128, split 8, 9.5-12.1 us
  // element-wise against 11.5-14.6 through the tile).
  if (2 * split <= kAcc / 8 && tile_fits<kAct>(p, rows_per_x_row)) {
    uint32_t blocks = 0;  // this rank's blocks b of 16 staged rows: accumulators 8b .. 8b + 7
    for (int b = rank; b < kAcc / 8; b += split) blocks |= 1u << b;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    for (int r = 0; r < split; ++r) {
      const float* remote = cluster.map_shared_rank(partial, r);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        if (blocks >> (i / 8) & 1u) acc[i] += remote[i * kSplitThreads + tid];
      }
    }
    uint8_t* tile = smem + split_partial_bytes<kAcc>() + w * kEpilogueTileBytes;
    store_through_tile<kAct, kMT>(p, rows_per_x_row, n_tile0 + 64 * w, staged0, acc, alpha, tile, tid % 128, 1 + w,
                                  blocks);
  } else {
    constexpr int kUnit = is_gated(kAct) ? 4 : 2;  // accumulators per output unit
    for (int u = rank; u < kAcc / kUnit; u += split) {
      float v[kUnit] = {};
      for (int r = 0; r < split; ++r) {
        const float* remote = cluster.map_shared_rank(partial, r);
#pragma unroll
        for (int e = 0; e < kUnit; ++e) v[e] += remote[(kUnit * u + e) * kSplitThreads + tid];
      }
      if constexpr (is_gated(kAct)) {
        store_gated<kAct>(p, n_tile0 + mma_row_sources(r0, true).x, staged0 + 8 * u + 2 * t, rows_per_x_row, alpha,
                          v[0], v[1], v[2], v[3]);
      } else {
        store_pair<kAct>(p, n_tile0 + r0 + 8 * (u % 2), staged0 + 8 * (u / 2) + 2 * t, rows_per_x_row, alpha, v[0],
                         v[1]);
      }
    }
  }
  cluster.sync();  // keep this CTA's partials alive until every rank has read them
}

}  // namespace fused
}  // namespace sm90
}  // namespace jax_nvfp4
