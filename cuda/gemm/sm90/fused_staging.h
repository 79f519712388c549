// Where the fused sm_90a GEMM (gemm_fused.cu) finds its activations: the K order of a staged
// chunk and its shared-memory layout (host-testable: tests/host/gemm_sm90_fused_layout.cc checks
// the layout against CuTe's own wgmma swizzle atom).
//
// Order: within a chunk of 128 K elements, lane t of the weight layout holds elements
// 32t .. 32t+31 and dequantizes pair j of word q as elements 32t + 8q + {j, j + 4}
// (nvfp4_bf16x2.h), which feed k slots 2t, 2t + 1 of k-group (8 slots) kg = 4q + j, the first or
// second half of k-step kg / 2. So word t of a staged row in k-group kg is that pair of x.
//
// Layout: one [MT x 128] bf16 tile per (m_tile, chunk), in wgmma's K-major 128-byte swizzle
// layout: two 64-slot halves of the chunk (kg / 8), each MT rows of 128 bytes, 8-row atoms of
// 1024 bytes, the 16-byte k-group kg % 8 of row r stored at position (kg % 8) ^ (r % 8).
#pragma once

#include "common/scale_layout.h"

namespace jax_nvfp4 {
namespace sm90 {

// The k-group of element e (0..127) of a chunk; within it the element is word e / 32 (its lane
// t), half (e % 8) / 4.
NVFP4_HD constexpr int staged_k_group(int e) { return 4 * ((e % 32) / 8) + e % 4; }

// Word index, within a tile of MT rows, of word t of k-group kg of row `row`.
template <int MT>
NVFP4_HD constexpr int staged_word(int kg, int row, int t) {
  return ((kg / 8) * MT * 128 + (row / 8) * 1024 + (row % 8) * 128 + (((kg % 8) ^ (row % 8)) * 16)) / 4 + t;
}

// Byte offset, within a tile, of k-step s (k-groups 2s, 2s + 1) in the descriptor's terms: the
// start of row 0's k-group 2s before swizzling.
template <int MT>
NVFP4_HD constexpr int staged_k_step_offset(int s) {
  return (s / 4) * MT * 128 + (s % 4) * 32;
}

}  // namespace sm90
}  // namespace jax_nvfp4
