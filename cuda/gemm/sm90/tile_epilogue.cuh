// The fused sm_90a GEMM kernels' epilogue through shared memory (gemm_fused.cu,
// gemm_fused_ws.cu). A warpgroup holds 64 weight rows (output columns) x kMT staged rows (output
// rows) of wgmma accumulators. Stored one element per thread and accumulator, a warp instruction
// writes 8 columns of 4 output rows; on an H100 the whole GEMM then took up to twice as long as
// through this tile (kernel times, fused_ws, M = 256, 14336 x 4096, float32 output: 132.5
// against 66.4 us; the fused kernel, M = 128, bf16: 67.9 against 34.6, with the activation a
// compile-time choice, with_activation). Here the warpgroup writes act(alpha * acc + bias),
// cast, transposed into its tile (output rows as tile rows), kPassRows output rows per pass, and
// each tile row leaves as 16-byte pieces. Gated activations pair the gate and up rows first
// (mma_row_sources), leaving 32 output columns. Needs one staged row per x row and output rows of
// whole pieces (store_through_tile checks both).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/activation.cuh"
#include "common/dtype_io.cuh"
#include "common/stmatrix_tile.cuh"
#include "gemm/gemm_problem.h"

namespace jax_nvfp4 {
namespace sm90 {
namespace fused {

constexpr int kEpilogueTileBytes = 9216;  // one warpgroup's tile

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Tile geometry per output type and kind. Pitches (elements per tile row) keep a warp's stores
// on distinct banks: 2-byte outputs go through stmatrix (a pad of 8 spreads a matrix's rows);
// element stores come from rows 2t apart (t = lane % 4), which a pitch of 8 (mod 32) words, times
// two, spreads over four bank octets.
template <typename T, bool kGated>
struct TileShape {
  static constexpr int kCols = kGated ? 32 : 64;  // output columns of a warpgroup
  static constexpr int kPitch = sizeof(T) == 2 ? kCols + 8 : kCols + 4;
  static constexpr int kPassRows = kEpilogueTileBytes / (kPitch * static_cast<int>(sizeof(T))) >= 64 ? 64 : 32;
  static constexpr int kElems = 16 / static_cast<int>(sizeof(T));  // per 16-byte piece
  static constexpr int kPieces = kCols / kElems;                     // per tile row
  static_assert(kPassRows * kPitch * sizeof(T) <= kEpilogueTileBytes, "a pass fits the tile");
  static_assert(sizeof(T) == 2 || (kPitch * 2) % 32 == 8, "float rows 2t apart on distinct bank octets");
};

// Whether the tile can take a problem's output: one staged row per x row, output rows of whole
// 16-byte pieces. kAct: p.activation (with_activation).
template <Activation kAct>
__device__ __forceinline__ bool tile_fits(const GemmProblem& p, int rows_per_x_row) {
  const int64_t cols = is_gated(kAct) ? p.n / 2 : p.n;
  return rows_per_x_row == 1 && cols % (p.out_dtype == DType::kF32 ? 4 : 8) == 0;
}

// Writes the warpgroup's tile (weight rows n0 .., staged rows m0 ..) to the output rows
// [m_begin, p.m). ct: the thread's index in its warpgroup; barrier: a named barrier of the
// warpgroup's own; blocks: bit b set where this thread stores block b of 16 staged rows (split-K
// ranks share a tile's rows).
template <typename T, Activation kAct, int kMT>
__device__ __forceinline__ void store_through_tile(const GemmProblem& p, int64_t n0, int64_t m0,
                                                   const float (&acc)[kMT / 2], float alpha, T* tile, int ct,
                                                   int barrier, uint32_t blocks, int64_t m_begin) {
  constexpr bool kGated = is_gated(kAct);
  const auto owned = [&](int block) { return (blocks >> block & 1u) != 0; };
  using S = TileShape<T, kGated>;
  static_assert(kMT % S::kPassRows == 0, "whole passes");
  const int warp = ct / 32, lane = ct % 32, g = lane / 4, t = lane % 4;
  const int64_t cols = kGated ? p.n / 2 : p.n, col0 = kGated ? n0 / 2 : n0;
  // This thread's weight rows: 16 warp + g (+ 8) of the warpgroup, or one gate/up pair (column
  // 8 warp + g).
  float bias[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t row = kGated ? n0 + 16 * warp + 2 * g + i : n0 + 16 * warp + g + 8 * i;
    if (p.bias != nullptr && row < p.n) bias[i] = load_as_float(p.bias, p.bias_dtype, row);
  }
  const auto value = [&](float v, int i) { return apply_activation(v * alpha + bias[i], kAct); };
  const auto paired = [&](float gate, float up) {
    return from_float<T>(apply_gated(gate * alpha + bias[0], up * alpha + bias[1], kAct));
  };
  // Read-back: 8 lanes of a warp read 128 contiguous bytes of a tile row where a row has 8 or
  // more pieces; with 4 (gated 2-byte), lane l reads row l % 8, piece l / 8 (distinct banks).
  constexpr bool kRowMajor = S::kPieces >= 8;
  const int piece = kRowMajor ? ct % S::kPieces : lane / 8;
  const int first_row = kRowMajor ? ct / S::kPieces : warp * 8 + lane % 8;
  constexpr int kRowStep = kRowMajor ? 128 / S::kPieces : 32;
  const bool piece_in = col0 + piece * S::kElems < cols;
  T* out = static_cast<T*>(p.out) + col0 + piece * S::kElems;

#pragma unroll
  for (int pass = 0; pass < kMT / S::kPassRows; ++pass) {
    named_sync(barrier, 128);  // the previous pass's (or tile's) reads of the tile are done
    constexpr int kQuads = S::kPassRows / 8;  // accumulator quads 4a .. 4a + 3: staged rows 8a + 2t, + 1
    if constexpr (!kGated && sizeof(T) == 2) {
#pragma unroll
      for (int b = 0; b < kQuads / 2; ++b) {  // one stmatrix.x4 a block of 16 staged rows
        if (!owned(pass * kQuads / 2 + b)) continue;
        stmatrix_transposed<T, 2>(acc + (pass * kQuads + 2 * b) * 4, alpha, bias, tile + 16 * b * S::kPitch,
                                  S::kPitch, warp * 16, lane, kAct);
      }
    } else {
#pragma unroll
      for (int q = 0; q < kQuads; ++q) {
        if (!owned((pass * kQuads + q) / 2)) continue;
        const int a = 4 * (pass * kQuads + q);
        T* row = tile + (8 * q + 2 * t) * S::kPitch;
        if constexpr (kGated) {  // gate: acc[a], acc[a + 1]; up: acc[a + 2], acc[a + 3]
          row[8 * warp + g] = paired(acc[a], acc[a + 2]);
          row[S::kPitch + 8 * warp + g] = paired(acc[a + 1], acc[a + 3]);
        } else {  // float: weight row 16 warp + g in acc[a], acc[a + 1], row + 8 in acc[a + 2], acc[a + 3]
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            row[16 * warp + g + 8 * i] = value(acc[a + 2 * i], i);
            row[S::kPitch + 16 * warp + g + 8 * i] = value(acc[a + 2 * i + 1], i);
          }
        }
      }
    }
    named_sync(barrier, 128);
    if (piece_in) {
#pragma unroll
      for (int r = first_row; r < S::kPassRows; r += kRowStep) {
        const int64_t m = m0 + pass * S::kPassRows + r;
        if (m >= m_begin && m < p.m && owned((pass * S::kPassRows + r) / 16)) *reinterpret_cast<uint4*>(out + m * cols) = *reinterpret_cast<const uint4*>(tile + r * S::kPitch + piece * S::kElems);
      }
    }
  }
}

// Stores the warpgroup's accumulators through its tile (`tile`: kEpilogueTileBytes) if tile_fits
// and returns true; false leaves them to the caller's element-wise stores. Uniform over the
// warpgroup. kAct: p.activation (with_activation); blocks, m_begin: as above.
template <Activation kAct, int kMT>
__device__ __forceinline__ bool store_through_tile(const GemmProblem& p, int rows_per_x_row, int64_t n0, int64_t m0,
                                                   const float (&acc)[kMT / 2], float alpha, uint8_t* tile, int ct,
                                                   int barrier, uint32_t blocks = ~0u, int64_t m_begin = 0) {
  if (!tile_fits<kAct>(p, rows_per_x_row)) return false;
  switch (p.out_dtype) {
    case DType::kF32:
      store_through_tile<float, kAct, kMT>(p, n0, m0, acc, alpha, reinterpret_cast<float*>(tile), ct, barrier, blocks,
                                         m_begin);
      break;
    case DType::kBF16:
      store_through_tile<__nv_bfloat16, kAct, kMT>(p, n0, m0, acc, alpha, reinterpret_cast<__nv_bfloat16*>(tile), ct,
                                                   barrier, blocks, m_begin);
      break;
    default:
      store_through_tile<__half, kAct, kMT>(p, n0, m0, acc, alpha, reinterpret_cast<__half*>(tile), ct, barrier, blocks,
                                          m_begin);
      break;
  }
  return true;
}

}  // namespace fused
}  // namespace sm90
}  // namespace jax_nvfp4
