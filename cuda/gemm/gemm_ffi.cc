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
// 5 prefill_cutlass, 6 fused_ws_wide; on sm_90a a call is lowered with the choice settled,
// gemm_call_settled_attrs) and activation (Activation: 0 none, 1 relu, 2 gelu, 3 silu,
// 4 swiglu, 5 geglu).
//
// "jax_nvfp4_gemm_stacked" and "jax_nvfp4_gemm_nvfp4_out_stacked" (stacked_matmul_p: vmap over a
// stack of weights) take the same operands, of which those flagged in the attribute `stacked`
// (bit i: operand i above) carry a leading dimension E, and give every result that leading
// dimension. Each element's GEMM reads its element of the stacked buffers in place: all E in one
// launch where the device's kernels run stacks (sm_90a's decode path at M <= 8, float output),
// else one element after another on the stream.
//
// "jax_nvfp4_gemm_ragged" (ragged_matmul_p, jax_nvfp4/primitives/ragged.py: lax.ragged_dot with
// NVFP4 weights) takes the 8 operands with b_codes [G, N, K], b_scales [G, ...], b_s_dec [G] or a
// scalar, bias [G, N] or f32[0], out_s_enc f32[0], then group_sizes int32 [G] and first_row int32
// scalar (GemmProblem::group_sizes says what they mean), and gives out [M, C] and the workspace.
// Attributes: path (0 the launcher's choice, 1 decode, 7, 4 or 6 fused_ws on 64-, 128- or 256-row
// tiles) and activation. On sm_90a one launch of the decode or fused_ws kernel (after fused_ws's
// staging of x and the zeros of the rows outside every group); on sm_100a (path 0 only, k a
// multiple of 32, n of 4) CUTLASS's grouped block-scaled GEMM between a setup kernel and an output
// pass (gemm/sm100/ragged_sm100_plan.h); no other device runs it (kUnimplemented: the Python side
// lowers to XLA's dequantize + ragged_dot there).
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
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

// A buffer's dimensions, or those of one element of a stacked buffer: a view into XLA's array
// (no copy: the handlers run on every call that is not captured into a command buffer).
struct Dims {
  const int64_t* d = nullptr;
  size_t n = 0;

  size_t size() const { return n; }
  bool empty() const { return n == 0; }
  int64_t operator[](size_t i) const { return d[i]; }
  Dims tail() const { return {d + 1, n - 1}; }  // without the leading dimension
};

std::string dims_str(Dims d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// An operand or result as the handlers read it: a whole buffer, or one element of a stacked
// buffer (its leading dimension dropped, the data advanced to that element).
struct View {
  void* data = nullptr;
  ffi::DataType type = ffi::DataType::INVALID;
  Dims dims;

  int64_t elements() const {
    int64_t n = 1;
    for (size_t i = 0; i < dims.size(); ++i) n *= dims[i];
    return n;
  }
};

// Bytes of `elements` values of `type` in device memory (float4 packed two a byte); 0 for the
// types no operand may have (their check fails before anything is read).
int64_t device_bytes(ffi::DataType type, int64_t elements) {
  switch (type) {
    case ffi::DataType::F4E2M1FN: return (elements + 1) / 2;
    case ffi::DataType::F8E4M3FN:
    case ffi::DataType::U8: return elements;
    case ffi::DataType::BF16:
    case ffi::DataType::F16: return 2 * elements;
    case ffi::DataType::F32: return 4 * elements;
    default: return 0;
  }
}

Dims dims_of(const ffi::AnyBuffer& b) {
  const auto d = b.dimensions();
  return {d.begin(), d.size()};
}

// Element e of `b` when it is stacked (count elements, checked by stack_count), else all of it.
View element_of(const ffi::AnyBuffer& b, bool stacked, int64_t count, int64_t e) {
  View v{b.untyped_data(), b.element_type(), dims_of(b)};
  if (stacked) {
    const int64_t bytes = device_bytes(v.type, static_cast<int64_t>(b.element_count())) / count;
    v.data = static_cast<uint8_t*>(v.data) + e * bytes;
    v.dims = v.dims.tail();
  }
  return v;
}

using Operands = std::array<ffi::AnyBuffer, 8>;  // in the order of the comment above

// The results of a call, in order: out, or out codes, scales and s_dec (an initializer list keeps
// them on the stack).
using Results = std::initializer_list<ffi::AnyBuffer>;

// Whether `b` leads with `count` elements.
ffi::Error stack_of(const ffi::AnyBuffer& b, int64_t count, const std::string& what) {
  const auto d = dims_of(b);
  return !d.empty() && d[0] == count ? ffi::Error::Success()
                                     : invalid(what + " " + dims_str(d) + " is not a stack of " +
                                               std::to_string(count) + " elements");
}

// Whether every operand flagged in `stacked` leads with `count` elements.
ffi::Error stacked_operands(const Operands& ops, int64_t stacked, int64_t count) {
  for (size_t i = 0; i < ops.size(); ++i) {
    if ((stacked >> i & 1) == 0) continue;
    if (auto err = stack_of(ops[i], count, "stacked operand " + std::to_string(i)); err.failure()) {
      return err;
    }
  }
  return ffi::Error::Success();
}

// The number of stacked elements, E: the leading dimension of every result and of every operand
// flagged in `stacked`.
ffi::Error stack_count(const Operands& ops, int64_t stacked, Results rets, int64_t* count) {
  if (stacked < 0 || stacked >= (int64_t{1} << ops.size())) {
    return invalid("stacked must flag some of the 8 operands, got " + std::to_string(stacked));
  }
  const auto lead = dims_of(*rets.begin());
  if (lead.empty()) return invalid("the results of a stacked call need a leading dimension");
  *count = lead[0];
  if (auto err = stacked_operands(ops, stacked, *count); err.failure()) return err;
  for (size_t i = 0; i < rets.size(); ++i) {
    if (auto err = stack_of(rets.begin()[i], *count, "result " + std::to_string(i)); err.failure()) {
      return err;
    }
  }
  return ffi::Error::Success();
}

ffi::Error decode_path(int64_t path, GemmProblem* p) {
  if (path < 0 || path > static_cast<int64_t>(GemmPath::kFusedWsWide)) {
    return invalid("path must be 0 (auto), 1 (decode), 2 (prefill), 3 (fused), 4 (fused_ws), 5 "
                   "(prefill_cutlass) or 6 (fused_ws_wide), got " + std::to_string(path));
  }
  p->path = static_cast<GemmPath>(path);
  return ffi::Error::Success();
}

// The paths a ragged call may force: the launcher's choice, decode, fused_ws on 64-, 128- or
// 256-row tiles.
bool ragged_path_valid(int64_t path) {
  for (GemmPath valid : {GemmPath::kAuto, GemmPath::kDecode, GemmPath::kFusedWsNarrow, GemmPath::kFusedWs,
                         GemmPath::kFusedWsWide}) {
    if (path == static_cast<int64_t>(valid)) return true;
  }
  return false;
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
ffi::Error nvfp4_operand(const std::string& name, const View& codes, const View& scales,
                         const View& s_dec, int64_t rows, int64_t k, Nvfp4Operand* out) {
  if (scales.type != ffi::DataType::F8E4M3FN ||
      scales.elements() != scale_matrix_bytes(rows, k / kBlockSize)) {
    return invalid(name + "_scales must be the tiled e4m3 scales of " + name + " " +
                   dims_str(codes.dims));
  }
  if (s_dec.type != ffi::DataType::F32 || s_dec.elements() != 1) {
    return invalid(name + "_s_dec must be a float32 scalar");
  }
  *out = {static_cast<const uint8_t*>(codes.data), static_cast<const uint8_t*>(scales.data),
          static_cast<const float*>(s_dec.data)};
  return ffi::Error::Success();
}

// Fills everything but the outputs; checks shapes and dtypes.
ffi::Error decode_operands(const View& a, const View& a_scales, const View& a_s_dec,
                           const View& b_codes, const View& b_scales, const View& b_s_dec,
                           const View& bias, GemmProblem* p) {
  const auto &ad = a.dims, &bd = b_codes.dims;
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
  if (b_codes.type != ffi::DataType::F4E2M1FN) return invalid("b must be float4_e2m1fn");
  if (auto err = nvfp4_operand("b", b_codes, b_scales, b_s_dec, p->n, p->k, &p->b); err.failure()) {
    return err;
  }
  p->a_is_nvfp4 = a.type == ffi::DataType::F4E2M1FN;
  if (p->a_is_nvfp4) {
    if (auto err = nvfp4_operand("a", a, a_scales, a_s_dec, p->m, p->k, &p->a_q); err.failure()) {
      return err;
    }
  } else if (!to_dtype(a.type, &p->a_dtype)) {
    return invalid("a must be bf16, f16, f32 or float4_e2m1fn");
  }
  p->a = a.data;

  if (bias.elements() > 0) {
    if (bias.elements() != p->n || !to_dtype(bias.type, &p->bias_dtype)) {
      return invalid("bias must be a bf16/f16/f32 vector of N = " + std::to_string(p->n) + " elements");
    }
    p->bias = bias.data;
  }
  return ffi::Error::Success();
}

// Bytes of workspace `p` needs on the current device, of compute capability `cc` (0 if none runs it).
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

// Bytes of workspace a call lowered for compute capability `cc` is given: what `p` needs on any GPU
// of that compute capability, whatever its SM count (a jax.export artifact runs on another). On
// sm_90a that is the current one's once the path is settled (gemm_call_settled_attrs; CUTLASS's
// share is sized for every SM count, wgmma_gemm.cuh).
size_t lowered_workspace_bytes(int cc, const GemmProblem& p) {
#ifdef JAX_NVFP4_HAS_SM100
  if (cc == 100) return gemm_sm100_lowered_workspace_bytes(p);
#endif
  return workspace_bytes(cc, p);
}

// Runs p on a device of compute capability `cc` in the call's workspace.
ffi::Error run(int cc, cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& workspace, GemmProblem& p) {
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

// The problem of a call with these operand and result shapes (operands in the order above), as
// far as its workspace size goes: the shapes, the dtypes and which of the optional pointers are set.
GemmProblem problem_of_shapes(const WorkspaceQuery& q) {
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
  return p;
}

size_t gemm_call_workspace(const WorkspaceQuery& q) {
  return workspace_result_bytes(lowered_workspace_bytes(q.compute_capability, problem_of_shapes(q)));
}

// On sm_90a, the kernel the launcher picks for an auto path, which depends on the SM count
// (gemm_sm90_path), as the path attribute that forces it: the call runs that kernel, in the
// workspace sized for it, on whichever Hopper it runs.
std::map<std::string, int64_t> gemm_call_settled_attrs(const WorkspaceQuery& q) {
#ifdef JAX_NVFP4_HAS_SM90
  const auto path = q.attrs.find("path");
  if (q.compute_capability == 90 && path != q.attrs.end() && path->second == static_cast<int64_t>(GemmPath::kAuto)) {
    return {{"path", static_cast<int64_t>(gemm_sm90_settled_path(problem_of_shapes(q)))}};
  }
#endif
  return {};
}

// The shape of one element of a stacked operand or result: its leading dimension dropped.
void drop_lead(ArgShape& shape) {
  if (!shape.dims.empty()) shape.dims.erase(shape.dims.begin());
}

// The float output of one GEMM: out [M, C].
ffi::Error float_out(const View& out, GemmProblem* p) {
  if (out.dims.size() != 2 || out.dims[0] != p->m || out.dims[1] != out_cols(*p)) {
    return invalid("out must be [M, " + std::string(is_gated(p->activation) ? "N / 2" : "N") +
                   "], got " + dims_str(out.dims));
  }
  if (!to_dtype(out.type, &p->out_dtype)) return invalid("out must be bf16, f16 or f32");
  p->out = out.data;
  return ffi::Error::Success();
}

// The NVFP4 output of one GEMM: codes [M, C], tiled scales, s_dec; quantized with out_s_enc.
ffi::Error nvfp4_out(const View& codes, const View& scales, const View& s_dec,
                     const View& out_s_enc, GemmProblem* p) {
  const int64_t cols = out_cols(*p);
  if (cols % kBlockSize != 0) {
    return invalid("NVFP4 output needs its columns a multiple of 16, got " + std::to_string(cols));
  }
  if (codes.type != ffi::DataType::F4E2M1FN || codes.dims.size() != 2 || codes.dims[0] != p->m ||
      codes.dims[1] != cols) {
    return invalid("out codes must be float4_e2m1fn [M, " + std::to_string(cols) + "], got " +
                   dims_str(codes.dims));
  }
  if (scales.elements() != scale_matrix_bytes(p->m, cols / kBlockSize)) {
    return invalid("out scales must be the tiled scales of [M, " + std::to_string(cols) + "]");
  }
  if (out_s_enc.type != ffi::DataType::F32 || out_s_enc.elements() != 1) {
    return invalid("out_s_enc must be a float32 scalar");
  }
  p->out_codes = static_cast<uint8_t*>(codes.data);
  p->out_scales = static_cast<uint8_t*>(scales.data);
  p->out_s_enc = static_cast<const float*>(out_s_enc.data);
  p->out_s_dec = static_cast<float*>(s_dec.data);
  p->out_dtype = DType::kF32;
  return ffi::Error::Success();
}

// The problem of element e of the call (the whole call when `stacked` is 0): the operands' and
// results' views of that element, checked.
// The results are stacked whenever operands are, unless `stacked_results` is false (a ragged call).
ffi::Error element_problem(const Operands& ops, Results rets, int64_t stacked, int64_t count, int64_t e,
                           int64_t path, int64_t activation, GemmProblem* p, bool stacked_results = true) {
  auto op = [&](size_t i) { return element_of(ops[i], stacked >> i & 1, count, e); };
  auto ret = [&](size_t i) { return element_of(rets.begin()[i], stacked != 0 && stacked_results, count, e); };
  *p = GemmProblem{};
  if (auto err = decode_operands(op(0), op(1), op(2), op(3), op(4), op(5), op(6), p); err.failure()) {
    return err;
  }
  if (auto err = decode_path(path, p); err.failure()) return err;
  if (auto err = decode_activation(activation, p); err.failure()) return err;
  return rets.size() == 1 ? float_out(ret(0), p) : nvfp4_out(ret(0), ret(1), ret(2), op(7), p);
}

// Bytes from one element of a stacked buffer to the next; 0 for a buffer every element shares.
int64_t element_stride(const ffi::AnyBuffer& b, bool stacked, int64_t count) {
  const auto e1 = element_of(b, stacked, count, 1).data, e0 = element_of(b, stacked, count, 0).data;
  return static_cast<const uint8_t*>(e1) - static_cast<const uint8_t*>(e0);
}

// The strides of a stacked call with a float output (GemmStack's fields).
GemmStack float_stack(const Operands& ops, const ffi::AnyBuffer& out, int64_t stacked, int64_t count) {
  auto stride = [&](size_t i) { return element_stride(ops[i], stacked >> i & 1, count); };
  GemmStack s;
  s.count = count;
  s.a = stride(0);
  s.a_scales = stride(1);
  s.a_s_dec = stride(2);
  s.b_codes = stride(3);
  s.b_scales = stride(4);
  s.b_s_dec = stride(5);
  s.bias = stride(6);
  s.out = element_stride(out, true, count);
  return s;
}

// Whether the kernels of a device of compute capability `cc` run p's stack in one launch.
bool runs_stack(int cc, const GemmProblem& p) {
#ifdef JAX_NVFP4_HAS_SM90
  if (cc == 90) return gemm_sm90_runs_stack(p);
#endif
  return false;
}

// Runs the call's GEMM, or with `stacked` its E elements: in one launch where the device's kernels
// run the stack (see runs_stack), else each element in turn on the stream.
ffi::Error gemm_elements(cudaStream_t stream, const Operands& ops, Results rets,
                         ffi::Result<ffi::AnyBuffer>& workspace, int64_t path, int64_t activation,
                         int64_t stacked) {
  int64_t count = 1;
  if (stacked != 0) {
    if (auto err = stack_count(ops, stacked, rets, &count); err.failure()) return err;
  }
  if (count == 0) return ffi::Error::Success();
  const int cc = current_compute_capability();
  GemmProblem p;
  if (auto err = element_problem(ops, rets, stacked, count, 0, path, activation, &p); err.failure()) {
    return err;
  }
  if (count > 1 && rets.size() == 1) {
    p.stack = float_stack(ops, *rets.begin(), stacked, count);
    if (runs_stack(cc, p)) return run(cc, stream, workspace, p);
    p.stack = GemmStack{};
  }
  for (int64_t e = 0;;) {
    if (auto err = run(cc, stream, workspace, p); err.failure()) return err;
    if (++e == count) return ffi::Error::Success();
    if (auto err = element_problem(ops, rets, stacked, count, e, path, activation, &p); err.failure()) {
      return err;
    }
  }
}

ffi::Error gemm_impl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer a_scales,
                     ffi::AnyBuffer a_s_dec, ffi::AnyBuffer b_codes, ffi::AnyBuffer b_scales,
                     ffi::AnyBuffer b_s_dec, ffi::AnyBuffer bias, ffi::AnyBuffer out_s_enc,
                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                     int64_t path, int64_t activation) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_gemm");
  return gemm_elements(stream, {a, a_scales, a_s_dec, b_codes, b_scales, b_s_dec, bias, out_s_enc},
                       {*out}, workspace, path, activation, 0);
}

ffi::Error gemm_nvfp4_out_impl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer a_scales,
                               ffi::AnyBuffer a_s_dec, ffi::AnyBuffer b_codes,
                               ffi::AnyBuffer b_scales, ffi::AnyBuffer b_s_dec, ffi::AnyBuffer bias,
                               ffi::AnyBuffer out_s_enc, ffi::Result<ffi::AnyBuffer> out_codes,
                               ffi::Result<ffi::AnyBuffer> out_scales,
                               ffi::Result<ffi::AnyBuffer> out_s_dec,
                               ffi::Result<ffi::AnyBuffer> workspace, int64_t path,
                               int64_t activation) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_gemm_nvfp4_out");
  return gemm_elements(stream, {a, a_scales, a_s_dec, b_codes, b_scales, b_s_dec, bias, out_s_enc},
                       {*out_codes, *out_scales, *out_s_dec}, workspace, path, activation, 0);
}

ffi::Error gemm_stacked_impl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer a_scales,
                             ffi::AnyBuffer a_s_dec, ffi::AnyBuffer b_codes, ffi::AnyBuffer b_scales,
                             ffi::AnyBuffer b_s_dec, ffi::AnyBuffer bias, ffi::AnyBuffer out_s_enc,
                             ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                             int64_t path, int64_t activation, int64_t stacked) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_gemm_stacked");
  return gemm_elements(stream, {a, a_scales, a_s_dec, b_codes, b_scales, b_s_dec, bias, out_s_enc},
                       {*out}, workspace, path, activation, stacked);
}

ffi::Error gemm_nvfp4_out_stacked_impl(
    cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer a_scales, ffi::AnyBuffer a_s_dec,
    ffi::AnyBuffer b_codes, ffi::AnyBuffer b_scales, ffi::AnyBuffer b_s_dec, ffi::AnyBuffer bias,
    ffi::AnyBuffer out_s_enc, ffi::Result<ffi::AnyBuffer> out_codes,
    ffi::Result<ffi::AnyBuffer> out_scales, ffi::Result<ffi::AnyBuffer> out_s_dec,
    ffi::Result<ffi::AnyBuffer> workspace, int64_t path, int64_t activation, int64_t stacked) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_gemm_nvfp4_out_stacked");
  return gemm_elements(stream, {a, a_scales, a_s_dec, b_codes, b_scales, b_s_dec, bias, out_s_enc},
                       {*out_codes, *out_scales, *out_s_dec}, workspace, path, activation, stacked);
}

ffi::Error gemm_ragged_impl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer a_scales,
                            ffi::AnyBuffer a_s_dec, ffi::AnyBuffer b_codes, ffi::AnyBuffer b_scales,
                            ffi::AnyBuffer b_s_dec, ffi::AnyBuffer bias, ffi::AnyBuffer out_s_enc,
                            ffi::AnyBuffer group_sizes, ffi::AnyBuffer first_row,
                            ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                            int64_t path, int64_t activation) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_gemm_ragged");
  const Operands ops{a, a_scales, a_s_dec, b_codes, b_scales, b_s_dec, bias, out_s_enc};
  const Dims bd = dims_of(b_codes);
  if (bd.size() != 3 || bd[0] < 1) return invalid("ragged: b must be [G, N, K] with G >= 1, got " + dims_str(bd));
  const int64_t groups = bd[0];
  if (group_sizes.element_type() != ffi::DataType::S32 || dims_of(group_sizes).size() != 1 ||
      dims_of(group_sizes)[0] != groups) {
    return invalid("ragged: group_sizes must be int32 [G = " + std::to_string(groups) + "]");
  }
  if (first_row.element_type() != ffi::DataType::S32 || first_row.element_count() != 1) {
    return invalid("ragged: first_row must be an int32 scalar");
  }
  if (out_s_enc.element_count() != 0) return invalid("ragged: the output is float only");
  if (!ragged_path_valid(path)) {
    return invalid("ragged: path must be 0 (auto), 1 (decode), 7, 4 or 6 (fused_ws on 64-, 128- or 256-row tiles), "
                   "got " + std::to_string(path));
  }
  // The weights are stacked by group; s_dec and bias where they have a group dimension.
  int64_t stacked = (1 << 3) | (1 << 4);
  if (dims_of(b_s_dec).size() == 1) stacked |= 1 << 5;
  if (dims_of(bias).size() == 2) stacked |= 1 << 6;
  if (auto err = stacked_operands(ops, stacked, groups); err.failure()) return err;
  GemmProblem p;
  if (auto err = element_problem(ops, {*out}, stacked, groups, 0, /*path=*/0, activation, &p,
                                 /*stacked_results=*/false);
      err.failure()) {
    return err;
  }
  p.stack = float_stack(ops, *out, stacked, groups);
  p.stack.out = 0;  // a and out are shared: every group writes its own rows
  p.path = static_cast<GemmPath>(path);
  p.group_sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  p.first_row = static_cast<const int32_t*>(first_row.untyped_data());
  const int cc = current_compute_capability();
#ifdef JAX_NVFP4_HAS_SM90
  if (cc == 90) return run(cc, stream, workspace, p);
#endif
#ifdef JAX_NVFP4_HAS_SM100
  if (cc == 100) {
    if (path != 0) {
      return invalid("ragged: sm_100a has one kernel (path 0), got path " + std::to_string(path));
    }
    if (const char* why = ragged_sm100_unsupported_reason(p)) {
      return invalid(std::string("ragged (sm_100a): ") + why);
    }
    return run(cc, stream, workspace, p);
  }
#endif
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    "jax_nvfp4_gemm_ragged: no ragged NVFP4 GEMM kernel for compute capability " +
                        std::to_string(cc / 10) + "." + std::to_string(cc % 10));
}

// One element of a stacked call: the stacked dimension dropped from the flagged operands and
// every result.
WorkspaceQuery stacked_element(const WorkspaceQuery& q) {
  const auto stacked = q.attrs.find("stacked");
  const int64_t flags = stacked == q.attrs.end() ? 0 : stacked->second;
  WorkspaceQuery element = q;
  for (size_t i = 0; i < element.args.size(); ++i) {
    if (flags >> i & 1) drop_lead(element.args[i]);
  }
  for (ArgShape& ret : element.rets) drop_lead(ret);
  return element;
}

// The workspace of a stacked call: that of one element's GEMM (elements run in turn share it; a
// stack run in one launch takes the decode path, which needs none).
size_t gemm_stacked_call_workspace(const WorkspaceQuery& q) { return gemm_call_workspace(stacked_element(q)); }

std::map<std::string, int64_t> gemm_stacked_call_settled_attrs(const WorkspaceQuery& q) {
  return gemm_call_settled_attrs(stacked_element(q));
}

// The workspace of a ragged call: its problem with the group dimension dropped from the weights
// (and from s_dec and bias where they have one); none off sm_90a and sm_100a, where no kernel
// runs it.
size_t gemm_ragged_call_workspace(const WorkspaceQuery& q) {
  if (q.compute_capability != 90 && q.compute_capability != 100) return 0;
  WorkspaceQuery element = q;
  for (size_t i : {3, 4}) drop_lead(element.args.at(i));
  if (element.args.at(5).dims.size() == 1) drop_lead(element.args[5]);
  if (element.args.at(6).dims.size() == 2) drop_lead(element.args[6]);
  GemmProblem p = problem_of_shapes(element);
  const auto path = q.attrs.find("path");
  p.path = path != q.attrs.end() && ragged_path_valid(path->second) ? static_cast<GemmPath>(path->second)
                                                                     : GemmPath::kAuto;
  static const int32_t placeholder = 0;
  p.group_sizes = &placeholder;
  p.stack.count = q.args[3].dims.at(0);
  return workspace_result_bytes(lowered_workspace_bytes(q.compute_capability, p));
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmStackedFfi, gemm_stacked_impl,
                              ffi::Ffi::Bind() JAX_NVFP4_GEMM_OPERANDS.Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<int64_t>("path")
                                  .Attr<int64_t>("activation")
                                  .Attr<int64_t>("stacked"),
                              {jax_nvfp4::kGraphSafe});

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmNvfp4OutStackedFfi, gemm_nvfp4_out_stacked_impl,
                              ffi::Ffi::Bind() JAX_NVFP4_GEMM_OPERANDS.Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<int64_t>("path")
                                  .Attr<int64_t>("activation")
                                  .Attr<int64_t>("stacked"),
                              {jax_nvfp4::kGraphSafe});

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmRaggedFfi, gemm_ragged_impl,
                              ffi::Ffi::Bind() JAX_NVFP4_GEMM_OPERANDS.Arg<ffi::AnyBuffer>()  // group_sizes
                                  .Arg<ffi::AnyBuffer>()                                     // first_row
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<int64_t>("path")
                                  .Attr<int64_t>("activation"),
                              {jax_nvfp4::kGraphSafe});

#undef JAX_NVFP4_GEMM_OPERANDS

JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_gemm", GemmFfi);
JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_gemm_nvfp4_out", GemmNvfp4OutFfi);
JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_gemm_stacked", GemmStackedFfi);
JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_gemm_nvfp4_out_stacked", GemmNvfp4OutStackedFfi);
JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_gemm_ragged", GemmRaggedFfi);
JAX_NVFP4_REGISTER_WORKSPACE("jax_nvfp4_gemm", gemm_call_workspace);
JAX_NVFP4_REGISTER_WORKSPACE("jax_nvfp4_gemm_nvfp4_out", gemm_call_workspace);
JAX_NVFP4_REGISTER_WORKSPACE("jax_nvfp4_gemm_stacked", gemm_stacked_call_workspace);
JAX_NVFP4_REGISTER_WORKSPACE("jax_nvfp4_gemm_nvfp4_out_stacked", gemm_stacked_call_workspace);
JAX_NVFP4_REGISTER_WORKSPACE("jax_nvfp4_gemm_ragged", gemm_ragged_call_workspace);
JAX_NVFP4_REGISTER_SETTLED_ATTRS("jax_nvfp4_gemm", gemm_call_settled_attrs);
JAX_NVFP4_REGISTER_SETTLED_ATTRS("jax_nvfp4_gemm_nvfp4_out", gemm_call_settled_attrs);
JAX_NVFP4_REGISTER_SETTLED_ATTRS("jax_nvfp4_gemm_stacked", gemm_stacked_call_settled_attrs);
JAX_NVFP4_REGISTER_SETTLED_ATTRS("jax_nvfp4_gemm_nvfp4_out_stacked", gemm_stacked_call_settled_attrs);

}  // namespace jax_nvfp4
