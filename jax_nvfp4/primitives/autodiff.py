"""Differentiation of the NVFP4 GEMM (DESIGN.md §6).

Importing this module registers a JVP and a transpose rule for `matmul_p`, so `jax.grad`,
`jax.jvp`, `jax.linearize` and `jax.vjp` work through `jax_nvfp4.matmul`:

- The GEMM is linear in its float activation `a` (W4A16) and in `bias`. The JVP applies the same
  NVFP4 GEMM to the tangent of `a` and adds the tangent of `bias`.
- The transpose (the backward pass) computes `ct @ dequantize(w)` in bfloat16 with float32
  accumulation: the weight is 4-bit, so the backward loses nothing worth a float32 GEMM, and
  the kernel's layout (both operands K-major) does not fit a product over N.
- NVFP4 operands (the weight, or an NVFP4 activation) are constants: codes and block scales are
  rounded values with no useful derivative, so their tangents are ignored and they get no
  cotangent. Train NVFP4 weights through `qat_matmul` (float master weights, straight-through).
- An NVFP4 *output* (`out_s_enc`) is a rounding step: differentiating through it is rejected.

`qat_matmul` is quantization-aware training: float master weights quantized in the forward pass,
gradients passed straight through the quantizers (custom_vjp).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.interpreters import ad

from jax_nvfp4.format import NVFP4Array
from jax_nvfp4.gemm import matmul
from jax_nvfp4.primitives.matmul import matmul_p
from jax_nvfp4.primitives.quantize import dequantize_p
from jax_nvfp4.quantization import dequantize, quantize

BACKWARD_DTYPE = jnp.bfloat16


def _layout(n_args, a_nvfp4, has_bias, out_nvfp4):
    """Operand positions of matmul_p: (weight codes index, bias index or None)."""
    b_codes = 3 if a_nvfp4 else 1
    bias = n_args - 1 - int(out_nvfp4) if has_bias else None
    return b_codes, bias


def _zero_like(x):
    """A symbolic zero tangent for primal value x."""
    return ad.Zero(jax.typeof(x).to_tangent_aval())


def _is_zero(t) -> bool:
    return type(t) is ad.Zero


def _matmul_jvp(primals, tangents, *, a_nvfp4, has_bias, out_nvfp4, out_dtype):
    params = dict(a_nvfp4=a_nvfp4, has_bias=has_bias, out_nvfp4=out_nvfp4, out_dtype=out_dtype)
    outs = matmul_p.bind(*primals, **params)
    b_codes, bias_i = _layout(len(primals), a_nvfp4, has_bias, out_nvfp4)
    a_dot = _zero_like(primals[0]) if a_nvfp4 else tangents[0]
    bias_dot = tangents[bias_i] if has_bias else _zero_like(primals[0])

    if out_nvfp4:
        if not (_is_zero(a_dot) and _is_zero(bias_dot)):
            raise TypeError("jax_nvfp4.matmul: an NVFP4 output (out_s_enc=...) is a rounding step "
                            "and cannot be differentiated; differentiate a float output, or train "
                            "with jax_nvfp4.flax's QAT layers (straight-through gradients)")
        return outs, [_zero_like(o) for o in outs]

    if _is_zero(a_dot) and _is_zero(bias_dot):
        return outs, [_zero_like(outs[0])]
    weight = primals[b_codes:b_codes + 3]
    if _is_zero(a_dot):
        t = jnp.zeros(outs[0].shape, out_dtype)
    else:  # linear in a: the same GEMM of the tangent, without the bias
        (t,) = matmul_p.bind(a_dot, *weight, a_nvfp4=False, has_bias=False, out_nvfp4=False,
                             out_dtype=out_dtype)
    if not _is_zero(bias_dot):
        t = (t.astype(jnp.float32) + bias_dot.astype(jnp.float32)).astype(out_dtype)
    return outs, [t]


def _matmul_transpose(cts, *args, a_nvfp4, has_bias, out_nvfp4, out_dtype):
    b_codes, bias_i = _layout(len(args), a_nvfp4, has_bias, out_nvfp4)
    a = args[0]
    linear = [ad.is_undefined_primal(x) for x in args]
    if a_nvfp4 or out_nvfp4 or not linear[0] or any(linear[b_codes:b_codes + 3]) or (
            has_bias and not linear[bias_i]):
        raise NotImplementedError(
            "jax_nvfp4.matmul is linear only in a float activation together with its bias; "
            f"got linear operands at positions {[i for i, l in enumerate(linear) if l]}")
    (ct,) = cts
    result = [None] * len(args)
    if _is_zero(ct):
        result[0] = ad.Zero(a.aval)
        if has_bias:
            result[bias_i] = ad.Zero(args[bias_i].aval)
        return result
    codes, scales, s_dec = args[b_codes:b_codes + 3]
    w_hat = dequantize_p.bind(codes, scales, s_dec, dtype=jnp.dtype(BACKWARD_DTYPE))  # [N, K]
    result[0] = jnp.dot(ct.astype(BACKWARD_DTYPE), w_hat,
                        preferred_element_type=jnp.float32).astype(a.aval.dtype)
    if has_bias:
        bias = args[bias_i]
        result[bias_i] = jnp.sum(ct.astype(jnp.float32), axis=0).astype(bias.aval.dtype)
    return result


ad.primitive_jvps[matmul_p] = _matmul_jvp
ad.primitive_transposes[matmul_p] = _matmul_transpose


class _QatConfig(NamedTuple):
    """Static parameters of a QAT matmul (hashable: custom_vjp's non-differentiable argument)."""

    quantize_activations: bool
    out_dtype: jnp.dtype
    x_dtype: jnp.dtype
    w_dtype: jnp.dtype
    bias_dtype: jnp.dtype | None


def qat_matmul(x, w, bias=None, *, quantize_activations=False, act_s_enc=None, out_dtype=None):
    """Quantization-aware y = x @ w.T (+ bias) with float master weights `w` [N, K].

    Forward: exactly `matmul(x_in, quantize(w), bias=bias)`, where x_in is x (W4A16) or, with
    `quantize_activations`, `quantize(x, s_enc=act_s_enc)` (W4A4; `act_s_enc=None` derives the
    encode scale from each call's amax). The forward pass is therefore bit-identical to the
    inference layer built from the same weights.

    Backward (straight-through estimator, in bfloat16 with float32 accumulation): the quantizers
    pass gradients unchanged, so with w_hat = dequantize(quantize(w)) and x_hat the activation the
    forward pass used,
        dx = g @ w_hat,   dw = g^T @ x_hat,   dbias = sum of g over the leading axes.
    `act_s_enc` gets a zero gradient (a calibration constant)."""
    x = jnp.asarray(x)
    w = jnp.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"qat_matmul: w must be a 2-D [N, K] float array, got shape {w.shape}")
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"qat_matmul: contracting dims differ: x has shape {tuple(x.shape)}, "
                         f"w has shape {tuple(w.shape)} (K={w.shape[1]})")
    if act_s_enc is not None and not quantize_activations:
        raise ValueError("qat_matmul: act_s_enc is only meaningful with quantize_activations=True")
    if act_s_enc is not None:
        act_s_enc = jnp.asarray(act_s_enc, jnp.float32)
    bias = None if bias is None else jnp.asarray(bias)
    cfg = _QatConfig(bool(quantize_activations),
                     jnp.dtype(jnp.bfloat16 if out_dtype is None else out_dtype),
                     jnp.dtype(x.dtype), jnp.dtype(w.dtype),
                     None if bias is None else jnp.dtype(bias.dtype))
    return _ste_matmul(x, w, bias, act_s_enc, cfg)


def _qat_forward(x, w, bias, act_s_enc, cfg):
    w_q = quantize(w)
    x_in = quantize(x, s_enc=act_s_enc) if cfg.quantize_activations else x
    y = matmul(x_in, w_q, bias=bias, out_dtype=cfg.out_dtype)
    return y, (x_in, w_q)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ste_matmul(x, w, bias, act_s_enc, cfg):
    return _qat_forward(x, w, bias, act_s_enc, cfg)[0]


def _ste_fwd(x, w, bias, act_s_enc, cfg):
    y, (x_in, w_q) = _qat_forward(x, w, bias, act_s_enc, cfg)
    return y, (x_in, w_q, act_s_enc)


def _ste_bwd(cfg, residuals, g):
    x_in, w_q, act_s_enc = residuals
    k = w_q.shape[1]
    x_hat = (dequantize(x_in, BACKWARD_DTYPE) if isinstance(x_in, NVFP4Array)
             else x_in.astype(BACKWARD_DTYPE))
    g2 = g.reshape(-1, g.shape[-1]).astype(BACKWARD_DTYPE)      # [M, N]
    x2 = x_hat.reshape(math.prod(x_hat.shape[:-1]), k)          # [M, K]
    w_hat = dequantize(w_q, BACKWARD_DTYPE)                     # [N, K]
    dx = jnp.dot(g2, w_hat, preferred_element_type=jnp.float32)
    dw = jnp.dot(g2.T, x2, preferred_element_type=jnp.float32)
    dx = dx.reshape(*g.shape[:-1], k).astype(cfg.x_dtype)
    dbias = None
    if cfg.bias_dtype is not None:
        dbias = jnp.sum(g.reshape(g2.shape).astype(jnp.float32), axis=0).astype(cfg.bias_dtype)
    d_s_enc = None if act_s_enc is None else jnp.zeros_like(act_s_enc)
    return dx, dw.astype(cfg.w_dtype), dbias, d_s_enc


_ste_matmul.defvjp(_ste_fwd, _ste_bwd)
