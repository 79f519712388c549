// XLA FFI handlers "jax_nvfp4_quantize" and "jax_nvfp4_dequantize" (contract in
// jax_nvfp4/primitives/quantize.py): read shapes, pick the kernel family of the current GPU.
#include <cstdint>
#include <string>

#include "common/ffi_registry.h"
#include "common/ffi_utils.h"
#include "common/scale_layout.h"
#include "common/workspace_registry.h"
#include "quantize/quantize.h"

namespace jax_nvfp4 {
namespace {

// A logical shape [..., R, K] seen as rows of K elements, R rows per matrix.
struct RowView {
  int64_t rows = 1, k = 0, rows_per_matrix = 1;
};

RowView row_view(ffi::AnyBuffer::Dimensions dims) {
  RowView v;
  if (dims.size() == 0) return v;
  v.k = dims.back();
  for (size_t d = 0; d + 1 < dims.size(); ++d) v.rows *= dims[d];
  if (dims.size() >= 2) v.rows_per_matrix = dims[dims.size() - 2];
  return v;
}

ffi::Error invalid(const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jax_nvfp4: " + what);
}

// Whether codes and tiled scales have the sizes of an NVFP4 tensor of v's shape (one tiled scale
// matrix per leading index), so the kernels stay inside them.
bool fields_fit(const RowView& v, size_t codes, size_t scales) {
  const int64_t matrices = v.rows_per_matrix > 0 ? v.rows / v.rows_per_matrix : 0;
  return static_cast<int64_t>(codes) == v.rows * v.k &&
         static_cast<int64_t>(scales) == matrices * scale_matrix_bytes(v.rows_per_matrix, v.k / kBlockSize);
}

ffi::Error unsupported_device(int cc) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    "jax_nvfp4: no quantize kernel compiled for compute capability " +
                        std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
                        " (kernels exist for 9.0 with sm_90a and 10.0 with sm_100a)");
}

cudaError_t run_quantize(int cc, const QuantizeProblem& p, cudaStream_t stream, bool* found) {
  *found = true;
#ifdef JAX_NVFP4_HAS_SM90
  if (cc == 90) return quantize_sm90(p, stream);
#endif
#ifdef JAX_NVFP4_HAS_SM100
  if (cc == 100) return quantize_sm100(p, stream);
#endif
  *found = false;
  return cudaSuccess;
}

cudaError_t run_dequantize(int cc, const DequantizeProblem& p, cudaStream_t stream, bool* found) {
  *found = true;
#ifdef JAX_NVFP4_HAS_SM90
  if (cc == 90) return dequantize_sm90(p, stream);
#endif
#ifdef JAX_NVFP4_HAS_SM100
  if (cc == 100) return dequantize_sm100(p, stream);
#endif
  *found = false;
  return cudaSuccess;
}

ffi::Error Quantize(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> s_enc,
                    ffi::Result<ffi::AnyBuffer> codes, ffi::Result<ffi::AnyBuffer> scales,
                    ffi::Result<ffi::Buffer<ffi::F32>> s_dec,
                    ffi::Result<ffi::AnyBuffer> workspace) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_quantize");
  QuantizeProblem p;
  if (!to_dtype(x.element_type(), &p.x_dtype)) {
    return invalid("quantize takes float32, bfloat16 or float16 input");
  }
  if (codes->element_type() != ffi::DataType::F4E2M1FN ||
      scales->element_type() != ffi::DataType::F8E4M3FN) {
    return invalid("quantize returns float4_e2m1fn codes and float8_e4m3fn scales");
  }
  const RowView v = row_view(x.dimensions());
  if (v.k <= 0 || v.k % 16 != 0) {
    return invalid("quantize needs a last dimension that is a positive multiple of 16, got " +
                   std::to_string(v.k));
  }
  if (!fields_fit(v, codes->element_count(), scales->element_count())) {
    return invalid("quantize: the codes and tiled scales results do not have the sizes of x's");
  }
  p.rows = v.rows;
  p.k = v.k;
  p.rows_per_matrix = v.rows_per_matrix;
  p.x = x.untyped_data();
  const int64_t given = static_cast<int64_t>(s_enc.element_count());
  p.groups = given > 0 ? given : 1;
  p.s_enc = given > 0 ? s_enc.typed_data() : nullptr;
  if (static_cast<int64_t>(s_dec->element_count()) != p.groups ||
      (p.rows > 0 && p.rows % p.groups != 0)) {
    return invalid("quantize: s_enc/s_dec must hold one value per group of whole rows");
  }
  p.codes = static_cast<uint8_t*>(codes->untyped_data());
  p.scales = static_cast<uint8_t*>(scales->untyped_data());
  p.s_dec = s_dec->typed_data();
  p.workspace_bytes = quantize_workspace_bytes(p);
  if (auto err = bind_workspace(workspace, p.workspace_bytes, &p.workspace, "jax_nvfp4_quantize");
      err.failure()) {
    return err;
  }
  const int cc = current_compute_capability();
  bool found = false;
  const cudaError_t err = run_quantize(cc, p, stream, &found);
  if (!found) return unsupported_device(cc);
  return cuda_error(err, "jax_nvfp4 quantize kernel");
}

ffi::Error Dequantize(cudaStream_t stream, ffi::AnyBuffer codes, ffi::AnyBuffer scales,
                      ffi::Buffer<ffi::F32> s_dec, ffi::Result<ffi::AnyBuffer> out) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_dequantize");
  DequantizeProblem p;
  if (!to_dtype(out->element_type(), &p.out_dtype)) {
    return invalid("dequantize returns float32, bfloat16 or float16");
  }
  if (codes.element_type() != ffi::DataType::F4E2M1FN ||
      scales.element_type() != ffi::DataType::F8E4M3FN) {
    return invalid("dequantize takes float4_e2m1fn codes and float8_e4m3fn scales");
  }
  const RowView v = row_view(codes.dimensions());
  if (v.k <= 0 || v.k % 16 != 0) {
    return invalid("dequantize needs a last dimension that is a positive multiple of 16, got " +
                   std::to_string(v.k));
  }
  if (!fields_fit(v, codes.element_count(), scales.element_count()) ||
      out->element_count() != codes.element_count()) {
    return invalid("dequantize: the tiled scales or the result do not have the sizes of the codes'");
  }
  p.rows = v.rows;
  p.k = v.k;
  p.rows_per_matrix = v.rows_per_matrix;
  p.groups = static_cast<int64_t>(s_dec.element_count());
  if (p.groups <= 0 || (p.rows > 0 && p.rows % p.groups != 0)) {
    return invalid("dequantize: s_dec must hold one value per group of whole rows");
  }
  p.codes = static_cast<const uint8_t*>(codes.untyped_data());
  p.scales = static_cast<const uint8_t*>(scales.untyped_data());
  p.s_dec = s_dec.typed_data();
  p.out = out->untyped_data();
  const int cc = current_compute_capability();
  bool found = false;
  const cudaError_t err = run_dequantize(cc, p, stream, &found);
  if (!found) return unsupported_device(cc);
  return cuda_error(err, "jax_nvfp4 dequantize kernel");
}

// Operands (x, s_enc): only whether S_enc is given (a non-empty s_enc) matters.
size_t quantize_call_workspace(const WorkspaceQuery& q) {
  QuantizeProblem p;
  static const float given = 0.f;  // the size reads only whether s_enc is set
  p.s_enc = q.args.at(1).elements() > 0 ? &given : nullptr;
  return workspace_result_bytes(quantize_workspace_bytes(p));
}

}  // namespace

JAX_NVFP4_REGISTER_WORKSPACE("jax_nvfp4_quantize", quantize_call_workspace);

}  // namespace jax_nvfp4

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_nvfp4_quantize_handler, jax_nvfp4::Quantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()                // x
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()    // s_enc
                                  .Ret<xla::ffi::AnyBuffer>()                // codes
                                  .Ret<xla::ffi::AnyBuffer>()                // scales
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()    // s_dec
                                  .Ret<xla::ffi::AnyBuffer>(),               // workspace
                              {jax_nvfp4::kGraphSafe});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_nvfp4_dequantize_handler, jax_nvfp4::Dequantize,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {jax_nvfp4::kGraphSafe});

JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_quantize", jax_nvfp4_quantize_handler);
JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_dequantize", jax_nvfp4_dequantize_handler);
