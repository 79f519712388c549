"""quantize / dequantize primitives (docs/quantize.md).

quantize_p.bind(x[, s_enc]) -> (codes, tiled scales, s_dec)
    x: float [..., R, K]; s_enc: float32 of shape x.shape[:g] (g >= 0), omitted to derive it from
    the tensor's amax. s_dec has the shape of s_enc (a scalar when omitted).
dequantize_p.bind(codes, scales, s_dec, dtype=...) -> float [..., R, K]

FFI targets (cuda/quantize/): "jax_nvfp4_quantize" takes (x, s_enc or an empty f32[0]) and returns
(codes, scales, s_dec); "jax_nvfp4_dequantize" takes (codes, scales, s_dec) and returns the values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.interpreters import batching

from jax_nvfp4 import reference
from jax_nvfp4.format import CODE_DTYPE, SCALE_DTYPE, tiled_scales_shape
from jax_nvfp4.primitives._base import (ShapedArray, batch_size, define_primitive, empty_f32,
                                        ffi_kernel_call, to_front)

QUANTIZE_TARGET = "jax_nvfp4_quantize"
DEQUANTIZE_TARGET = "jax_nvfp4_dequantize"


def _quantize_abstract(x, *s_enc):
    g = s_enc[0].ndim if s_enc else 0
    return (ShapedArray(x.shape, CODE_DTYPE), ShapedArray(tiled_scales_shape(x.shape), SCALE_DTYPE),
            ShapedArray(x.shape[:g], jnp.float32))


def _quantize_reference(x, *s_enc):
    return reference.quantize(x, s_enc[0] if s_enc else None)


def _quantize_kernel(x, *s_enc):
    outs = _quantize_abstract(x, *s_enc)
    return ffi_kernel_call(QUANTIZE_TARGET, [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs],
                           x, s_enc[0] if s_enc else empty_f32())


quantize_p = define_primitive(
    "nvfp4_quantize", abstract_eval=_quantize_abstract, reference=_quantize_reference,
    kernel=_quantize_kernel, ffi_target=lambda: QUANTIZE_TARGET)


def quantize_batcher(prim):
    """vmap rule for `prim` (quantize_p or a wrapper of it with the same operands). Each batch
    element is its own tensor: without s_enc it gets the S_enc of its own amax, computed here
    exactly as the kernel would (reference.encode_scale_from_amax divides correctly rounded)."""

    def rule(args, dims):
        size = batch_size(args, dims)
        x = to_front(args[0], dims[0], size)
        if len(args) == 2:
            s_enc = to_front(args[1], dims[1], size)
        else:
            s_enc = reference.encode_scale_from_amax(reference.tensor_amax(x, group_ndim=1))
        rank1 = x.ndim == 2  # a batch of [K] vectors: give each its own row axis
        codes, scales, s_dec = prim.bind(x[:, None, :] if rank1 else x, s_enc)
        return (codes[:, 0, :] if rank1 else codes, scales, s_dec), (0, 0, 0)

    return rule


batching.primitive_batchers[quantize_p] = quantize_batcher(quantize_p)


def _dequantize_abstract(codes, scales, s_dec, *, dtype):
    return ShapedArray(codes.shape, dtype)


def _dequantize_reference(codes, scales, s_dec, *, dtype):
    return reference.dequantize(codes, scales, s_dec, dtype)


def _dequantize_kernel(codes, scales, s_dec, *, dtype):
    (out,) = ffi_kernel_call(DEQUANTIZE_TARGET, [jax.ShapeDtypeStruct(codes.shape, dtype)],
                             codes, scales, s_dec)
    return out


dequantize_p = define_primitive(
    "nvfp4_dequantize", abstract_eval=_dequantize_abstract, reference=_dequantize_reference,
    kernel=_dequantize_kernel, ffi_target=lambda dtype: DEQUANTIZE_TARGET, multiple_results=False)


def dequantize_batcher(prim):
    """vmap rule for `prim` (dequantize_p or a wrapper of it with the same operands)."""

    def rule(args, dims, *, dtype):
        size = batch_size(args, dims)
        codes, scales, s_dec = (to_front(a, d, size) for a, d in zip(args, dims))
        rank1 = codes.ndim == 2
        out = prim.bind(codes[:, None, :] if rank1 else codes, scales, s_dec, dtype=dtype)
        return (out[:, 0, :] if rank1 else out), 0

    return rule


batching.primitive_batchers[dequantize_p] = dequantize_batcher(dequantize_p)
