// XLA FFI handler "jax_nvfp4_conv": decodes the buffers of the conv primitive
// (jax_nvfp4/primitives/conv.py) into a ConvProblem and runs the kernel family of the device.
//
// Operands, in order:
//   x         [N, H, W, C]  bf16/f16/f32, or float4_e2m1fn codes (NVFP4 activations)
//   x_scales  tiled e4m3 scales of x as an NVFP4Array [N, H, W, C] stores them (f8[0] if float)
//   x_s_dec   f32 scalar (1.0 if float)
//   w_codes   [R, S, K, C] float4_e2m1fn;  w_scales  tiled per (r, s);  w_s_dec  f32 scalar
//   bias      [K] any float dtype, or f32[0]
// Result: out [N, P, Q, K] of bf16/f16/f32.
// Attributes: stride_h, stride_w, pad_h, pad_w (leading padding), dil_h, dil_w; kernel: the
// sm_90a kernel (ConvSm90Kernel: 0 the launcher's choice, else a forced one; tests and benchmarks);
// splits: the forced kernel's split-K over a cluster (0 or 1: unsplit).
#include <cuda_runtime.h>

#include <string>

#include "common/ffi_registry.h"
#include "common/ffi_utils.h"
#include "common/scale_layout.h"
#include "conv/conv_problem.h"
#include "conv/sm90/conv_sm90.h"
#ifdef JAX_NVFP4_HAS_SM100
#include "conv/sm100/conv_sm100.h"
#endif

namespace jax_nvfp4 {
namespace {

ffi::Error invalid(const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jax_nvfp4_conv: " + what);
}

ffi::Error conv_impl(cudaStream_t stream, ffi::AnyBuffer x,
                     ffi::AnyBuffer x_scales, ffi::AnyBuffer x_s_dec, ffi::AnyBuffer w_codes,
                     ffi::AnyBuffer w_scales, ffi::AnyBuffer w_s_dec, ffi::AnyBuffer bias,
                     ffi::Result<ffi::AnyBuffer> out, int64_t stride_h, int64_t stride_w,
                     int64_t pad_h, int64_t pad_w, int64_t dil_h, int64_t dil_w, int64_t kernel,
                     int64_t splits) {
  JAX_NVFP4_COUNT_HOST_CALL("jax_nvfp4_conv");
  const auto xd = x.dimensions(), wd = w_codes.dimensions(), od = out->dimensions();
  if (xd.size() != 4 || wd.size() != 4 || od.size() != 4) {
    return invalid("x, w and out must be rank 4 (NHWC, RSKC, NPQK)");
  }
  if (w_codes.element_type() != ffi::DataType::F4E2M1FN) return invalid("w codes must be float4_e2m1fn");
  ConvProblem p;
  p.n = xd[0]; p.h = xd[1]; p.w = xd[2]; p.c = xd[3];
  p.r = static_cast<int>(wd[0]); p.s = static_cast<int>(wd[1]); p.k = wd[2];
  p.p = od[1]; p.q = od[2];
  p.stride_h = static_cast<int>(stride_h); p.stride_w = static_cast<int>(stride_w);
  p.pad_h = static_cast<int>(pad_h); p.pad_w = static_cast<int>(pad_w);
  p.dil_h = static_cast<int>(dil_h); p.dil_w = static_cast<int>(dil_w);
  if (wd[3] != p.c || p.c % 16 != 0 || od[0] != p.n || od[3] != p.k) {
    return invalid("inconsistent shapes (C must match and be a multiple of 16)");
  }
  if (stride_h < 1 || stride_w < 1 || dil_h < 1 || dil_w < 1 || pad_h < 0 || pad_w < 0) {
    return invalid("strides and dilations must be >= 1 and the padding >= 0");
  }
  // The tiled scales: one matrix per (r, s) of w [K, C], per (n, h) of an NVFP4 x [W, C].
  const auto is_scalar_f32 = [](const ffi::AnyBuffer& b) {
    return b.element_type() == ffi::DataType::F32 && b.element_count() == 1;
  };
  const int64_t c_blocks = p.c / kBlockSize;
  if (w_scales.element_type() != ffi::DataType::F8E4M3FN ||
      static_cast<int64_t>(w_scales.element_count()) != p.r * p.s * scale_matrix_bytes(p.k, c_blocks) ||
      !is_scalar_f32(w_s_dec)) {
    return invalid("w's scales must be its tiled e4m3 scales and its s_dec a float32 scalar");
  }
  if (bias.element_count() != 0 && static_cast<int64_t>(bias.element_count()) != p.k) {
    return invalid("bias must hold K = " + std::to_string(p.k) + " values");
  }

  p.x_is_nvfp4 = x.element_type() == ffi::DataType::F4E2M1FN;
  if (p.x_is_nvfp4) {
    if (x_scales.element_type() != ffi::DataType::F8E4M3FN ||
        static_cast<int64_t>(x_scales.element_count()) != p.n * p.h * scale_matrix_bytes(p.w, c_blocks) ||
        !is_scalar_f32(x_s_dec)) {
      return invalid("x's scales must be its tiled e4m3 scales and its s_dec a float32 scalar");
    }
    p.x_q.codes = static_cast<const uint8_t*>(x.untyped_data());
    p.x_q.scales = static_cast<const uint8_t*>(x_scales.untyped_data());
    p.x_q.s_dec = static_cast<const float*>(x_s_dec.untyped_data());
  } else if (!to_dtype(x.element_type(), &p.x_dtype)) {
    return invalid("x must be bf16, f16, f32 or float4_e2m1fn");
  }
  p.x = x.untyped_data();
  p.wgt.codes = static_cast<const uint8_t*>(w_codes.untyped_data());
  p.wgt.scales = static_cast<const uint8_t*>(w_scales.untyped_data());
  p.wgt.s_dec = static_cast<const float*>(w_s_dec.untyped_data());
  if (bias.element_count() > 0) {
    if (!to_dtype(bias.element_type(), &p.bias_dtype)) return invalid("bias must be bf16, f16 or f32");
    p.bias = bias.untyped_data();
  }
  if (!to_dtype(out->element_type(), &p.out_dtype)) return invalid("out must be bf16, f16 or f32");
  p.out = out->untyped_data();

  switch (current_compute_capability()) {
#ifdef JAX_NVFP4_HAS_SM90
    case 90: {
      if (kernel < 0 || kernel > static_cast<int64_t>(ConvSm90Kernel::kWs64x64Ks)) {
        return invalid("unknown sm_90a kernel " + std::to_string(kernel));
      }
      if (splits < 0 || splits > 8) return invalid("split-K over " + std::to_string(splits) + " CTAs (0 to 8)");
      const auto which = static_cast<ConvSm90Kernel>(kernel);
      const cudaError_t err = conv_sm90(p, stream, which, static_cast<int>(splits));
      if (err == cudaErrorInvalidValue && which != ConvSm90Kernel::kAuto && which != ConvSm90Kernel::kRegisterA) {
        return invalid("the forced warp-specialized sm_90a kernel does not take this problem (it needs bf16 "
                       "activations, S = 1, 3, 5 or 7, a bf16/f16 output with K % 8 == 0, and shared memory for two "
                       "stages (four with the stage split, and its partial sums); "
                       "its 64-, 112- and 208-pixel and its 64-channel tilings also TMA loads: C % 32 == 0, strides up to 8; "
                       "split-K a 128-channel or stage-split tiling with TMA loads, at most one CTA per stage, and "
                       "(128 channels) stage buffers that hold a CTA's partial sums)");
      }
      if (err == cudaErrorInvalidValue) {
        return invalid("problem needs more shared memory than the sm_90a kernel can take "
                       "(reduce the filter width S or its dilation)");
      }
      return cuda_error(err, "conv_sm90");
    }
#endif
#ifdef JAX_NVFP4_HAS_SM100
    case 100: return cuda_error(conv_sm100(p, stream), "conv_sm100");
#endif
    default:
      return ffi::Error(ffi::ErrorCode::kUnimplemented,
                        "jax_nvfp4_conv: no convolution kernel compiled for compute capability " +
                            std::to_string(current_compute_capability()));
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ConvFfi, conv_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // x_scales
                                  .Arg<ffi::AnyBuffer>()  // x_s_dec
                                  .Arg<ffi::AnyBuffer>()  // w_codes
                                  .Arg<ffi::AnyBuffer>()  // w_scales
                                  .Arg<ffi::AnyBuffer>()  // w_s_dec
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Attr<int64_t>("stride_h")
                                  .Attr<int64_t>("stride_w")
                                  .Attr<int64_t>("pad_h")
                                  .Attr<int64_t>("pad_w")
                                  .Attr<int64_t>("dil_h")
                                  .Attr<int64_t>("dil_w")
                                  .Attr<int64_t>("kernel")
                                  .Attr<int64_t>("splits"),
                              {kGraphSafe});

JAX_NVFP4_REGISTER_FFI_TARGET("jax_nvfp4_conv", ConvFfi);

}  // namespace jax_nvfp4
