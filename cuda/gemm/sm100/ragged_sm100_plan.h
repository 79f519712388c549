// How a ragged GemmProblem (lax.ragged_dot with NVFP4 weights) becomes one CUTLASS grouped
// block-scaled sm_100a GEMM: the workspace plan, where each group's rows lie, and each group's
// CUTLASS arguments (problem shape, pointers, strides, scale layouts), which a setup kernel
// writes on the device from group_sizes (no host sync).
//
// Group g is a GEMM of its count_g rows of A (from row start_g) with weight matrix g, into rows
// start_g.. of a float32 D [m, n]. A's scales are tiled over all m rows, so a group starting
// mid-tile has no scale tensor of its own there: they are copied into a region where each group's
// rows start on a 128-row tile boundary, the layout CUTLASS expects of a count_g-row operand.
// A pass then forms the output from D: alpha_g, group g's bias, the activation, the dtype, and
// zeros on the rows of no group.
//
// Host-compilable (cute host code only): the launcher (ragged_sm100.cu) and the host test
// program tests/host/ragged_sm100_plan.cc use exactly this code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/scale_layout.h"
#include "gemm/gemm_problem.h"
#include "gemm/sm100/gemm_sm100_args.h"

namespace jax_nvfp4 {
namespace sm100 {

// A group's CUTLASS problem (M, N, K) and its per-group strides (no batch mode).
using GroupShape = cute::Shape<int, int, int>;
using GroupStride = cute::Stride<int64_t, cute::Int<1>, cute::Int<0>>;

// Why the grouped kernel cannot run p (the Python side routes such shapes to XLA), or nullptr.
// D is float32 with rows of n elements and A/B rows of k 4-bit codes: TMA wants both 16 bytes
// apart, and CUTLASS wants the contiguous extents multiples of that alignment.
inline const char* ragged_unsupported_reason(const GemmProblem& p) {
  if (!p.ragged()) return "not a ragged problem";
  if (p.nvfp4_out()) return "the ragged output is float only";
  if (p.m < 0 || p.n < 0 || p.k <= 0) return "m and n must be >= 0 and k > 0";
  if (p.k % kKAlign != 0) return "k must be a multiple of 32";
  if (p.n % 4 != 0) return "n must be a multiple of 4";
  if (is_gated(p.activation) && p.n % 2 != 0) return "a gated activation needs n even";
  if (p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16 && p.out_dtype != DType::kF16) {
    return "unsupported output dtype";
  }
  const int64_t limit = (int64_t(1) << 31) - 1024;
  if (p.m > limit || p.n > limit || p.k > limit || p.stack.count > limit) {
    return "m, n, k and the group count must be < 2^31 - 1024";
  }
  return nullptr;
}

// Rows of scale tiles the regrouped A scales can need: a group of c rows takes ceil(c / 128)
// tiles, and the counts sum to at most m, so sum ceil(c_g / 128) <= ceil(m / 128) + G - 1.
inline int64_t regrouped_row_tiles(int64_t m, int64_t groups) {
  return ceil_div(m, kTileRows) + groups;
}

struct RaggedPlan {
  int64_t groups = 0;
  bool quantize_a = false;  // W4A16: A quantized with its dynamic amax first
  size_t a_codes = kUnused, a_scales = kUnused, a_s_dec = kUnused, quantize_ws = kUnused;
  size_t sfa = 0;    // A's scales, each group's rows from a tile boundary
  size_t d = 0;      // float32 [m, n]
  size_t rows = 0;   // int32 [3G + 1]: start_g, end_g (row after the group), first tile_g; tiles
  size_t shapes = 0, ptr_a = 0, ptr_b = 0, ptr_sfa = 0, ptr_sfb = 0, ptr_d = 0;  // [G] each
  size_t stride_a = 0, stride_b = 0, stride_d = 0, layout_sfa = 0, layout_sfb = 0;  // [G] each
  size_t cutlass_ws = 0;  // CUTLASS's own workspace starts here
};

inline RaggedPlan make_ragged_plan(const GemmProblem& p, size_t quantize_ws_bytes) {
  RaggedPlan plan;
  plan.groups = p.stack.count;
  plan.quantize_a = !p.a_is_nvfp4;
  Regions ws;
  const auto take = [&ws](int64_t bytes) { return ws.take(bytes); };
  const int64_t g = plan.groups, k_blocks = p.k / kBlockSize;
  if (plan.quantize_a) {
    plan.a_codes = take(p.m * p.k / 2);
    plan.a_scales = take(scale_matrix_bytes(p.m, k_blocks));
    plan.a_s_dec = take(sizeof(float));
    plan.quantize_ws = take(static_cast<int64_t>(quantize_ws_bytes));
  }
  plan.sfa = take(regrouped_row_tiles(p.m, g) * scale_k_tiles(k_blocks) * kTileBytes);
  plan.d = take(p.m * p.n * static_cast<int64_t>(sizeof(float)));
  plan.rows = take((3 * g + 1) * static_cast<int64_t>(sizeof(int32_t)));
  plan.shapes = take(g * static_cast<int64_t>(sizeof(GroupShape)));
  const int64_t ptrs = g * static_cast<int64_t>(sizeof(void*));
  plan.ptr_a = take(ptrs);
  plan.ptr_b = take(ptrs);
  plan.ptr_sfa = take(ptrs);
  plan.ptr_sfb = take(ptrs);
  plan.ptr_d = take(ptrs);
  plan.stride_a = take(g * static_cast<int64_t>(sizeof(GroupStride)));
  plan.stride_b = take(g * static_cast<int64_t>(sizeof(GroupStride)));
  plan.stride_d = take(g * static_cast<int64_t>(sizeof(GroupStride)));
  plan.layout_sfa = take(g * static_cast<int64_t>(sizeof(LayoutSF)));
  plan.layout_sfb = take(g * static_cast<int64_t>(sizeof(LayoutSF)));
  plan.cutlass_ws = ws.top;
  return plan;
}

// Rows [start, end) of group g given the running sum `before` of the (non-negative) sizes of the
// groups before it, group 0's rows from `first` (already clipped to [0, m]): the kernel's rule,
// as reference.ragged_segments states it.
struct GroupRows {
  int64_t start, end;
};
CUTE_HOST_DEVICE GroupRows group_rows(int64_t first, int64_t before, int64_t size, int64_t m) {
  const int64_t own = size > 0 ? size : 0;
  const int64_t start = first + before < m ? first + before : m;
  return {start, first + before + own < m ? first + before + own : m};
}

// Everything CUTLASS reads of group g: A (codes from row `start`, scales from row tile
// `first_tile` of the regrouped region), weight matrix g, D from row `start`.
struct GroupArgs {
  GroupShape shape;
  const uint8_t* a;
  const uint8_t* b;
  const uint8_t* sfa;
  const uint8_t* sfb;
  float* d;
  GroupStride stride_a, stride_b, stride_d;
  LayoutSF layout_sfa, layout_sfb;
};

// The operands of a ragged call, as the setup kernel sees them.
struct RaggedOperands {
  const uint8_t* a_codes;   // [m, k/2]
  const uint8_t* sfa;       // the regrouped scales
  const uint8_t* b_codes;   // [G, n, k/2]
  const uint8_t* b_scales;  // [G] x scale_matrix_bytes(n, k/16)
  float* d;                 // [m, n]
  int64_t n, k;
};

CUTE_HOST_DEVICE GroupArgs group_args(const RaggedOperands& o, int64_t g, int64_t start,
                                      int64_t count, int64_t first_tile) {
  GroupArgs r;
  const int m = static_cast<int>(count), n = static_cast<int>(o.n), k = static_cast<int>(o.k);
  r.shape = GroupShape{m, n, k};
  const int64_t k_tiles = scale_k_tiles(o.k / kBlockSize);
  r.a = o.a_codes + start * (o.k / 2);
  r.b = o.b_codes + g * o.n * (o.k / 2);
  r.sfa = o.sfa + first_tile * k_tiles * kTileBytes;
  r.sfb = o.b_scales + g * scale_matrix_bytes(o.n, o.k / kBlockSize);
  r.d = o.d + start * o.n;
  r.stride_a = GroupStride{o.k, cute::Int<1>{}, cute::Int<0>{}};
  r.stride_b = GroupStride{o.k, cute::Int<1>{}, cute::Int<0>{}};
  r.stride_d = GroupStride{o.n, cute::Int<1>{}, cute::Int<0>{}};
  const auto mnkl = cute::make_shape(m, n, k, 1);
  r.layout_sfa = ScaleConfig::tile_atom_to_shape_SFA(mnkl);
  r.layout_sfb = ScaleConfig::tile_atom_to_shape_SFB(mnkl);
  return r;
}

// Byte of the regrouped scales that holds (row r of group g, block j), and of A's own scales
// that holds the same scale (row start_g + r): the regroup kernel copies one to the other.
CUTE_HOST_DEVICE int64_t regrouped_scale_offset(int64_t first_tile, int64_t r, int64_t j,
                                                int64_t k_blocks) {
  return first_tile * scale_k_tiles(k_blocks) * kTileBytes + scale_offset(r, j, k_blocks);
}

}  // namespace sm100
}  // namespace jax_nvfp4
