// The tiled E4M3 scale layout shared by every kernel (DESIGN.md §3).
//
// For one matrix of `rows` x `k_blocks` 16-element blocks, scales are stored as
// [ceil(rows/128), ceil(k_blocks/4), 32, 4, 4]: element [rt, kt, i, j, l] scales row
// rt*128 + j*32 + i and block kt*4 + l. These are exactly the bytes CUTLASS's
// Sm1xxBlockScaledConfig<16> expects, one 512-byte tile per (128 rows x 64 K).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define NVFP4_HD __host__ __device__ __forceinline__
#else
#define NVFP4_HD inline
#endif

namespace jax_nvfp4 {

constexpr int kBlockSize = 16;        // elements sharing one E4M3 scale
constexpr int kTileRows = 128;        // rows per scale tile
constexpr int kTileKBlocks = 4;       // 16-element blocks per scale tile (64 K elements)
constexpr int kTileBytes = 512;       // 128 rows x 4 blocks

NVFP4_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Number of scale tiles along K for a matrix with k_blocks 16-element blocks.
NVFP4_HD int64_t scale_k_tiles(int64_t k_blocks) { return ceil_div(k_blocks, kTileKBlocks); }

// Bytes of scales for one matrix (padding included).
NVFP4_HD int64_t scale_matrix_bytes(int64_t rows, int64_t k_blocks) {
  return ceil_div(rows, kTileRows) * scale_k_tiles(k_blocks) * kTileBytes;
}

// Byte offset of the scale of (row, k_block) within one matrix's scales.
NVFP4_HD int64_t scale_offset(int64_t row, int64_t k_block, int64_t k_blocks) {
  const int64_t rt = row / kTileRows, rr = row % kTileRows;
  const int64_t kt = k_block / kTileKBlocks, l = k_block % kTileKBlocks;
  const int64_t i = rr % 32, j = rr / 32;
  return (rt * scale_k_tiles(k_blocks) + kt) * kTileBytes + i * 16 + j * 4 + l;
}

}  // namespace jax_nvfp4
