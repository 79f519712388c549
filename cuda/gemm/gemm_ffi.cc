// XLA FFI handlers "jax_nvfp4_gemm" (float output) and "jax_nvfp4_gemm_nvfp4_out" (NVFP4 output)
// of the matmul primitive (jax_nvfp4/primitives/matmul.py): they decode the buffers into a
// GemmProblem and run the kernel family of the device (sm_90a on compute capability 9.0,
// sm_100a on 10.0) in the workspace result sized by gemm_call_workspace.
//
// Operands, in order (absent ones as placeholders):
//   a          [M, K] bf16/f16/f32 (W4A16) or float4_e2m1fn codes (W4A4)
//   a_scales   tiled e4m3 scales of a (f8[0] for W4A16);  a_s_dec  f32 scalar (1.0 for W4A16)
//   b_codes    [N, K] float4_e2m1fn;  b_scales  tiled e4m3;  b_s_dec  f32 scalar
//   bias       [N] bf16/f16/f32, or f32[0]
//   out_s_enc  f32 scalar (NVFP4 output), or f32[0]
// Results: out [M, C] bf16/f16/f32; or codes [M, C] float4_e2m1fn, tiled scales, s_dec f32;
// then the workspace (uint8, common/workspace_registry.h). C = N, or N / 2 with a gated
// activation (N even).
// Attributes: path (GemmPath: 0 the launcher's choice, 1 decode, 2 prefill, 3 fused, 4 fused_ws,
// 5 prefill_cutlass, 6 fused_ws_wide) and activation (Activation: 0 none, 1 relu, 2 gelu, 3 silu,
// 4 swiglu, 5 geglu).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/ffi_registry.h"
#include "common/ffi_utils.h"
#include "common/scale_layout.h"
#include "common/workspace_registry.h"
#include "gemm/gemm_problem.h"
#ifdef JAX_NVFP4_HAS_SM90
#include "gemm/sm90/gemm_sm90.h"
#endif
#ifdef JAX_NVFP4_HAS_SM100
#include "gemm/sm100/gemm_sm100.h"
#endif

namespace jax_nvfp4 {
namespace {

ffi::Error invalid(const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jax_nvfp4_gemm: " + what);
}

std::string dims_str(ffi::AnyBuffer::Dimensions d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

ffi::Error decode_path(int64_t path, GemmProblem* p) {
  if (path < 0 || path > static_cast<int64_t>(GemmPath::kFusedWsWide)) {
    return invalid("path must be 0 (auto), 1 (decode), 2 (prefill), 3 (fused), 4 (fused_ws), 5 "
                   "(prefill_cutlass) or 6 (fused_ws_wide), got " + std::to_string(path));
  }
  p->path = static_cast<GemmPath>(path);
  return ffi::Error::Success();
}

ffi::Error decode_activation(int64_t activation, GemmProblem* p) {
  if (activation < 0 || activation > static_cast<int64_t>(Activation::kGeglu)) {
    return invalid("activation must be 0 (none), 1 (relu), 2 (gelu), 3 (silu), 4 (swiglu) or "
                   "5 (geglu), got " + std::to_string(activation));
  }
  p->activation = static_cast<Activation>(activation);
  if (is_gated(p->activation) && p->n % 2 != 0) {
    return invalid("a gated activation needs N (the weight's rows) even, got " + std::to_string(p->n));
  }
  return ffi::Error::Success();
}

// The NVFP4 operand `name` [rows, k] (codes already checked): its tiled e4m3 scales and float32
// s_dec scalar.
ffi::Error nvfp4_operand(const std::string& name, ffi::AnyBuffer codes, ffi::AnyBuffer scales,
                         ffi::AnyBuffer s_dec, int64_t rows, int64_t k, Nvfp4Operand* out) {
  if (scales.element_type() != ffi::DataType::F8E4M3FN ||
      static_cast<int64_t>(scales.element_count()) != scale_matrix_bytes(rows, k / kBlockSize)) {
    return invalid(name + "_scales must be the tiled e4m3 scales of " + name + " " +
                   dims_str(codes.dimensions()));
  }
  if (s_dec.element_type() != ffi::DataType::F32 || s_dec.element_count() != 1) {
    return invalid(name + "_s_dec must be a float32 scalar");
  }
  *out = {static_cast<const uint8_t*>(codes.untyped_data()),
          static_cast<const uint8_t*>(scales.untyped_data()),
          static_cast<const float*>(s_dec.untyped_data())};
  return ffi::Error::Success();
}

// Fills everything but the outputs; checks shapes and dtypes.
ffi::Error decode_operands(ffi::AnyBuffer a, ffi::AnyBuffer a_scales, ffi::AnyBuffer a_s_dec,
                           ffi::AnyBuffer b_codes, ffi::AnyBuffer b_scales, ffi::AnyBuffer b_s_dec,
                           ffi::AnyBuffer bias, GemmProblem* p) {
  const auto ad = a.dimensions(), bd = b_codes.dimensions();
  if (ad.size() != 2 || bd.size() != 2) {
    return invalid("a and b must be rank 2, got a " + dims_str(ad) + " and b " + dims_str(bd));
  }
  p->m = ad[0];
  p->k = ad[1];
  p->n = bd[0];
  if (bd[1] != p->k || p->k <= 0 || p->k % kBlockSize != 0) {
    return invalid("K must match and be a positive multiple of 16: a " + dims_str(ad) + ", b " +
                   dims_str(bd));
  }
  if (b_codes.element_type() != ffi::DataType::F4E2M1FN) return invalid("b must be float4_e2m1fn");
  if (auto err = nvfp4_operand("b", b_codes, b_scales, b_s_dec, p->n, p->k, &p->b); err.failure()) {
    return err;
  }
  p->a_is_nvfp4 = a.element_type() == ffi::DataType::F4E2M1FN;
  if (p->a_is_nvfp4) {
    if (auto err = nvfp4_operand("a", a, a_scales, a_s_dec, p->m, p->k, &p->a_q); err.failure()) {
      return err;
    }
  } else if (!to_dtype(a.element_type(), &p->a_dtype)) {
    return invalid("a must be bf16, f16, f32 or float4_e2m1fn");
  }
  p->a = a.untyped_data();

  if (bias.element_count() > 0) {
    if (static_cast<int64_t>(bias.element_count()) != p->n || !to_dtype(bias.element_type(), &p->bias_dtype)) {
      return invalid("bias must be a bf16/f16/f32 vector of N = " + std::to_string(p->n) + " elements");
    }
    p->bias = bias.untyped_data();
  }
  return ffi::Error::Success();
}

// Bytes of workspace `p` needs on a device of compute capability `cc` (0 if none runs it).
size_t workspace_bytes(int cc, const GemmProblem& p) {
  switch (cc) {
#ifdef JAX_NVFP4_HAS_SM90
    case 90: return gemm_sm90_workspace_bytes(p);
#endif
#ifdef JAX_NVFP4_HAS_SM100
    case 100: return gemm_sm100_workspace_bytes(p);
#endif
    default: return 0;
  }
}

ffi::Error run(cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& workspace, GemmProblem& p) {
  const int cc = current_compute_capability();
  p.workspace_bytes = workspace_bytes(cc, p);
  if (auto err = bind_workspace(workspace, p.workspace_bytes, &p.workspace, "jax_nvfp4_gemm");
      err.failure()) {
    return err;
  }
  switch (cc) {
#ifdef JAX_NVFP4_HAS_SM90
    case 90: return cuda_error(gemm_sm90(p, stream), "jax_nvfp4_gemm (sm_90a)");
#endif
#ifdef JAX_NVFP4_HAS_SM100
    case 100: return cuda_error(gemm_sm100(p, stream), "jax_nvfp4_gemm (sm_100a)");
#endif
    default:
      return ffi::Error(ffi::ErrorCode::kUnimplemented,
                        "jax_nvfp4_gemm: no NVFP4 GEMM kernel compiled for compute capability " +
                            std::to_string(cc / 10) + "." + std::to_string(cc % 10));
  }
}

// The workspace of a call with these operand and result shapes (operands in the order above):
// the sizes read only the shapes, the dtypes and which of the optional pointers are set.
size_t gemm_call_workspace(const WorkspaceQuery& q) {
  static uint8_t placeholder;
  static const float placeholder_f = 0.f;
  const ArgShape& a = q.args.at(0);
  GemmProblem p;
  const auto path = q.attrs.find("path");
  if (path != q.attrs.end()) decode_path(path->second, &p);
  p.m = a.dims.at(0);
  p.k = a.dims.at(1);
  p.n = q.args.at(3).dims.at(0);
  const auto activation = q.attrs.find("activation");
  if (activation != q.attrs.end()) decode_activation(activation->second, &p);
  p.a_is_nvfp4 = a.type == ffi::DataType::F4E2M1FN;
  if (!p.a_is_nvfp4) to_dtype(a.type, &p.a_dtype);
  if (q.args.at(6).elements() > 0) {
    p.bias = &placeholder;
    to_dtype(q.args[6].type, &p.bias_dtype);
  }
  if (q.rets.size() == 3) {  // NVFP4 output
    p.out_codes = &placeholder;
    p.out_scales = &placeholder;
    p.out_s_enc = &placeholder_f;
    p.out_dtype = DType::kF32;
  } else {
    to_dtype(q.rets.at(0).type, &p.out_dtype);
  }
  return workspace_result_bytes(workspace_bytes(q.compute_capability, p));
}

ffi::Error gemm_impl(cudaStream_t stream, ffi::AnyBuffer a,
                     ffi::AnyBuffer a_scales, ffi::AnyBuffer a_s_dec, ffi::AnyBuffer b_codes,
                     ffi::AnyBuffer b_scales, ffi::AnyBuffer b_s_dec, ffi::AnyBuffer bias,
                     ffi::AnyBuffer out_s_enc, ffi::Result<ffi::AnyBuffer> out,
                     ffi::Result<ffi::AnyBuffer> workspace, int64_t path, int64_t activation) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_gemm");
  (void)out_s_enc;
  GemmProblem p;
  if (auto err = decode_operands(a, a_scales, a_s_dec, b_codes, b_scales, b_s_dec, bias, &p);
      err.failure()) {
    return err;
  }
  if (auto err = decode_path(path, &p); err.failure()) return err;
  if (auto err = decode_activation(activation, &p); err.failure()) return err;
  const auto od = out->dimensions();
  if (od.size() != 2 || od[0] != p.m || od[1] != out_cols(p)) {
    return invalid("out must be [M, " + std::string(is_gated(p.activation) ? "N / 2" : "N") + "], got " +
                   dims_str(od));
  }
  if (!to_dtype(out->element_type(), &p.out_dtype)) return invalid("out must be bf16, f16 or f32");
  p.out = out->untyped_data();
  return run(stream, workspace, p);
}

ffi::Error gemm_nvfp4_out_impl(cudaStream_t stream, ffi::AnyBuffer a,
                               ffi::AnyBuffer a_scales, ffi::AnyBuffer a_s_dec, ffi::AnyBuffer b_codes,
                               ffi::AnyBuffer b_scales, ffi::AnyBuffer b_s_dec, ffi::AnyBuffer bias,
                               ffi::AnyBuffer out_s_enc, ffi::Result<ffi::AnyBuffer> out_codes,
                               ffi::Result<ffi::AnyBuffer> out_scales,
                               ffi::Result<ffi::AnyBuffer> out_s_dec,
                               ffi::Result<ffi::AnyBuffer> workspace, int64_t path,
                               int64_t activation) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_gemm_nvfp4_out");
  GemmProblem p;
  if (auto err = decode_operands(a, a_scales, a_s_dec, b_codes, b_scales, b_s_dec, bias, &p);
      err.failure()) {
    return err;
  }
  if (auto err = decode_path(path, &p); err.failure()) return err;
  if (auto err = decode_activation(activation, &p); err.failure()) return err;
  const int64_t cols = out_cols(p);
  if (cols % kBlockSize != 0) {
    return invalid("NVFP4 output needs its columns a multiple of 16, got " + std::to_string(cols));
  }
  const auto od = out_codes->dimensions();
  if (out_codes->element_type() != ffi::DataType::F4E2M1FN || od.size() != 2 || od[0] != p.m ||
      od[1] != cols) {
    return invalid("out codes must be float4_e2m1fn [M, " + std::to_string(cols) + "], got " + dims_str(od));
  }
  if (static_cast<int64_t>(out_scales->element_count()) != scale_matrix_bytes(p.m, cols / kBlockSize)) {
    return invalid("out scales must be the tiled scales of [M, " + std::to_string(cols) + "]");
  }
  if (out_s_enc.element_type() != ffi::DataType::F32 || out_s_enc.element_count() != 1) {
    return invalid("out_s_enc must be a float32 scalar");
  }
  p.out_codes = static_cast<uint8_t*>(out_codes->untyped_data());
  p.out_scales = static_cast<uint8_t*>(out_scales->untyped_data());
  p.out_s_enc = static_cast<const float*>(out_s_enc.untyped_data());
  p.out_s_dec = static_cast<float*>(out_s_dec->untyped_data());
  p.out_dtype = DType::kF32;
  return run(stream, workspace, p);
}

}  // namespace

#define JAX_NVFP4_GEMM_OPERANDS                 \
  .Ctx<ffi::PlatformStream<cudaStream_t>>()     \
      .Arg<ffi::AnyBuffer>() /* a */            \
      .Arg<ffi::AnyBuffer>() /* a_scales */     \
      .Arg<ffi::AnyBuffer>() /* a_s_dec */      \
      .Arg<ffi::AnyBuffer>() /* b_codes */      \
      .Arg<ffi::AnyBuffer>() /* b_scales */     \
      .Arg<ffi::AnyBuffer>() /* b_s_dec */      \
      .Arg<ffi::AnyBuffer>() /* bias */         \
      .Arg<ffi::AnyBuffer>() /* out_s_enc */

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmFfi, gemm_impl,
                              ffi::Ffi::Bind() JAX_NVFP4_GEMM_OPERANDS.Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<int64_t>("path")
                                  .Attr<int64_t>("activation"),
                              {jax_nvfp4::kGraphSafe});

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmNvfp4OutFfi, gemm_nvfp4_out_impl,
                              ffi::Ffi::Bind() JAX_NVFP4_GEMM_OPERANDS.Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<int64_t>("path")
                                  .Attr<int64_t>("activation"),
                              {jax_nvfp4::kGraphSafe});

#undef JAX_NVFP4_GEMM_OPERANDS

JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_gemm", GemmFfi);
JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_gemm_nvfp4_out", GemmNvfp4OutFfi);
JAX_NVFP4_REGISTER_WORKSPACE("jax_nvfp4_gemm", gemm_call_workspace);
JAX_NVFP4_REGISTER_WORKSPACE("jax_nvfp4_gemm_nvfp4_out", gemm_call_workspace);

}  // namespace jax_nvfp4
