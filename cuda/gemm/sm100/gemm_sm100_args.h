// How a GemmProblem becomes a CUTLASS block-scaled sm_100a GEMM: the launch plan (K/N padding,
// staging, 1-SM vs 2-SM, workspace carving) and the CUTLASS arguments (problem shape, strides,
// scale-factor layouts, pointers).
//
// Host-compilable (cute host code only, no kernels): the launcher (gemm_sm100.cu) and the host
// test program tests/host/gemm_sm100_args.cc both use exactly this code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/scale_layout.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "gemm/gemm_problem.h"

namespace jax_nvfp4 {
namespace sm100 {

// CUTLASS epilogue variants; an f16 result is computed as f32 and converted (one kernel less).
enum class OutKind : int { kF32 = 0, kBF16 = 1, kNvfp4 = 2 };

// TMA needs 16-byte aligned row pitches, and CUTLASS's can_implement also wants the contiguous
// extents to be multiples of that alignment: K of the 4-bit operands to 32, N of D to 16 bytes.
constexpr int64_t kAlignBytes = 16;
constexpr int64_t kKAlign = 32;            // 4-bit elements per 16 bytes
constexpr size_t kRegionAlign = 256;      // workspace regions start on 256-byte boundaries

// Tile of the 1-SM (128x128x256) and 2-SM (256x128x256, a 2x1 cluster) configurations.
constexpr int64_t kTileN = 128;
constexpr int64_t kTileM1Sm = 128;
constexpr int64_t kTileM2Sm = 256;

// CUTLASS's stride and scale layout types for K-major A/B and row-major D (the kernel TUs
// static_assert that they equal the collective's own).
using Stride = cute::Stride<int64_t, cute::Int<1>, int64_t>;
using ScaleConfig = cutlass::detail::Sm1xxBlockScaledConfig<kBlockSize>;
using OutScaleConfig = cutlass::detail::Sm1xxBlockScaledOutputConfig<kBlockSize>;
using LayoutSF = ScaleConfig::LayoutSF;
using LayoutSFD = OutScaleConfig::LayoutSF;

inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// CUTLASS's epilogue here applies no activation: with one, D is float32 and a pass applies it
// (then converts, or quantizes an NVFP4 output; a gated one halves the columns).
inline OutKind out_kind(const GemmProblem& p) {
  if (p.activation != Activation::kNone) return OutKind::kF32;
  if (p.nvfp4_out()) return OutKind::kNvfp4;
  return p.out_dtype == DType::kBF16 ? OutKind::kBF16 : OutKind::kF32;
}

// Bits of one element of D as CUTLASS stores it.
inline int64_t out_bits(OutKind kind) {
  return kind == OutKind::kF32 ? 32 : kind == OutKind::kBF16 ? 16 : 4;
}

// 2-SM tiles pay off once the 256x128 tiles alone keep every SM pair busy; smaller problems
// (decode, short prefill) keep more CTAs in flight with 128x128 tiles on one SM each.
inline bool use_two_sm(int64_t m, int64_t n, int sm_count) {
  if (m < kTileM2Sm) return false;
  return ceil_div(m, kTileM2Sm) * ceil_div(n, kTileN) >= sm_count / 2;
}

// Workspace offsets of the steps that need scratch; kUnused marks a step that is skipped.
constexpr size_t kUnused = ~size_t(0);

// Carves a workspace into regions, each starting on a kRegionAlign boundary: take(bytes) returns
// the next region's offset; top is where the next one would start.
struct Regions {
  size_t top = 0;
  size_t take(int64_t bytes) {
    const size_t at = top;
    top += static_cast<size_t>(round_up(bytes, kRegionAlign));
    return at;
  }
};

struct Plan {
  OutKind kind = OutKind::kF32;
  int64_t m = 0, n = 0, k = 0;
  int64_t k_pad = 0;  // K as CUTLASS sees it (codes padded with zeros when k_pad > k)
  int64_t n_pad = 0;  // N as CUTLASS sees it (B rows / bias / D columns padded when n_pad > n)
  bool two_sm = false;
  bool quantize_a = false;  // W4A16: A quantized with its dynamic amax first
  bool pad_a = false;       // A codes copied to a [m, k_pad/2] buffer
  bool pad_b = false;       // B codes copied to a [n_pad, k_pad/2] buffer
  bool copy_bias = false;   // bias converted to f32 and/or padded to n_pad
  bool stage_out = false;   // D written to the workspace, then copied/converted to the output
  bool activation_pass = false;  // the activation applied to a float32 D after the GEMM

  size_t a_codes = kUnused, a_scales = kUnused, a_s_dec = kUnused, quantize_ws = kUnused;
  size_t a_padded = kUnused, b_padded = kUnused, bias = kUnused, out_staged = kUnused;
  size_t activated = kUnused;  // gated activation, NVFP4 output: float32 [m, n / 2] to quantize
  size_t quantize_ws_bytes = 0;  // size of the quantizer's scratch region
  size_t scalars = 0;  // float alpha
  size_t cutlass_ws = 0;  // CUTLASS's own workspace starts here; its size comes from the kernel
};

// Why p cannot run on this path, or nullptr when it can.
inline const char* unsupported_reason(const GemmProblem& p) {
  if (p.stack.count != 1) return "one GEMM a call (the FFI handler runs a stack element by element)";
  if (p.m < 0 || p.n < 0 || p.k <= 0) return "m and n must be >= 0 and k > 0";
  if (p.k % kBlockSize != 0) return "k must be a multiple of 16";
  if (is_gated(p.activation) && p.n % 2 != 0) return "a gated activation needs n even";
  if (p.nvfp4_out() && out_cols(p) % kBlockSize != 0) {
    return "NVFP4 output needs its columns (n, or n / 2 gated) a multiple of 16";
  }
  if (!p.nvfp4_out() && p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16 &&
      p.out_dtype != DType::kF16) {
    return "unsupported output dtype";
  }
  // CUTLASS's problem shape is int; padded extents must fit.
  const int64_t limit = (int64_t(1) << 31) - 1024;
  if (p.m > limit || p.n > limit || p.k > limit) return "m, n, k must be < 2^31 - 1024";
  return nullptr;
}

// Returns the plan for p on a GPU with sm_count SMs; quantize_ws_bytes is what the quantize
// kernel needs for A (ignored for W4A4).
inline Plan make_plan(const GemmProblem& p, int sm_count, size_t quantize_ws_bytes) {
  Plan plan;
  plan.kind = out_kind(p);
  plan.m = p.m;
  plan.n = p.n;
  plan.k = p.k;
  plan.k_pad = round_up(p.k, kKAlign);
  plan.n_pad = round_up(p.n, kAlignBytes * 8 / out_bits(plan.kind));
  plan.two_sm = use_two_sm(p.m, p.n, sm_count);
  plan.quantize_a = !p.a_is_nvfp4;
  plan.pad_a = plan.k_pad != p.k;
  plan.pad_b = plan.k_pad != p.k || plan.n_pad != p.n;
  plan.copy_bias = p.bias != nullptr && (p.bias_dtype != DType::kF32 || plan.n_pad != p.n);
  plan.activation_pass = p.activation != Activation::kNone;
  plan.stage_out = plan.n_pad != p.n || is_gated(p.activation) ||
                   (plan.kind == OutKind::kF32 && (p.out_dtype != DType::kF32 || p.nvfp4_out()));

  Regions ws;
  const auto take = [&ws](int64_t bytes) { return ws.take(bytes); };
  plan.scalars = take(sizeof(float));
  if (plan.quantize_a) {
    plan.a_codes = take(p.m * p.k / 2);
    plan.a_scales = take(scale_matrix_bytes(p.m, p.k / kBlockSize));
    plan.a_s_dec = take(sizeof(float));
    plan.quantize_ws = take(static_cast<int64_t>(quantize_ws_bytes));
    plan.quantize_ws_bytes = quantize_ws_bytes;
  }
  if (plan.pad_a) plan.a_padded = take(p.m * plan.k_pad / 2);
  if (plan.pad_b) plan.b_padded = take(plan.n_pad * plan.k_pad / 2);
  if (plan.copy_bias) plan.bias = take(plan.n_pad * static_cast<int64_t>(sizeof(float)));
  if (plan.stage_out) plan.out_staged = take(p.m * plan.n_pad * out_bits(plan.kind) / 8);
  if (is_gated(p.activation) && p.nvfp4_out()) {
    plan.activated = take(p.m * out_cols(p) * static_cast<int64_t>(sizeof(float)));
  }
  plan.cutlass_ws = ws.top;
  return plan;
}

// Everything the CUTLASS kernel is launched with (pointers are device pointers).
struct Args {
  int m = 0, n = 0, k = 0;  // CUTLASS problem (M, N, K), batch 1
  const uint8_t* a = nullptr;
  Stride stride_a;
  const uint8_t* b = nullptr;
  Stride stride_b;
  const uint8_t* sfa = nullptr;
  LayoutSF layout_sfa;
  const uint8_t* sfb = nullptr;
  LayoutSF layout_sfb;
  void* d = nullptr;
  Stride stride_d;
  const float* alpha = nullptr;
  const float* bias = nullptr;  // f32 [n] or null
  uint8_t* sfd = nullptr;       // NVFP4 output scales, tiled
  LayoutSFD layout_sfd;
  const float* norm_constant = nullptr;  // the output's encode scale S_enc
  void* workspace = nullptr;             // CUTLASS's own
};

// Row-major [rows, cols] (cols contiguous), batch stride rows*cols.
inline Stride packed_stride(int64_t rows, int64_t cols) {
  return Stride{cols, cute::Int<1>{}, rows * cols};
}

template <class T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(base) + offset);
}

inline Args make_args(const GemmProblem& p, const Plan& plan) {
  Args args;
  args.m = static_cast<int>(plan.m);
  args.n = static_cast<int>(plan.n_pad);
  args.k = static_cast<int>(plan.k_pad);
  void* ws = p.workspace;

  const uint8_t* a = plan.quantize_a ? at<uint8_t>(ws, plan.a_codes) : p.a_q.codes;
  args.a = plan.pad_a ? at<uint8_t>(ws, plan.a_padded) : a;
  args.b = plan.pad_b ? at<uint8_t>(ws, plan.b_padded) : p.b.codes;
  args.stride_a = packed_stride(plan.m, plan.k_pad);
  args.stride_b = packed_stride(plan.n_pad, plan.k_pad);
  // K padding to a multiple of 32 never adds a 64-wide scale tile, so the caller's scales
  // (already zero-padded to whole tiles) are used as they are.
  args.sfa = plan.quantize_a ? at<uint8_t>(ws, plan.a_scales) : p.a_q.scales;
  args.sfb = p.b.scales;
  const auto mnkl = cute::make_shape(args.m, args.n, args.k, 1);
  args.layout_sfa = ScaleConfig::tile_atom_to_shape_SFA(mnkl);
  args.layout_sfb = ScaleConfig::tile_atom_to_shape_SFB(mnkl);

  args.stride_d = packed_stride(plan.m, plan.n_pad);
  if (plan.stage_out) {
    args.d = at<void>(ws, plan.out_staged);
  } else {
    args.d = plan.kind == OutKind::kNvfp4 ? static_cast<void*>(p.out_codes) : p.out;
  }
  args.alpha = at<float>(ws, plan.scalars);
  args.bias = plan.copy_bias ? at<float>(ws, plan.bias) : static_cast<const float*>(p.bias);
  if (plan.kind == OutKind::kNvfp4) {
    args.sfd = p.out_scales;
    args.layout_sfd = OutScaleConfig::tile_atom_to_shape_SFD(mnkl);
    args.norm_constant = p.out_s_enc;
  }
  args.workspace = at<void>(ws, plan.cutlass_ws);
  return args;
}

}  // namespace sm100
}  // namespace jax_nvfp4
