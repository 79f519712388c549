// The weight side of the fused_ws kernels (gemm_fused_ws.cu), whose activations keep x's own K
// order (natural_k.h). A stage holds K chunk c of 128 weight rows as fused::WeightCopier copies
// it (packed codes, their 16-byte pieces swizzled, then the chunk's two scale tiles), and after them the chunk's 8 block scales
// a row as bf16 (widened as nvfp4_bf16x2.h wants, zero past K). Once the copies land, rewriter
// threads turn each row's codes into natural_k order in place and widen its scales.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/scale_layout.h"
#include "common/sm90_async.cuh"
#include "gemm/gemm_problem.h"
#include "gemm/sm90/fused_weights.cuh"
#include "gemm/sm90/natural_k.h"

namespace jax_nvfp4 {
namespace sm90 {
namespace ws {

using fused::kChunk;
using fused::kRows;
constexpr int kChunkBlocks = kChunk / kBlockSize;                // 8
constexpr int kWidenedOffset = fused::kWeightStageBytes;        // after the copied codes and scale tiles
constexpr int kWidenedBytes = kRows * kChunkBlocks * 2;         // bf16 a block: row r at 16 r
constexpr int kWeightStageBytes = kWidenedOffset + kWidenedBytes;
static_assert(kWeightStageBytes % 1024 == 0, "stages keep the activation tiles 1024-byte aligned");

// Four E4M3 scales (a raw tile's 4 bytes of one row) as bf16 times 2^119 (nvfp4_bf16x2.h), the
// blocks from `first_block` on zeroed where they are past k_blocks (their codes are zero, their
// scale bytes padding that may hold a NaN).
__device__ __forceinline__ uint2 widen_four_scales(uint32_t raw, int64_t first_block, int64_t k_blocks) {
  uint32_t out[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(raw >> (16 * i)), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    const int64_t b = first_block + 2 * i;
    out[i] = pack_bf16x2(b < k_blocks ? f.x * kScaleBoost : 0.f, b + 1 < k_blocks ? f.y * kScaleBoost : 0.f);
  }
  return make_uint2(out[0], out[1]);
}

// Rewrites row `row` of the weight part `w` of a stage whose copies have landed: codes into
// natural_k order in place, scales widened. first_block: the chunk's first block.
__device__ __forceinline__ void rewrite_row(uint8_t* w, int row, int64_t first_block, int64_t k_blocks) {
  uint32_t natural[16], stored[16];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = *reinterpret_cast<const uint4*>(w + fused::code_offset<true>(row, i));
    natural[4 * i] = v.x, natural[4 * i + 1] = v.y, natural[4 * i + 2] = v.z, natural[4 * i + 3] = v.w;
  }
  natural_k_codes(natural, stored);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    *reinterpret_cast<uint4*>(w + fused::code_offset<true>(row, i)) =
        make_uint4(stored[4 * i], stored[4 * i + 1], stored[4 * i + 2], stored[4 * i + 3]);
  }
  const int in_tile = scale_offset(row, 0, kTileKBlocks);
  uint2* scales = reinterpret_cast<uint2*>(w + kWidenedOffset + row * kChunkBlocks * 2);
#pragma unroll
  for (int tile = 0; tile < 2; ++tile) {
    const uint32_t raw = *reinterpret_cast<const uint32_t*>(w + fused::kCodeBytes + tile * kTileBytes + in_tile);
    scales[tile] = widen_four_scales(raw, first_block + kTileKBlocks * tile, k_blocks);
  }
}

// The A registers of half h (k-steps 4h .. 4h + 3) of a stage, for stage rows rows.x and rows.y
// (fused::mma_row_sources) as MMA rows r0 and r0 + 8: word 2h + i of a row's 16 bytes at 16t
// feeds k-steps 4h + 2i and 4h + 2i + 1 (blocks of the chunk, each with its own scale), its pairs
// placed as fused::dequant_words places them.
__device__ __forceinline__ void dequant_half(const uint8_t* w, int2 rows, int t, int h, uint32_t (&frag)[4][4]) {
  const uint2 c0 = *reinterpret_cast<const uint2*>(w + fused::code_offset<true>(rows.x, t) + h * 8);
  const uint2 c1 = *reinterpret_cast<const uint2*>(w + fused::code_offset<true>(rows.y, t) + h * 8);
  const uint2 s0 = *reinterpret_cast<const uint2*>(w + kWidenedOffset + rows.x * kChunkBlocks * 2 + h * 8);
  const uint2 s1 = *reinterpret_cast<const uint2*>(w + kWidenedOffset + rows.y * kChunkBlocks * 2 + h * 8);
  const uint32_t words0[2] = {c0.x, c0.y}, words1[2] = {c1.x, c1.y};
  const uint32_t scales0[2] = {s0.x, s0.y}, scales1[2] = {s1.x, s1.y};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int step = 0; step < 2; ++step) {  // pairs 2 step, 2 step + 1: block 2i + step of the half
      const uint32_t sel = step == 0 ? 0x1010u : 0x3232u;  // that block's bf16 in both halves
      const uint32_t sc0 = __byte_perm(scales0[i], 0u, sel), sc1 = __byte_perm(scales1[i], 0u, sel);
      uint32_t (&f)[4] = frag[2 * i + step];
      f[0] = mul_bf16x2(step == 0 ? e2m1_pair_bits<0>(words0[i]) : e2m1_pair_bits<2>(words0[i]), sc0);
      f[1] = mul_bf16x2(step == 0 ? e2m1_pair_bits<0>(words1[i]) : e2m1_pair_bits<2>(words1[i]), sc1);
      f[2] = mul_bf16x2(step == 0 ? e2m1_pair_bits<1>(words0[i]) : e2m1_pair_bits<3>(words0[i]), sc0);
      f[3] = mul_bf16x2(step == 0 ? e2m1_pair_bits<1>(words1[i]) : e2m1_pair_bits<3>(words1[i]), sc1);
    }
  }
}

}  // namespace ws
}  // namespace sm90
}  // namespace jax_nvfp4
