"""Public NVFP4-weight convolution (NHWC activations, weights [R, S, K, C] quantized along C)."""

from __future__ import annotations

import operator

import jax.numpy as jnp
from jax import export, lax

from jax_nvfp4.format import (BLOCK, NVFP4Array, check_float_dtype, check_not_nvfp4,
                              checked_activation, checked_bias, checked_weight, output_dtype,
                              reduce_dtype_of)
from jax_nvfp4.primitives.conv import output_spatial
from jax_nvfp4.sharding.conv import partitioned_conv_p as conv_p
from jax_nvfp4.quantization import quantize


def quantize_conv_weight(w_hwio, *, s_enc=None) -> NVFP4Array:
    """Quantizes a float HWIO filter [R, S, C, K] (lax / Flax layout) into the NVFP4Array
    [R, S, K, C] that `conv` takes: transposed so the contracting C axis is last, quantized along
    C with one tensor scale (`s_enc` as in `jax_nvfp4.quantize`)."""
    check_not_nvfp4(w_hwio, "quantize_conv_weight: w_hwio", "it is quantized already: conv takes it")
    w_hwio = jnp.asarray(w_hwio)
    check_float_dtype(w_hwio.dtype, "quantize_conv_weight: w_hwio")
    if w_hwio.ndim != 4:
        raise ValueError(f"quantize_conv_weight: w_hwio must be [R, S, C, K], got shape "
                         f"{tuple(w_hwio.shape)}")
    if w_hwio.shape[2] % BLOCK:
        raise ValueError(f"quantize_conv_weight: input channels C={w_hwio.shape[2]} (shape "
                         f"{tuple(w_hwio.shape)}) must be a multiple of {BLOCK}")
    return quantize(jnp.transpose(w_hwio, (0, 1, 3, 2)), s_enc=s_enc)


def _pair(value, name):
    try:
        pair = tuple(operator.index(v) for v in value)
    except TypeError:
        raise TypeError(f"conv: {name} must be a pair of ints, got {value!r}") from None
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"conv: {name} must be two positive ints, got {value!r}")
    return pair


def _resolve_padding(padding, in_hw, filter_rs, window_strides, rhs_dilation):
    """'SAME' / 'VALID' / ((lo, hi), (lo, hi)) -> explicit pads, as lax.conv_general_dilated."""
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID", "SAME_LOWER"):
            raise ValueError(f"conv: padding must be 'SAME', 'SAME_LOWER', 'VALID' or "
                             f"((lo, hi), (lo, hi)), got {padding!r}")
        span = [(t - 1) * d + 1 for t, d in zip(filter_rs, rhs_dilation)]
        pads = lax.padtype_to_pads(in_hw, span, window_strides, padding.upper())
    else:
        try:
            pads = [tuple(operator.index(v) for v in pair) for pair in padding]
        except TypeError:
            raise TypeError(f"conv: padding must be a string or ((lo, hi), (lo, hi)), got "
                            f"{padding!r}") from None
        if len(pads) != 2 or any(len(p) != 2 for p in pads):
            raise ValueError(f"conv: explicit padding must be ((lo, hi), (lo, hi)), got {padding!r}")
    if any(export.is_symbolic_dim(v) for pair in pads for v in pair):
        raise ValueError(f"conv: padding={padding!r} with window_strides={tuple(window_strides)} "
                         f"depends on the symbolic input size {tuple(in_hw)} (jax.export); the "
                         "kernels take constant pads: give them explicitly")
    pads = tuple((int(lo), int(hi)) for lo, hi in pads)
    if any(v < 0 for pair in pads for v in pair):
        raise ValueError(f"conv: negative padding {pads} is not supported")
    return pads


def conv(x, w: NVFP4Array, *, window_strides=(1, 1), padding="SAME", rhs_dilation=(1, 1),
         bias=None, out_dtype=None, reduce_dtype=None):
    """2-D convolution with NVFP4 weights:
    out[n, p, q, k] = sum_{r, s, c} x[n, p*sh - lo_h + r*dh, q*sw - lo_w + s*dw, c] * w[r, s, k, c]
                      (+ bias[k]), zero outside the image.

    x: NHWC activations [N, H, W, C], float32/bfloat16/float16, or an NVFP4Array of that shape
       quantized along C with a scalar s_dec. C must be a multiple of 16.
    w: NVFP4Array [R, S, K, C] with a scalar s_dec (see `quantize_conv_weight` for HWIO floats).
    window_strides, rhs_dilation: pairs of positive ints (H, W).
    padding: "SAME", "SAME_LOWER", "VALID" or ((lo_h, hi_h), (lo_w, hi_w)) >= 0, resolved exactly
       as lax.conv_general_dilated resolves it.
    bias: optional [K] float array, added in float32.
    out_dtype: float dtype of the result (default bfloat16).
    reduce_dtype: where C is split over devices (jax_nvfp4.sharding), the dtype the partial
       convolutions are summed in across them: float32 (default) or bfloat16 (half the bytes,
       each partial rounded to bfloat16 first). No effect without a C split.

    Products are exact (e2m1 * e4m3 in bf16 on the tensor cores), accumulation float32, the tensor
    scales s_dec_w (* s_dec_x) applied in the epilogue. Float32/float16 activations are rounded to
    bfloat16 on the GPU paths."""
    checked_weight(w, "conv", "[R, S, K, C]", "jax_nvfp4.quantize_conv_weight")
    x, x_nvfp4 = checked_activation(x, "conv")
    if len(x.shape) != 4:
        raise ValueError(f"conv: x must be NHWC [N, H, W, C], got shape {tuple(x.shape)}")
    r, s, k, c = w.shape
    if r < 1 or s < 1:
        raise ValueError(f"conv: the filter's spatial size R x S = {r} x {s} (w shape {w.shape}) "
                         "must be positive")
    if x.shape[3] != c:
        raise ValueError(f"conv: input channels differ: x has shape {tuple(x.shape)} (C="
                         f"{x.shape[3]}), w has shape {w.shape} (C={c})")
    window_strides = _pair(window_strides, "window_strides")
    rhs_dilation = _pair(rhs_dilation, "rhs_dilation")
    padding = _resolve_padding(padding, x.shape[1:3], (r, s), window_strides, rhs_dilation)
    p, q = output_spatial(x.shape[1:3], (r, s), window_strides, padding, rhs_dilation)
    if not any(map(export.is_symbolic_dim, (p, q))) and (p < 1 or q < 1):  # symbolic: not decidable here
        raise ValueError(f"conv: empty output ({p}x{q}) for input {tuple(x.shape)}, filter "
                         f"{r}x{s}, padding {padding}, dilation {rhs_dilation}")
    out_dtype = output_dtype(out_dtype, "conv")
    reduce_dtype = reduce_dtype_of(reduce_dtype, "conv")
    bias = checked_bias(bias, k, "conv")

    x_ops = [x.codes, x.scales, x.s_dec] if x_nvfp4 else [x]
    operands = [*x_ops, w.codes, w.scales, w.s_dec] + ([bias] if bias is not None else [])
    (out,) = conv_p.bind(*operands, x_nvfp4=x_nvfp4, has_bias=bias is not None,
                         window_strides=window_strides, padding=padding,
                         rhs_dilation=rhs_dilation, out_dtype=out_dtype,
                         reduce_dtype=reduce_dtype)
    return out
