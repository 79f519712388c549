"""The NVFP4-weight convolution primitive (docs/conv.md, docs/conv_blackwell.md).

conv_p.bind(x, [x_scales, x_s_dec,] w_codes, w_scales, w_s_dec, [bias,]
            x_nvfp4=..., has_bias=..., window_strides=(sh, sw), padding=((lo, hi), (lo, hi)),
            rhs_dilation=(dh, dw), out_dtype=...)
    x        float [N, H, W, C], or float4 codes [N, H, W, C] (then x_scales, x_s_dec follow)
    w_*      the weight [R, S, K, C] as codes, tiled scales (one [K, C] matrix per tap), s_dec
    bias     optional [K], any float dtype
    out      [N, P, Q, K] of out_dtype

out[n, p, q, k] = s_dec_x * s_dec_w * sum_{r, s, c} x[n, h, w, c] * w[r, s, k, c] + bias[k],
h = p*sh - lo_h + r*dh, w = q*sw - lo_w + s*dw, in float32 (padding explicit, non-negative).

FFI target (cuda/conv/conv_ffi.cc): "jax_nvfp4_conv" with 7 operands, absent ones as placeholders:
    x, x_scales (f8[0] for float x), x_s_dec (1.0 for float x), w_codes, w_scales, w_s_dec,
    bias (f32[0] if none); attributes stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, kernel
    (the sm_90a kernel: 0 the launcher's choice, or one forced through KERNEL_ENV) and splits
    (the forced kernel's split-K, 0 unsplit).

Some 1x1 convolutions lower to the NVFP4 GEMM's FFI target instead (pointwise_as_gemm).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching

from jax_nvfp4 import _extension, reference
from jax_nvfp4.format import SCALE_DTYPE
from jax_nvfp4.primitives._base import (ShapedArray, define_primitive, empty_f32, env_choice,
                                        ffi_kernel_call, map_batcher, merge_leading)
from jax_nvfp4.primitives.matmul import GEMM_TARGET, gemm_kernel

CONV_TARGET = "jax_nvfp4_conv"

# JAX_NVFP4_CONV_SM90_KERNEL=register_a|ws128x64|ws128x112|ws128x128|ws128x208|ws128x256|ws64x256|
# ws64x416|ws64x64ks|ws64x128ks|ws64x224ks|ws64x256ks forces one of the Hopper kernels (the 64-channel ones
# split their pixels, or with "ks" their stages, between two consumers; tests and benchmarks run
# each on one shape; a warp-specialized one fails on problems it does not take);
# ws128x128_cpasync|ws128x256_cpasync force the warp-specialized one's cp.async loads where it
# would use TMA; a 128-channel or stage-split TMA tiling with a suffix /s2 .. /s8 (ws128x128/s2,
# ws64x128ks/s4) runs split-K over a cluster of that many CTAs; conv_launcher keeps a pointwise
# conv on the conv kernels, with their launcher's own choice (pointwise_as_gemm). Read when a call
# is lowered: set it before jit compiles the function (jax.clear_caches() drops compiled ones).
# Values: cuda/conv/sm90/conv_sm90.h, ConvSm90Kernel.
KERNEL_ENV = "JAX_NVFP4_CONV_SM90_KERNEL"
_KERNELS = {"": 0, "auto": 0, "conv_launcher": 0, "register_a": 1, "ws128x128": 2, "ws128x256": 3,
            "ws128x128_cpasync": 4, "ws128x256_cpasync": 5, "ws128x64": 6, "ws128x112": 7,
            "ws128x208": 8, "ws64x256": 9, "ws64x416": 10, "ws64x128ks": 11, "ws64x224ks": 12,
            "ws64x256ks": 13, "ws64x64ks": 14}
_SPLIT_K_KERNELS = ("ws128x64", "ws128x112", "ws128x128", "ws128x208", "ws128x256", "ws64x64ks",
                    "ws64x128ks", "ws64x224ks", "ws64x256ks")
_SPLITS = range(2, 9)


def forced_kernel() -> tuple[int, int]:
    """The `kernel` and `splits` attributes of the FFI call from KERNEL_ENV ((0, 0): the
    launcher's choice). Raises ValueError naming a value it does not know."""
    value = os.environ.get(KERNEL_ENV, "")
    name, suffix, splits = value.partition("/s")
    if not suffix:
        return env_choice(KERNEL_ENV, _KERNELS), 0
    if name in _SPLIT_K_KERNELS and splits.isdigit() and int(splits) in _SPLITS:
        return _KERNELS[name], int(splits)
    raise ValueError(f"{KERNEL_ENV}: split-K takes one of {list(_SPLIT_K_KERNELS)} with /s2 .. /s8, "
                     f"got {value!r}")


# A 1x1 convolution with stride 1 and no padding is a GEMM over its N*P*Q output pixels. On
# sm_90a, with bf16 activations of at least POINTWISE_GEMM_MIN_C channels and more than
# POINTWISE_GEMM_MIN_PIXELS output pixels, the GEMM's prefill path (the weights dequantized once,
# then cuBLASLt's bf16 GEMM) beat the conv kernels on the ResNet-50 shapes by up to 1.46x (0.98x
# at worst) up to POINTWISE_GEMM_MAX_PIXELS pixels (H100, bench/results/
# conv_pointwise_h100_2026-11-25.md); beyond, the conv kernels' TMA loads were within 7%, and at
# 1024 pixels and fewer the GEMM's fused paths were slower. Strided ones stay on the conv kernels,
# whose strided TMA loads beat the GEMM of XLA's strided slice by 1.07-1.54x on ResNet-50's
# projection shortcuts (bench/results/conv_strided_h100_2026-11-26.md). Only where the build has
# cuBLASLt's GEMM (the timings are its) and no conv kernel is forced.
POINTWISE_GEMM_MIN_PIXELS = 1024
POINTWISE_GEMM_MAX_PIXELS = 8192
POINTWISE_GEMM_MIN_C = 256


def pointwise_as_gemm(x_shape, x_dtype, x_nvfp4, filter_rs, window_strides, padding, out_dtype, *,
                      arch, cublaslt, forced) -> bool:
    """Whether a convolution lowers to the NVFP4 GEMM (see POINTWISE_GEMM_MIN_PIXELS): `arch` the
    visible GPUs' ("sm_90a"), `cublaslt` whether the prefill GEMM is cuBLASLt's, `forced` whether
    KERNEL_ENV names a conv kernel (or conv_launcher)."""
    n, h, w, c = x_shape
    return (arch == "sm_90a" and cublaslt and not forced and tuple(filter_rs) == (1, 1)
            and tuple(window_strides) == (1, 1) and all(v == 0 for pad in padding for v in pad)
            and not x_nvfp4 and jnp.dtype(x_dtype) == jnp.bfloat16
            and jnp.dtype(out_dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
            and c >= POINTWISE_GEMM_MIN_C
            and POINTWISE_GEMM_MIN_PIXELS < n * h * w <= POINTWISE_GEMM_MAX_PIXELS)


def output_spatial(in_hw, filter_rs, window_strides, padding, rhs_dilation):
    """(P, Q): output height and width of the convolution (as lax.conv_general_dilated)."""
    out = []
    for size, taps, stride, (lo, hi), dil in zip(in_hw, filter_rs, window_strides, padding,
                                                  rhs_dilation):
        span = (taps - 1) * dil + 1
        out.append((size + lo + hi - span) // stride + 1)
    return tuple(out)


def _unpack(args, x_nvfp4, has_bias):
    it = iter(args)
    x = next(it)
    x_scales, x_s_dec = (next(it), next(it)) if x_nvfp4 else (None, None)
    w_codes, w_scales, w_s_dec = next(it), next(it), next(it)
    bias = next(it) if has_bias else None
    return x, x_scales, x_s_dec, w_codes, w_scales, w_s_dec, bias


def _out_shape(x, w_codes, window_strides, padding, rhs_dilation):
    p, q = output_spatial(x.shape[1:3], w_codes.shape[:2], window_strides, padding, rhs_dilation)
    return (x.shape[0], p, q, w_codes.shape[2])


def _abstract(*args, x_nvfp4, has_bias, window_strides, padding, rhs_dilation, out_dtype):
    x, _, _, w_codes, *_ = _unpack(args, x_nvfp4, has_bias)
    return (ShapedArray(_out_shape(x, w_codes, window_strides, padding, rhs_dilation), out_dtype),)


def _reference(*args, x_nvfp4, has_bias, window_strides, padding, rhs_dilation, out_dtype):
    x, x_scales, x_s_dec, w_codes, w_scales, w_s_dec, bias = _unpack(args, x_nvfp4, has_bias)
    return (reference.conv(x, w_codes, w_scales, w_s_dec, x_scales=x_scales, x_s_dec=x_s_dec,
                           bias=bias, window_strides=window_strides, padding=padding,
                           rhs_dilation=rhs_dilation, out_dtype=out_dtype),)


def _pointwise_gemm(x, w_codes, w_scales, w_s_dec, bias, out_dtype):
    """An unpadded 1x1 convolution with stride 1 as the GEMM [N*H*W, C] x [K, C]^T: the weight's
    one tap is the GEMM's [K, C] NVFP4 matrix as it is stored (codes and tiled scales drop their
    leading 1 x 1)."""
    n, h, w, c = x.shape
    k = w_codes.shape[2]
    operands = [x.reshape(n * h * w, c), w_codes.reshape(k, c), w_scales.reshape(w_scales.shape[2:]),
                w_s_dec] + ([bias] if bias is not None else [])
    (out,) = gemm_kernel(*operands, a_nvfp4=False, has_bias=bias is not None, out_nvfp4=False,
                         out_dtype=out_dtype)
    return (out.reshape(n, h, w, k),)


def _kernel(*args, x_nvfp4, has_bias, window_strides, padding, rhs_dilation, out_dtype):
    x, x_scales, x_s_dec, w_codes, w_scales, w_s_dec, bias = _unpack(args, x_nvfp4, has_bias)
    kernel, splits = forced_kernel()
    if _extension.kernel_available(GEMM_TARGET) and pointwise_as_gemm(
            x.shape, x.dtype, x_nvfp4, w_codes.shape[:2], window_strides, padding, out_dtype,
            arch=_extension.visible_cuda_arch(), cublaslt=_extension.cublaslt_gemm_calls() is not None,
            forced=os.environ.get(KERNEL_ENV, "") not in ("", "auto")):
        return _pointwise_gemm(x, w_codes, w_scales, w_s_dec, bias, out_dtype)
    operands = (
        x,
        x_scales if x_nvfp4 else jnp.zeros((0,), SCALE_DTYPE),
        x_s_dec if x_nvfp4 else jnp.ones((), jnp.float32),
        w_codes, w_scales, w_s_dec,
        bias if has_bias else empty_f32(),
    )
    out = jax.ShapeDtypeStruct(_out_shape(x, w_codes, window_strides, padding, rhs_dilation),
                               out_dtype)
    (sh, sw), ((ph, _), (pw, _)), (dh, dw) = window_strides, padding, rhs_dilation
    return ffi_kernel_call(CONV_TARGET, [out], *operands, stride_h=np.int64(sh),
                           stride_w=np.int64(sw), pad_h=np.int64(ph), pad_w=np.int64(pw),
                           dil_h=np.int64(dh), dil_w=np.int64(dw), kernel=np.int64(kernel),
                           splits=np.int64(splits))


conv_p = define_primitive("nvfp4_conv", abstract_eval=_abstract, reference=_reference,
                          kernel=_kernel, ffi_target=lambda **_: CONV_TARGET)

def conv_batcher(prim, fallback=None):
    """vmap rule for `prim` (conv_p or a wrapper of it with the same operands and params): folds
    a vmapped activation into the image dimension N when the weights, bias and the activation's
    s_dec are shared; any other combination goes to `fallback` (a batching rule; by default
    `prim` once per batch element)."""
    others = fallback or map_batcher(prim)

    def rule(args, dims, **params):
        n_x = 3 if params["x_nvfp4"] else 1
        x_dims, rest = dims[:n_x], dims[n_x:]
        foldable = all(d is None for d in rest) and x_dims[0] is not None and (
            not params["x_nvfp4"] or (x_dims[1] is not None and x_dims[2] is None))
        if foldable:
            xs = [jnp.moveaxis(a, d, 0) for a, d in zip(args[:2], x_dims[:2]) if d is not None]
            b, images = xs[0].shape[:2]
            folded = [merge_leading(a, 2) for a in xs]
            if params["x_nvfp4"]:
                folded.append(args[2])
            (out,) = prim.bind(*folded, *args[n_x:], **params)
            return (out.reshape(b, images, *out.shape[1:]),), (0,)  # sizes given: any may be 0
        return others(args, dims, **params)

    return rule


batching.primitive_batchers[conv_p] = conv_batcher(conv_p)
