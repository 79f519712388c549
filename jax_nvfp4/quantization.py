"""Public quantize / dequantize."""

from __future__ import annotations

import jax.numpy as jnp

from jax_nvfp4.format import (NVFP4Array, as_float_array, check_float_dtype, check_logical_shape,
                              check_not_nvfp4, checked_s_enc)
from jax_nvfp4.sharding.quantize import (partitioned_dequantize_p as dequantize_p,
                                         partitioned_quantize_p as quantize_p)


def quantize(x, *, s_enc=None) -> NVFP4Array:
    """Quantizes `x` [..., R, K] (float32/bfloat16/float16, K a multiple of 16) to NVFP4 along
    its last axis, with the TransformerEngine NVFP4 recipe (docs/quantize.md, Numerics).

    s_enc: the float32 tensor encode scale (static calibration). None derives it from the amax
    of the finite elements: S_enc = 6*448/amax. A float32 array whose shape is a prefix of the
    dims before [R, K] gives each matrix (or group of matrices) its own scale; rows inside one
    matrix share its scale. A host value (Python number, NumPy array) that is not finite and
    positive raises ValueError.
    Blocks holding NaN or +-Inf dequantize to NaN; other blocks are unaffected."""
    check_not_nvfp4(x, "quantize: x", "it is quantized already (dequantize it to requantize)")
    x = as_float_array(x)
    check_float_dtype(x.dtype, "quantize: x")
    check_logical_shape(x.shape, "quantize: x")
    if s_enc is None:
        codes, scales, s_dec = quantize_p.bind(x)
    else:
        s_enc = checked_s_enc(s_enc, "quantize: s_enc")
        lead = tuple(x.shape[:-2])  # dims before [R, K]: NVFP4Array.s_dec is a prefix of them
        if s_enc.shape != lead[: s_enc.ndim] or s_enc.ndim > len(lead):
            raise ValueError(f"quantize: s_enc of shape {s_enc.shape} must be a scalar or match a "
                             f"prefix of x's leading dims {lead}")
        codes, scales, s_dec = quantize_p.bind(x, s_enc)
    return NVFP4Array(codes, scales, s_dec)


def dequantize(q: NVFP4Array, dtype=jnp.bfloat16):
    """The values e2m1(code) * e4m3(block scale) * s_dec of `q`, computed in float32 and returned
    as `dtype` (float32, bfloat16 or float16).

    Under jax.grad `q` is a constant, as in matmul: its fields, s_dec included, get zero
    gradients (train weights with jax_nvfp4.flax.qat_matmul)."""
    if not isinstance(q, NVFP4Array):
        raise TypeError(f"dequantize expects an NVFP4Array, got {type(q).__name__}")
    q.validate("dequantize: q")
    dtype = check_float_dtype(dtype, "dequantize: dtype")
    return dequantize_p.bind(q.codes, q.scales, q.s_dec, dtype=dtype)
