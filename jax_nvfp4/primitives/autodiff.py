"""Differentiation of the NVFP4 GEMM and convolution (docs/flax.md, Numerics).

Importing this module registers JVP and transpose rules for `matmul_p` and `conv_p` and for
their partitioned outer primitives (jax_nvfp4.sharding), which the public functions bind, so
`jax.grad`, `jax.jvp`, `jax.linearize` and `jax.vjp` work through `jax_nvfp4.matmul` and
`jax_nvfp4.conv`, partitioned like the forward pass:

- Both are linear in their float activation (W4A16) and in `bias`. The JVP applies the same
  NVFP4 op to the activation's tangent and adds the tangent of `bias`.
- The transpose (the backward pass) runs against the dequantized weight in bfloat16 with float32
  accumulation (`ct @ w_hat`, or the transposed convolution; the kernels' K-major layouts do not
  fit a product over N). The cotangent and w_hat (the tensor scale s_dec included) are rounded to
  bfloat16 first, so gradients agree with a float32 backward to ~1e-2 relative, not to float32
  precision: `jax.test_util.check_grads` at its float32 tolerances fails in reverse mode.
- NVFP4 operands (the weight, or an NVFP4 activation) are constants: codes and block scales are
  rounded values with no useful derivative, so their tangents are ignored and they get no
  cotangent; `dequantize` gives them a zero tangent the same way. Train NVFP4 weights through
  `qat_matmul` / `qat_conv` (float master weights, straight-through gradients).
- An NVFP4 *output* (`out_s_enc`) is a rounding step: differentiating through it is rejected,
  and so is differentiating through `quantize`.
- A matmul with an epilogue `activation` is act(z) of the linear op's float32 value z: its JVP
  computes z with a second (linear) GEMM and applies the activation's own JVP.

`qat_matmul` / `qat_conv` are quantization-aware training: float master weights quantized in the
forward pass, gradients passed straight through the quantizers (custom_vjp).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.interpreters import ad

from jax_nvfp4 import reference
from jax_nvfp4.convolution import conv, quantize_conv_weight
from jax_nvfp4.format import NVFP4Array, check_not_nvfp4, reduce_dtype_of
from jax_nvfp4.gemm import matmul
from jax_nvfp4.primitives._base import is_zero, on_auto_axes, typed_like, zero_like
from jax_nvfp4.primitives.conv import conv_p
from jax_nvfp4.primitives.matmul import matmul_p
from jax_nvfp4.primitives.quantize import dequantize_p, quantize_p
from jax_nvfp4.primitives.ragged import operand_names as ragged_operand_names
from jax_nvfp4.primitives.ragged import ragged_matmul_p, ragged_tangent_p
from jax_nvfp4.quantization import dequantize, quantize
from jax_nvfp4.sharding.conv import partitioned_conv_p
from jax_nvfp4.sharding.matmul import partitioned_matmul_p
from jax_nvfp4.sharding.quantize import partitioned_dequantize_p, partitioned_quantize_p
from jax_nvfp4.sharding.ragged import partitioned_ragged_matmul_p

BACKWARD_DTYPE = jnp.bfloat16


class _LinearOp(NamedTuple):
    """How an NVFP4-weight primitive is linear in its float activation.

    Operands: act, [act_scales, act_s_dec,] w_codes, w_scales, w_s_dec, [bias,] [out_s_enc]."""

    prim: Any
    act_nvfp4_param: str            # the parameter saying the activation is NVFP4
    backward: Callable              # (ct bf16, w_hat bf16, act aval, params) -> act cotangent


def _positions(op, n_args, params):
    """(weight codes index, bias index or None) among the primitive's operands."""
    b_codes = 3 if params[op.act_nvfp4_param] else 1
    bias = n_args - 1 - int(params.get("out_nvfp4", False)) if params["has_bias"] else None
    return b_codes, bias


def _jvp(op, primals, tangents, **params):
    if params.get("activation", "none") != "none" and not params.get("out_nvfp4", False):
        return _activated_jvp(op, primals, tangents, params)
    outs = op.prim.bind(*primals, **params)
    b_codes, bias_i = _positions(op, len(primals), params)
    act_dot = zero_like(primals[0]) if params[op.act_nvfp4_param] else tangents[0]
    bias_dot = tangents[bias_i] if bias_i is not None else zero_like(primals[0])

    if params.get("out_nvfp4", False):
        if not (is_zero(act_dot) and is_zero(bias_dot)):
            raise TypeError("jax_nvfp4.matmul: an NVFP4 output (out_s_enc=...) is a rounding step "
                            "and cannot be differentiated; differentiate a float output, or train "
                            "with jax_nvfp4.flax's QAT layers (straight-through gradients)")
        return outs, [zero_like(o) for o in outs]

    if is_zero(act_dot) and is_zero(bias_dot):
        return outs, [zero_like(outs[0])]
    out_dtype = params["out_dtype"]
    if is_zero(act_dot):
        t = jnp.zeros(outs[0].shape, out_dtype)
    else:  # linear in the activation: the same op on the tangent, without the bias
        (t,) = op.prim.bind(act_dot, *primals[b_codes:b_codes + 3],
                            **{**params, "has_bias": False})
    if not is_zero(bias_dot):
        t = (t.astype(jnp.float32) + bias_dot.astype(jnp.float32)).astype(out_dtype)
    return outs, [t]


def _activated_jvp(op, primals, tangents, params):
    """y = act(z), z the op's float32 value without the activation: z and its tangent from the
    linear op, then the activation's JVP in float32 (reference.activation, the kernels' formulas).
    The primal is act(z) from this z, not a second, fused call."""
    linear = {**params, "activation": "none", "out_dtype": jnp.dtype(jnp.float32)}
    (z,), (z_dot,) = _jvp(op, primals, tangents, **linear)
    act = functools.partial(reference.activation, name=params["activation"])
    out_dtype = params["out_dtype"]
    if is_zero(z_dot):
        y = act(z).astype(out_dtype)
        return [y], [zero_like(y)]
    y, y_dot = jax.jvp(act, (z,), (z_dot,))
    return [y.astype(out_dtype)], [y_dot.astype(out_dtype)]


def _transpose(op, cts, *args, **params):
    b_codes, bias_i = _positions(op, len(args), params)
    act = args[0]
    linear = [ad.is_undefined_primal(x) for x in args]
    if (params[op.act_nvfp4_param] or params.get("out_nvfp4", False) or not linear[0]
            or params.get("activation", "none") != "none"
            or any(linear[b_codes:b_codes + 3]) or (bias_i is not None and not linear[bias_i])):
        raise NotImplementedError(
            f"{op.prim} is linear only in a float activation together with its bias; got linear "
            f"operands at positions {[i for i, is_linear in enumerate(linear) if is_linear]}")
    (ct,) = cts
    result = [None] * len(args)
    if is_zero(ct):
        result[0] = ad.Zero(act.aval)
        if bias_i is not None:
            result[bias_i] = ad.Zero(args[bias_i].aval)
        return result
    codes, scales, s_dec = args[b_codes:b_codes + 3]
    # the public dequantize: partitioned like the weight (jax_nvfp4.sharding), never gathered
    w_hat = dequantize(NVFP4Array(codes, scales, s_dec), BACKWARD_DTYPE)
    result[0] = typed_like(op.backward(ct.astype(BACKWARD_DTYPE), w_hat, act.aval,
                                        params).astype(act.aval.dtype), act.aval)
    if bias_i is not None:
        summed = tuple(range(ct.ndim - 1))
        result[bias_i] = typed_like(jnp.sum(ct.astype(jnp.float32), axis=summed).astype(
            args[bias_i].aval.dtype), args[bias_i].aval)
    return result


def _matmul_backward(ct, w_hat, act_aval, params):
    """d(act) = ct [M, N] @ w_hat [N, K]. Where both split N on Explicit mesh axes (a
    column-parallel layer), the product sums over the split, and is typed like the activation."""
    split_n = jax.typeof(ct).sharding.spec[-1] and jax.typeof(w_hat).sharding.spec[0]
    return jnp.dot(ct, w_hat, preferred_element_type=jnp.float32,
                   out_sharding=act_aval.sharding.spec if split_n else None)


def _float_conv(x, w_hwio, window_strides, padding, rhs_dilation):
    """The float NHWC x HWIO convolution the backward passes differentiate (f32 accumulation)."""
    return lax.conv_general_dilated(x, w_hwio, window_strides, padding,
                                    rhs_dilation=rhs_dilation,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    preferred_element_type=jnp.float32)


def _conv_backward(ct, w_hat, act_aval, params):
    """d(x) = the transposed convolution of ct with w_hat [R, S, K, C] (as HWIO). On Explicit
    mesh axes it runs on Auto axes, typed like x: JAX's convolution asks for an out_sharding once
    its operands are split."""

    def transposed(ct, w_hat):
        w_hwio = jnp.transpose(w_hat, (0, 1, 3, 2))
        x_aval = jax.ShapeDtypeStruct(act_aval.shape, BACKWARD_DTYPE)
        conv = functools.partial(_float_conv, w_hwio=w_hwio,
                                 window_strides=params["window_strides"],
                                 padding=params["padding"], rhs_dilation=params["rhs_dilation"])
        (dx,) = jax.linear_transpose(conv, x_aval)(ct.astype(jnp.float32))
        return dx

    if jax.sharding.get_abstract_mesh().explicit_axes:
        return jax.sharding.auto_axes(transposed, out_sharding=act_aval.sharding.spec)(ct, w_hat)
    return transposed(ct, w_hat)


# Each rule is registered for the inner primitive and for its partitioned outer primitive
# (jax_nvfp4.sharding), binding the primitive it is registered for: the public functions bind the
# outer ones, so their primal, tangent and transposed products are partitioned like the forward
# pass (on meshes with Explicit axes too, where an inner primitive traced on sharded types fails).
for _op in (_LinearOp(matmul_p, "a_nvfp4", _matmul_backward),
            _LinearOp(partitioned_matmul_p, "a_nvfp4", _matmul_backward),
            _LinearOp(conv_p, "x_nvfp4", _conv_backward),
            _LinearOp(partitioned_conv_p, "x_nvfp4", _conv_backward)):
    ad.primitive_jvps[_op.prim] = functools.partial(_jvp, _op)
    ad.primitive_transposes[_op.prim] = functools.partial(_transpose, _op)


def _ragged_jvp(prim, primals, tangents, **params):
    """JVP of the ragged matmul in its float x and its bias: y = act(z), z from the primitive in
    float32 without the activation; z's tangent x_dot times the weights (ragged_tangent_p: XLA's
    ragged_dot in bfloat16 with float32 sums, transposed by ragged_cotangent_p), plus each row's
    group's bias tangent. On a mesh with Explicit axes the tangent is computed on Auto axes, as
    matmul's backward is. NVFP4 operands are constants, as in matmul."""
    names = ragged_operand_names(params["a_nvfp4"], params["has_bias"])
    ops, dots = dict(zip(names, primals)), dict(zip(names, tangents))
    live = {}
    if not params["a_nvfp4"] and not is_zero(dots["a"]):
        live["x"] = dots["a"]
    if params["has_bias"] and not is_zero(dots["bias"]):
        live["bias"] = dots["bias"]
    if not live:
        (y,) = prim.bind(*primals, **params)
        return [y], [zero_like(y)]
    (z,) = prim.bind(*primals, **{**params, "activation": "none",
                                  "out_dtype": jnp.dtype(jnp.float32)})
    weights = [ops[k] for k in ("b_codes", "b_scales", "b_s_dec", "group_sizes", "first_row")]

    def z_tangent(live, weights):
        z_dot = jnp.zeros(z.shape, jnp.float32)
        if "x" in live:
            z_dot = ragged_tangent_p.bind(live["x"], *weights)
        if "bias" in live:
            group, held = reference.ragged_row_groups(weights[3], weights[4], z.shape[0])
            z_dot = z_dot + jnp.where(held[:, None], live["bias"].astype(jnp.float32)[group], 0.0)
        return z_dot

    z_dot = on_auto_axes(z_tangent)(live, weights)
    act = functools.partial(reference.activation, name=params["activation"])
    y, y_dot = jax.jvp(act, (z,), (z_dot,))
    return [y.astype(params["out_dtype"])], [y_dot.astype(params["out_dtype"])]


for _prim in (ragged_matmul_p, partitioned_ragged_matmul_p):
    ad.primitive_jvps[_prim] = functools.partial(_ragged_jvp, _prim)


def _quantize_jvp(prim, primals, tangents):
    """Quantization rounds: a tangent through it is refused with the way to train instead."""
    if not all(is_zero(t) for t in tangents):
        raise TypeError("jax_nvfp4.quantize (also what makes ragged_matmul's NVFP4 output, "
                        "out_s_enc=...) is a rounding step and cannot be differentiated; "
                        "train with jax_nvfp4.flax.qat_matmul / qat_conv or its QAT layers "
                        "(straight-through gradients)")
    outs = prim.bind(*primals)
    return outs, [zero_like(o) for o in outs]


def _dequantize_jvp(prim, primals, tangents, *, dtype):
    """An NVFP4Array's fields are constants, as matmul treats them: a zero tangent (train with
    the QAT layers' float master weights)."""
    out = prim.bind(*primals, dtype=dtype)
    return out, zero_like(out)


for _prim in (quantize_p, partitioned_quantize_p):
    ad.primitive_jvps[_prim] = functools.partial(_quantize_jvp, _prim)
for _prim in (dequantize_p, partitioned_dequantize_p):
    ad.primitive_jvps[_prim] = functools.partial(_dequantize_jvp, _prim)


class _QatConfig(NamedTuple):
    """Static parameters of a QAT op (hashable: custom_vjp's non-differentiable argument).
    `conv` is None for a matmul, else (window_strides, padding, rhs_dilation)."""

    quantize_activations: bool
    out_dtype: jnp.dtype
    x_dtype: jnp.dtype
    w_dtype: jnp.dtype
    bias_dtype: jnp.dtype | None
    conv: tuple | None
    reduce_dtype: jnp.dtype


def _config(x, w, bias, quantize_activations, act_s_enc, out_dtype, conv_params, reduce_dtype,
            name):
    if act_s_enc is not None and not quantize_activations:
        raise ValueError(f"{name}: act_s_enc is only meaningful with quantize_activations=True")
    return _QatConfig(bool(quantize_activations),
                      jnp.dtype(jnp.bfloat16 if out_dtype is None else out_dtype),
                      jnp.dtype(x.dtype), jnp.dtype(w.dtype),
                      None if bias is None else jnp.dtype(bias.dtype), conv_params,
                      reduce_dtype_of(reduce_dtype, name))


def qat_matmul(x, w, bias=None, *, quantize_activations=False, act_s_enc=None, out_dtype=None,
               reduce_dtype=None):
    """Quantization-aware y = x @ w.T (+ bias) with float master weights `w` [N, K].

    Forward: exactly `matmul(x_in, quantize(w), bias=bias, reduce_dtype=reduce_dtype)`, where
    x_in is x (W4A16) or, with `quantize_activations`, `quantize(x, s_enc=act_s_enc)` (W4A4;
    `act_s_enc=None` derives the encode scale from each call's amax). The forward pass is
    therefore bit-identical to the inference layer built from the same weights.

    Backward (straight-through estimator, in bfloat16 with float32 accumulation): the quantizers
    pass gradients unchanged, so with w_hat = dequantize(quantize(w)) and x_hat the activation the
    forward pass used,
        dx = g @ w_hat,   dw = g^T @ x_hat,   dbias = sum of g over the leading axes.
    `act_s_enc` gets a zero gradient (a calibration constant)."""
    check_not_nvfp4(w, "qat_matmul: w", "QAT trains the float master weight; jax_nvfp4.matmul "
                    "takes a quantized one")
    x, w = jnp.asarray(x), jnp.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"qat_matmul: w must be a 2-D [N, K] float array, got shape {w.shape}")
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"qat_matmul: contracting dims differ: x has shape {tuple(x.shape)}, "
                         f"w has shape {tuple(w.shape)} (K={w.shape[1]})")
    bias = None if bias is None else jnp.asarray(bias)
    cfg = _config(x, w, bias, quantize_activations, act_s_enc, out_dtype, None, reduce_dtype,
                  "qat_matmul")
    return _ste(x, w, bias, _as_f32(act_s_enc), cfg)


def qat_conv(x, w_hwio, bias=None, *, window_strides=(1, 1), padding="SAME",
             rhs_dilation=(1, 1), quantize_activations=False, act_s_enc=None, out_dtype=None,
             reduce_dtype=None):
    """Quantization-aware `jax_nvfp4.conv` with a float master filter `w_hwio` [R, S, C, K].

    Forward: exactly `conv(x_in, quantize_conv_weight(w_hwio), ..., reduce_dtype=...)` (x_in as
    in `qat_matmul`).
    Backward: the straight-through gradients of the float convolution of x_hat with the
    dequantized filter, in bfloat16 with float32 accumulation."""
    check_not_nvfp4(w_hwio, "qat_conv: w_hwio", "QAT trains the float master filter; "
                    "jax_nvfp4.conv takes a quantized one")
    x, w_hwio = jnp.asarray(x), jnp.asarray(w_hwio)
    if w_hwio.ndim != 4:
        raise ValueError(f"qat_conv: w_hwio must be a 4-D [R, S, C, K] float array, got shape "
                         f"{w_hwio.shape}")
    bias = None if bias is None else jnp.asarray(bias)
    conv_params = (tuple(window_strides), padding if isinstance(padding, str) else
                   tuple(tuple(p) for p in padding), tuple(rhs_dilation))
    cfg = _config(x, w_hwio, bias, quantize_activations, act_s_enc, out_dtype, conv_params,
                  reduce_dtype, "qat_conv")
    return _ste(x, w_hwio, bias, _as_f32(act_s_enc), cfg)


def _as_f32(value):
    return None if value is None else jnp.asarray(value, jnp.float32)


def _qat_forward(x, w, bias, act_s_enc, cfg):
    x_in = quantize(x, s_enc=act_s_enc) if cfg.quantize_activations else x
    if cfg.conv is None:
        w_q = quantize(w)
        y = matmul(x_in, w_q, bias=bias, out_dtype=cfg.out_dtype, reduce_dtype=cfg.reduce_dtype)
    else:
        strides, padding, dilation = cfg.conv
        w_q = quantize_conv_weight(w)
        y = conv(x_in, w_q, window_strides=strides, padding=padding, rhs_dilation=dilation,
                 bias=bias, out_dtype=cfg.out_dtype, reduce_dtype=cfg.reduce_dtype)
    return y, (x_in, w_q)


def _float_op(x, w, cfg):
    """The float op of the master layouts (w [N, K] or HWIO) whose VJP is the STE backward."""
    if cfg.conv is None:
        return jnp.dot(x, w.T, preferred_element_type=jnp.float32)
    return _float_conv(x, w, *cfg.conv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ste(x, w, bias, act_s_enc, cfg):
    return _qat_forward(x, w, bias, act_s_enc, cfg)[0]


def _ste_fwd(x, w, bias, act_s_enc, cfg):
    y, (x_in, w_q) = _qat_forward(x, w, bias, act_s_enc, cfg)
    return y, (x_in, w_q, act_s_enc)


def _float_vjp(cfg, x_hat, w_hat, g_hat):
    """(dx, dw) of the float op at the dequantized operands for the cotangent g_hat."""
    _, vjp = jax.vjp(lambda x, w: _float_op(x, w, cfg), x_hat, w_hat)
    return vjp(g_hat)


def _ste_bwd(cfg, residuals, g):
    x_in, w_q, act_s_enc = residuals
    x_hat = (dequantize(x_in, BACKWARD_DTYPE) if isinstance(x_in, NVFP4Array)
             else x_in.astype(BACKWARD_DTYPE))
    w_hat = dequantize(w_q, BACKWARD_DTYPE)
    if cfg.conv is not None:  # [R, S, K, C] -> the master HWIO layout
        w_hat = jnp.transpose(w_hat, (0, 1, 3, 2))
    g_hat = g.astype(BACKWARD_DTYPE).astype(jnp.float32)
    if jax.sharding.get_abstract_mesh().explicit_axes:
        # On Explicit mesh axes the cotangent can arrive without the output's sharding in its
        # type, and JAX's convolution VJP over a sharded batch wants an out_sharding: run the
        # float VJP with the axes Auto, the gradients typed like their inputs.
        specs = (jax.typeof(x_hat).sharding.spec, jax.typeof(w_hat).sharding.spec)
        dx, dw = jax.sharding.auto_axes(functools.partial(_float_vjp, cfg), out_sharding=specs)(
            x_hat, w_hat, g_hat)
    else:
        dx, dw = _float_vjp(cfg, x_hat, w_hat, g_hat)
    dbias = None
    if cfg.bias_dtype is not None:
        dbias = jnp.sum(g.astype(jnp.float32), axis=tuple(range(g.ndim - 1)))
        dbias = dbias.astype(cfg.bias_dtype)
    d_s_enc = None if act_s_enc is None else jnp.zeros_like(act_s_enc)
    return dx.astype(cfg.x_dtype), dw.astype(cfg.w_dtype), dbias, d_s_enc


_ste.defvjp(_ste_fwd, _ste_bwd)
