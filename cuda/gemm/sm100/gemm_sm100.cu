// The sm_100a GEMM launcher: plans the problem (gemm_sm100_args.h), runs the preparation steps
// (quantize A for W4A16, pad K/N where TMA needs it, epilogue scalars), the CUTLASS kernel, and
// copies a staged output into place; with an activation, D is float32 and one pass applies it
// (before the output cast, or before quantizing an NVFP4 output; a gated one pairs D's columns).
// Everything is enqueued on the stream; nothing syncs.
#include "gemm/sm100/gemm_sm100.h"

#include <algorithm>

#include "gemm/activation_pass.cuh"
#include "gemm/sm100/gemm_sm100_args.h"
#include "gemm/sm100/gemm_sm100_kernels.h"
#include "gemm/sm100/gemm_sm100_prep.h"
#include "quantize/quantize.h"

namespace jax_nvfp4 {
namespace {

using sm100::Elem;
using sm100::MatrixRef;
using sm100::OutKind;
using sm100::Plan;

// W4A16: A quantized with its dynamic amax into the plan's workspace regions.
QuantizeProblem quantize_a_problem(const GemmProblem& p, const Plan& plan) {
  void* ws = p.workspace;
  if (ws == nullptr) return sm100::quantize_a_problem(p, nullptr, nullptr, nullptr, nullptr);
  return sm100::quantize_a_problem(p, sm100::at<uint8_t>(ws, plan.a_codes),
                                   sm100::at<uint8_t>(ws, plan.a_scales),
                                   sm100::at<float>(ws, plan.a_s_dec),
                                   sm100::at<void>(ws, plan.quantize_ws));
}

Plan plan_for(const GemmProblem& p, int sm_count) {
  GemmProblem shape_only = p;  // the quantizer's workspace size depends on shapes only
  shape_only.workspace = nullptr;
  const size_t quantize_ws =
      p.a_is_nvfp4 ? 0 : quantize_workspace_bytes(quantize_a_problem(shape_only, Plan{}));
  return sm100::make_plan(p, sm_count, quantize_ws);
}

template <bool kTwoSm>
size_t cutlass_ws(OutKind kind, const sm100::Args& args, int sm) {
  switch (kind) {
    case OutKind::kF32: return sm100::cutlass_workspace_bytes<OutKind::kF32, kTwoSm>(args, sm);
    case OutKind::kBF16: return sm100::cutlass_workspace_bytes<OutKind::kBF16, kTwoSm>(args, sm);
    default: return sm100::cutlass_workspace_bytes<OutKind::kNvfp4, kTwoSm>(args, sm);
  }
}

template <bool kTwoSm>
cudaError_t run(OutKind kind, const sm100::Args& args, int sm, cudaStream_t stream) {
  switch (kind) {
    case OutKind::kF32: return sm100::run_cutlass<OutKind::kF32, kTwoSm>(args, sm, stream);
    case OutKind::kBF16: return sm100::run_cutlass<OutKind::kBF16, kTwoSm>(args, sm, stream);
    default: return sm100::run_cutlass<OutKind::kNvfp4, kTwoSm>(args, sm, stream);
  }
}

Elem elem_of(DType t) {
  return t == DType::kF32 ? Elem::kF32 : t == DType::kBF16 ? Elem::kBF16 : Elem::kF16;
}

// K-major 4-bit codes [rows, k] as a byte matrix with `pitch_k` elements per row.
MatrixRef codes_ref(const void* data, int64_t rows, int64_t k, int64_t pitch_k) {
  return MatrixRef{data, Elem::kU8, rows, k / 2, pitch_k / 2};
}

// Device scratch p needs on a GPU of `sm` SMs.
size_t workspace_on(const GemmProblem& p, int sm) {
  if (p.ragged()) return ragged_sm100_workspace_bytes(p, sm);
  if (sm100::unsupported_reason(p) != nullptr || p.m == 0 || p.n == 0) return 0;
  GemmProblem shape_only = p;
  shape_only.workspace = nullptr;
  const Plan plan = plan_for(shape_only, sm);
  const sm100::Args args = sm100::make_args(shape_only, plan);
  const size_t cutlass = plan.two_sm ? cutlass_ws<true>(plan.kind, args, sm)
                                     : cutlass_ws<false>(plan.kind, args, sm);
  return plan.cutlass_ws + cutlass;
}

}  // namespace

size_t gemm_sm100_workspace_bytes(const GemmProblem& p) { return workspace_on(p, sm100::current_sm_count()); }

size_t gemm_sm100_lowered_workspace_bytes(const GemmProblem& p) {
  size_t bytes = 0;
  for (int sm = 1; sm <= sm100::kMaxSm100Sms; ++sm) bytes = std::max(bytes, workspace_on(p, sm));
  return bytes;
}

cudaError_t gemm_sm100(const GemmProblem& p, cudaStream_t stream) {
  if (p.ragged()) return ragged_sm100(p, stream);
  if (sm100::unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  const bool nvfp4_out = p.nvfp4_out();
  if (nvfp4_out) {  // padding scale entries (rows past m, blocks past n/16) must read as zero
    JAX_NVFP4_TRY(cudaMemsetAsync(p.out_scales, 0, scale_matrix_bytes(p.m, out_cols(p) / kBlockSize),
                                  stream));
  }
  if (p.m == 0 || p.n == 0) {
    return sm100::epilogue_scalars(nullptr, nullptr, nullptr, nvfp4_out ? p.out_s_enc : nullptr,
                                   p.out_s_dec, stream);
  }
  const int sm = sm100::current_sm_count();
  if (p.workspace_bytes < workspace_on(p, sm)) return cudaErrorInvalidValue;

  const Plan plan = plan_for(p, sm);
  const sm100::Args args = sm100::make_args(p, plan);
  void* ws = p.workspace;

  const float* a_s_dec = p.a_q.s_dec;
  const uint8_t* a_codes = p.a_q.codes;
  if (plan.quantize_a) {
    const QuantizeProblem q = quantize_a_problem(p, plan);
    JAX_NVFP4_TRY(quantize_sm100(q, stream));
    a_s_dec = q.s_dec;
    a_codes = q.codes;
  }
  if (plan.pad_a) {
    JAX_NVFP4_TRY(sm100::copy_matrix(codes_ref(a_codes, p.m, p.k, p.k),
                                     codes_ref(args.a, p.m, plan.k_pad, plan.k_pad), stream));
  }
  if (plan.pad_b) {
    JAX_NVFP4_TRY(sm100::copy_matrix(codes_ref(p.b.codes, p.n, p.k, p.k),
                                     codes_ref(args.b, plan.n_pad, plan.k_pad, plan.k_pad),
                                     stream));
  }
  if (plan.copy_bias) {
    JAX_NVFP4_TRY(sm100::copy_matrix(MatrixRef{p.bias, elem_of(p.bias_dtype), 1, p.n, p.n},
                                     MatrixRef{args.bias, Elem::kF32, 1, plan.n_pad, plan.n_pad},
                                     stream));
  }
  JAX_NVFP4_TRY(sm100::epilogue_scalars(a_s_dec, p.b.s_dec, sm100::at<float>(ws, plan.scalars),
                                        nvfp4_out ? p.out_s_enc : nullptr, p.out_s_dec, stream));

  JAX_NVFP4_TRY(plan.two_sm ? run<true>(plan.kind, args, sm, stream)
                            : run<false>(plan.kind, args, sm, stream));

  if (plan.activation_pass) {
    // D: float32 [m, n] (pitch n_pad), staged unless it is the float32 output itself.
    float* d = static_cast<float*>(args.d);
    if (!nvfp4_out) {
      return activation_pass(d, DType::kF32, p.m, p.n, plan.n_pad, p.out, p.out_dtype, p.activation,
                             stream);
    }
    // NVFP4 output: n % 16 == 0, so n_pad == n and the staged D is contiguous. The activated
    // float32 [m, out_cols] replaces D, or, gated, goes to its own region.
    float* y = plan.activated != sm100::kUnused ? sm100::at<float>(ws, plan.activated) : d;
    JAX_NVFP4_TRY(activation_pass(d, DType::kF32, p.m, p.n, plan.n_pad, y, DType::kF32, p.activation,
                                  stream));
    QuantizeProblem q;
    q.rows = q.rows_per_matrix = p.m;
    q.k = out_cols(p);
    q.x = y;
    q.x_dtype = DType::kF32;
    q.s_enc = p.out_s_enc;  // given: no amax, no workspace
    q.codes = p.out_codes;
    q.scales = p.out_scales;
    q.s_dec = p.out_s_dec;
    return quantize_sm100(q, stream);
  }
  if (plan.stage_out) {
    if (nvfp4_out) {
      JAX_NVFP4_TRY(sm100::copy_matrix(codes_ref(args.d, p.m, p.n, plan.n_pad),
                                       codes_ref(p.out_codes, p.m, p.n, p.n), stream));
    } else {
      const Elem staged = plan.kind == OutKind::kBF16 ? Elem::kBF16 : Elem::kF32;
      JAX_NVFP4_TRY(sm100::copy_matrix(MatrixRef{args.d, staged, p.m, p.n, plan.n_pad},
                                       MatrixRef{p.out, elem_of(p.out_dtype), p.m, p.n, p.n},
                                       stream));
    }
  }
  return cudaSuccess;
}

}  // namespace jax_nvfp4
