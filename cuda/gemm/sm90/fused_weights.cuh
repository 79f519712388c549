// The weight side of the two fused sm_90a GEMM kernels (gemm_fused.cu, gemm_fused_ws.cu): a
// stage holds K chunk c of 128 weight rows (one scale tile) as packed codes plus the chunk's two
// 512-byte scale tiles; loader threads copy it with cp.async, and every consumer thread
// dequantizes its two rows of it straight into wgmma A-operand registers.
#pragma once

#include <cstdint>

#include "common/scale_layout.h"
#include "common/sm90_async.cuh"
#include "gemm/gemm_problem.h"
#include "gemm/sm90/gemm_device_utils.cuh"

namespace jax_nvfp4 {
namespace sm90 {
namespace fused {

constexpr int kRows = 128;   // weight rows of a tile: one scale tile, two wgmma M of 64
constexpr int kChunk = 128;  // K elements per stage: 4 lanes x 32
constexpr int kSteps = kChunk / 16;  // wgmma k-steps per stage
constexpr int kCodeBytes = kRows * kChunk / 2;
constexpr int kScaleBytes = 2 * kTileBytes;  // scale tiles 2c and 2c + 1 of the row tile
constexpr int kWeightStageBytes = kCodeBytes + kScaleBytes;
static_assert(kChunk == 2 * kTileKBlocks * kBlockSize, "a chunk spans two scale tiles");
static_assert(kRows == kTileRows, "a tile's rows are one scale tile");

// A loader thread's share (one of kLoaders) of every chunk: `kPiece` bytes (16; 8 when rows of
// K/2 bytes are only 8-byte aligned) of the codes of rows r_first + u * rows_per_pass, and 16
// bytes of the two scale tiles every kLoaders pieces. Addresses are set up once per weight tile;
// a chunk only adds its offset. Rows past N, K past k and scale tiles past the last are zero
// filled.
template <int kLoaders, int kPiece>
struct WeightCopier {
  static constexpr int kPiecesPerRow = kChunk / 2 / kPiece;
  static constexpr int kRowsPerPass = kLoaders / kPiecesPerRow;
  static constexpr int kPasses = kRows / kRowsPerPass;
  static constexpr int kScalePieces = kScaleBytes / 16;
  static_assert(kPasses <= 32, "one bit per pass");

  const uint8_t* codes;   // this thread's piece of row r_first in chunk 0
  int64_t pass_stride;    // bytes between the rows of consecutive passes
  uint32_t rows_ok;       // bit u: the row of pass u is < N
  int first_elem;         // K offset of the piece within a chunk
  int dst;                // shared-memory offset of the piece of pass 0 within a stage
  const uint8_t* scales;  // this thread's first 16 bytes of the chunk-0 scale tiles, or null
  int lid;

  __device__ __forceinline__ void setup(const GemmProblem& p, int64_t n0, int loader) {
    lid = loader;
    const int r_first = lid / kPiecesPerRow, part = lid % kPiecesPerRow;
    codes = p.b.codes + (n0 + r_first) * (p.k / 2) + part * kPiece;
    pass_stride = kRowsPerPass * (p.k / 2);
    // The rows of the passes rise with u: the first `valid` of them are < N.
    const int64_t left = p.n - (n0 + r_first), passes = (left + kRowsPerPass - 1) / kRowsPerPass;
    const int valid = left <= 0 ? 0 : passes < kPasses ? static_cast<int>(passes) : kPasses;
    rows_ok = valid == 32 ? ~0u : (1u << valid) - 1u;
    first_elem = part * kPiece * 2;
    dst = r_first * (kChunk / 2) + part * kPiece;
    const int64_t k_tiles = scale_k_tiles(p.k / kBlockSize);
    scales = lid < kScalePieces ? p.b.scales + (n0 / kTileRows) * k_tiles * kTileBytes + lid * 16 : nullptr;
  }

  // Copies chunk c into `stage` (codes, then the scale tiles). k_tiles: scale tiles per row tile.
  __device__ __forceinline__ void copy(const GemmProblem& p, int64_t c, int64_t k_tiles, uint8_t* stage) const {
    const uint8_t* src = codes + c * (kChunk / 2);
    const bool k_ok = c * kChunk + first_elem < p.k;
#pragma unroll 16
    for (int u = 0; u < kPasses; ++u) {
      const bool ok = k_ok && (rows_ok >> u & 1u);
      hopper::cp_async<kPiece>(stage + dst + u * kRowsPerPass * (kChunk / 2), ok ? src + u * pass_stride : p.b.codes,
                               ok);
    }
    if (scales != nullptr) {
#pragma unroll
      for (int piece = 0; piece < kScalePieces; piece += kLoaders) {
        if (piece + lid < kScalePieces) {
          const int tile = (piece + lid) / (kTileBytes / 16);
          const bool ok = 2 * c + tile < k_tiles;
          hopper::cp_async<16>(stage + kCodeBytes + (piece + lid) * 16,
                               ok ? scales + c * kScaleBytes + piece * 16 : p.b.scales, ok);
        }
      }
    }
  }
};

// The stage rows a thread dequantizes as its MMA rows r0 and r0 + 8 (r0 = 16 w + g): those rows,
// or with a gated activation the interleaved pair 16 w + 2g, 16 w + 2g + 1 (the gate and up rows
// of one output column), so the epilogue holds both in one thread.
__device__ __forceinline__ int2 mma_row_sources(int r0, bool gated) {
  const int first = gated ? r0 + r0 % 16 : r0;
  return make_int2(first, gated ? first + 1 : r0 + 8);
}

// The A registers of k-steps 2q and 2q + 1 from word q of MMA rows r0 (w0) and r0 + 8 (w1), each
// word times its block's widened scale (s0, s1).
template <int kWords>
__device__ __forceinline__ void dequant_words(const uint32_t (&w0)[kWords], const uint32_t (&w1)[kWords],
                                              const uint32_t (&s0)[kWords], const uint32_t (&s1)[kWords],
                                              uint32_t (&frag)[2 * kWords][4]) {
#pragma unroll
  for (int q = 0; q < kWords; ++q) {
    uint32_t a0[4], a1[4];
    dequant_word(w0[q], s0[q], a0);
    dequant_word(w1[q], s1[q], a1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      frag[2 * q + h][0] = a0[2 * h];
      frag[2 * q + h][1] = a1[2 * h];
      frag[2 * q + h][2] = a0[2 * h + 1];
      frag[2 * q + h][3] = a1[2 * h + 1];
    }
  }
}

// This thread's A registers of the chunk in `w` (a stage as WeightCopier fills it): stage rows
// rows.x and rows.y (mma_row_sources) as MMA rows r0 and r0 + 8, elements 32t .. 32t+31; k-step
// 2q + h takes pairs 2h, 2h + 1 of word q (fused_staging.h orders the activations to match).
// Scales of blocks past K are zeroed (their padding bytes may hold anything; the codes there are
// zero).
__device__ __forceinline__ void dequant_chunk(const uint8_t* w, int2 rows, int t, int64_t first_block,
                                              int64_t k_blocks, uint32_t (&frag)[kSteps][4]) {
  const uint4 c0 = *reinterpret_cast<const uint4*>(w + rows.x * 64 + t * 16);
  const uint4 c1 = *reinterpret_cast<const uint4*>(w + rows.y * 64 + t * 16);
  const uint32_t keep = (first_block < k_blocks ? 0x00FFu : 0u) | (first_block + 1 < k_blocks ? 0xFF00u : 0u);
  const uint32_t two0 = *reinterpret_cast<const uint16_t*>(w + kCodeBytes + scale_offset(rows.x, 2 * t, 2 * kTileKBlocks));
  const uint32_t two1 = *reinterpret_cast<const uint16_t*>(w + kCodeBytes + scale_offset(rows.y, 2 * t, 2 * kTileKBlocks));
  uint32_t sc0[2], sc1[2];  // blocks 2t and 2t + 1: words 0-1 and 2-3
  widen_scales(two0 & keep, sc0[0], sc0[1]);
  widen_scales(two1 & keep, sc1[0], sc1[1]);
  const uint32_t w0[4] = {c0.x, c0.y, c0.z, c0.w}, w1[4] = {c1.x, c1.y, c1.z, c1.w};
  const uint32_t s0[4] = {sc0[0], sc0[0], sc0[1], sc0[1]}, s1[4] = {sc1[0], sc1[0], sc1[1], sc1[1]};
  dequant_words(w0, w1, s0, s1, frag);
}

// Half h (k-steps 4h .. 4h + 3, words 2h and 2h + 1 of each row) of dequant_chunk's registers:
// the same values with half the registers live.
__device__ __forceinline__ void dequant_half(const uint8_t* w, int2 rows, int t, int h, int64_t first_block,
                                             int64_t k_blocks, uint32_t (&frag)[kSteps / 2][4]) {
  const uint2 c0 = *reinterpret_cast<const uint2*>(w + rows.x * 64 + t * 16 + h * 8);
  const uint2 c1 = *reinterpret_cast<const uint2*>(w + rows.y * 64 + t * 16 + h * 8);
  const bool keep = first_block + h < k_blocks;
  const uint32_t b0 = keep ? w[kCodeBytes + scale_offset(rows.x, 2 * t + h, 2 * kTileKBlocks)] : 0u;
  const uint32_t b1 = keep ? w[kCodeBytes + scale_offset(rows.y, 2 * t + h, 2 * kTileKBlocks)] : 0u;
  uint32_t sc0, sc1, unused;
  widen_scales(b0, sc0, unused);
  widen_scales(b1, sc1, unused);
  const uint32_t w0[2] = {c0.x, c0.y}, w1[2] = {c1.x, c1.y};
  const uint32_t s0[2] = {sc0, sc0}, s1[2] = {sc1, sc1};
  dequant_words(w0, w1, s0, s1, frag);
}

// What the epilogue multiplies the accumulators by: the tensor scales, with the dequantized
// values' 2^-7 undone.
__device__ __forceinline__ float alpha(const GemmProblem& p) {
  float a = *p.b.s_dec * (1.0f / kDequantFactor);
  if (p.a_is_nvfp4) a *= *p.a_q.s_dec * (1.0f / kDequantFactor);
  return a;
}

// Stores one accumulator pair of a thread (alpha, bias, activation kAct, cast): weight row n,
// staged rows col and col + 1, which are two rows of x, or (rows_per_x_row == 2) the bf16 hi and
// lo halves of one. Only the output rows [m_begin, p.m) are stored.
template <Activation kAct>
__device__ __forceinline__ void store_pair(const GemmProblem& p, int64_t n, int64_t col, int rows_per_x_row,
                                           float a, float v0, float v1, int64_t m_begin = 0) {
  if (n >= p.n) return;
  const float b = p.bias ? load_as_float(p.bias, p.bias_dtype, n) : 0.f;
  const auto epilogue = [&](float v) { return apply_activation(v * a + b, kAct); };
  if (rows_per_x_row == 2) {
    const int64_t m = col / 2;
    if (m >= m_begin && m < p.m) store_as(p.out, p.out_dtype, m * p.n + n, epilogue(v0 + v1));
  } else {
    if (col >= m_begin && col < p.m) store_as(p.out, p.out_dtype, col * p.n + n, epilogue(v0));
    if (col + 1 >= m_begin && col + 1 < p.m) store_as(p.out, p.out_dtype, (col + 1) * p.n + n, epilogue(v1));
  }
}

// store_pair for a gated activation: the accumulator pairs of MMA rows r0 (gate: weight row n,
// even) and r0 + 8 (up: row n + 1) for staged rows col and col + 1 give output column n / 2.
template <Activation kAct>
__device__ __forceinline__ void store_gated(const GemmProblem& p, int64_t n, int64_t col, int rows_per_x_row,
                                            float a, float g0, float g1, float u0, float u1, int64_t m_begin = 0) {
  if (n >= p.n) return;
  const float bg = p.bias ? load_as_float(p.bias, p.bias_dtype, n) : 0.f;
  const float bu = p.bias ? load_as_float(p.bias, p.bias_dtype, n + 1) : 0.f;
  const auto epilogue = [&](float g, float u) { return apply_gated(g * a + bg, u * a + bu, kAct); };
  const int64_t cols = p.n / 2, j = n / 2;
  if (rows_per_x_row == 2) {
    const int64_t m = col / 2;
    if (m >= m_begin && m < p.m) store_as(p.out, p.out_dtype, m * cols + j, epilogue(g0 + g1, u0 + u1));
  } else {
    if (col >= m_begin && col < p.m) store_as(p.out, p.out_dtype, col * cols + j, epilogue(g0, u0));
    if (col + 1 >= m_begin && col + 1 < p.m) store_as(p.out, p.out_dtype, (col + 1) * cols + j, epilogue(g1, u1));
  }
}

// A thread's whole accumulator fragment (MMA rows r0 and r0 + 8 of the tile whose weight rows
// start at n_tile0, staged rows m0 ..) stored element by element: accumulators 2i and 2i + 1
// are row r0 (+ 8 for odd i), staged rows m0 + 8 (i / 2) + 2t and + 1; gated, accumulators
// 4q .. 4q + 3 are one output column's gate and up (mma_row_sources). Output rows [m_begin, p.m).
template <Activation kAct, int kAcc>
__device__ __forceinline__ void store_fragment(const GemmProblem& p, int64_t n_tile0, int r0, int64_t m0, int t,
                                               int rows_per_x_row, float alpha, const float (&acc)[kAcc],
                                               int64_t m_begin = 0) {
  if constexpr (is_gated(kAct)) {
    const int64_t gate = n_tile0 + mma_row_sources(r0, true).x;
#pragma unroll
    for (int q = 0; q < kAcc / 4; ++q) {
      store_gated<kAct>(p, gate, m0 + 8 * q + 2 * t, rows_per_x_row, alpha, acc[4 * q], acc[4 * q + 1],
                        acc[4 * q + 2], acc[4 * q + 3], m_begin);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kAcc / 2; ++i) {
      store_pair<kAct>(p, n_tile0 + r0 + 8 * (i % 2), m0 + 8 * (i / 2) + 2 * t, rows_per_x_row, alpha, acc[2 * i],
                       acc[2 * i + 1], m_begin);
    }
  }
}

}  // namespace fused
}  // namespace sm90
}  // namespace jax_nvfp4
