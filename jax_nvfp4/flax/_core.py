"""What the nnx and linen layers share: argument checks, the forward pass, kernel quantization
and the mapping of a float kernel's sharding names onto the NVFP4 fields."""

from __future__ import annotations

import math
import numbers

import jax.numpy as jnp
import numpy as np

from jax_nvfp4.convolution import conv as nvfp4_conv
from jax_nvfp4.convolution import quantize_conv_weight
from jax_nvfp4 import reference
from jax_nvfp4.format import (BLOCK, GATED_ACTIVATIONS, NVFP4Array, activation_of,
                              check_float_dtype, reduce_dtype_of)
from jax_nvfp4.gemm import matmul
from jax_nvfp4.primitives.autodiff import qat_conv, qat_matmul
from jax_nvfp4.quantization import quantize
from jax_nvfp4.reference import encode_scale_from_amax, tensor_amax


def _is_int(value) -> bool:
    """A Python or NumPy integer (not a bool), as Flax takes for sizes."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_in_features(in_features, layer: str) -> None:
    """The contracting size must hold whole 16-element NVFP4 blocks."""
    if not _is_int(in_features) or in_features <= 0 or in_features % BLOCK:
        raise ValueError(f"{layer}: in_features={in_features!r} must be a positive multiple of "
                         f"{BLOCK} (NVFP4 quantizes the input axis in blocks of {BLOCK})")


def check_out_features(out_features, layer: str) -> None:
    if not _is_int(out_features) or out_features <= 0:
        raise ValueError(f"{layer}: out features {out_features!r} must be a positive int")


def check_act_quant(act_quant: bool, act_s_enc, layer: str) -> None:
    """act_s_enc (a calibrated static activation encode scale) needs act_quant=True."""
    if act_s_enc is None:
        return
    if not act_quant:
        raise ValueError(f"{layer}: act_s_enc={act_s_enc!r} is given but act_quant=False; "
                         "a static activation scale only applies to W4A4 (act_quant=True)")
    real = isinstance(act_s_enc, numbers.Real) and not isinstance(act_s_enc, (bool, np.bool_))
    if not (real and math.isfinite(act_s_enc) and act_s_enc > 0):
        raise ValueError(f"{layer}: act_s_enc must be a finite positive float, got {act_s_enc!r}")


def kernel_outputs(out_features: int, activation, layer: str) -> int:
    """The kernel's output columns for `out_features` outputs: twice as many with a gated
    activation (interleaved gate/up columns, jax_nvfp4.interleave_gate_up's pairs transposed).
    Checks `activation` (None or one of jax_nvfp4.format.ACTIVATIONS)."""
    gated = activation_of(activation, layer) in GATED_ACTIVATIONS
    return 2 * out_features if gated else out_features


def activation_s_enc(samples) -> float:
    """A static activation encode scale calibrated on `samples`: 6*448 / max|samples|, the
    scale dynamic W4A4 would derive from them (pass it as a layer's `act_s_enc`)."""
    return float(encode_scale_from_amax(tensor_amax(jnp.asarray(samples))))


def quantize_kernel(kernel, *, conv: bool = False) -> NVFP4Array:
    """A Flax float kernel -> its NVFP4 weight: dense [in, out] -> [out, in]; conv (HWIO)
    [R, S, in, out] -> [R, S, out, in]. The input axis, blocked by 16, goes last."""
    kernel = jnp.asarray(kernel)
    return quantize_conv_weight(kernel) if conv else quantize(kernel.T)


def _input(x, dtype, param_dtype, params, in_features, min_ndim, layer):
    """Checks a layer input [..., in_features]; returns it cast to `dtype` and the output dtype:
    `dtype`, else that Flax would give, x's promoted with the float `params` as they are (a bf16
    checkpoint gives bf16), or with param_dtype where none is float (an NVFP4 kernel, no bias)."""
    x = jnp.asarray(x)
    check_float_dtype(x.dtype, f"{layer}: input")
    if x.ndim < min_ndim or x.shape[-1] != in_features:
        raise ValueError(f"{layer}: input of shape {tuple(x.shape)} does not end in "
                         f"in_features={in_features}" + (f" (needs rank >= {min_ndim})"
                                                          if x.ndim < min_ndim else ""))
    if dtype is not None:
        return x.astype(dtype), jnp.dtype(dtype)
    floats = [p.dtype for p in params if p is not None and not isinstance(p, NVFP4Array)]
    return x, jnp.result_type(x.dtype, *(floats or [param_dtype]))


def dense(x, kernel, bias, *, in_features: int, dtype, param_dtype, act_quant: bool, act_s_enc,
          reduce_dtype, layer: str, activation=None):
    """y = act(x @ W^T + bias) for x [..., in_features].

    kernel: an NVFP4Array [out, in] (inference) or a float array [in, out] in Flax's layout
    (quantization-aware training: quantized here, straight-through gradients).
    The output dtype is `dtype`, else that Flax's Dense would give: x's promoted with the float
    params (the bias, a QAT kernel), or with param_dtype where there are none. With `dtype`
    given, x is cast to it first. reduce_dtype: matmul's (the dtype
    a row-parallel layer sums its partial products in across devices). activation: matmul's
    (a gated one halves the outputs); QAT applies it in float32 to the straight-through result,
    with the same formulas (jax_nvfp4.reference.activation)."""
    x, out_dtype = _input(x, dtype, param_dtype, (kernel, bias), in_features, 1, layer)
    reduce_dtype = reduce_dtype_of(reduce_dtype, layer)
    activation = activation_of(activation, layer)
    if isinstance(kernel, NVFP4Array):
        x_in = quantize(x, s_enc=act_s_enc) if act_quant else x
        return matmul(x_in, kernel, bias=bias,
                      activation=None if activation == "none" else activation,
                      out_dtype=out_dtype, reduce_dtype=reduce_dtype)
    y = qat_matmul(x, kernel.T, bias, quantize_activations=act_quant, act_s_enc=act_s_enc,
                   out_dtype=out_dtype if activation == "none" else jnp.float32,
                   reduce_dtype=reduce_dtype)
    return reference.activation(y, activation).astype(out_dtype)


def pair(value, name: str, layer: str) -> tuple[int, int]:
    """An int or a pair of positive ints (Flax's strides/dilation; Python or NumPy ints) -> a
    pair; None is 1, as in Flax."""
    if value is None:
        return (1, 1)
    try:
        pair_ = (value, value) if _is_int(value) else tuple(value)
    except TypeError:  # neither an int nor a sequence
        pair_ = ()
    if len(pair_) != 2 or not all(_is_int(v) and v > 0 for v in pair_):
        raise ValueError(f"{layer}: {name}={value!r} must be a positive int or a pair of them "
                         "(2-D convolutions only)")
    return tuple(int(v) for v in pair_)


def kernel_pair(kernel_size, layer: str) -> tuple[int, int]:
    """Flax's kernel_size of a 2-D conv as a pair. An int is refused: Flax reads kernel_size=k as
    the 1-D kernel (k,), which these 2-D layers would have run as (k, k) on other axes."""
    if _is_int(kernel_size):
        raise ValueError(f"{layer}: kernel_size={kernel_size} is a 1-D kernel in Flax; these "
                         f"layers are 2-D: pass ({kernel_size}, {kernel_size})")
    if kernel_size is None:
        raise ValueError(f"{layer}: kernel_size=None; pass the 2-D kernel size, e.g. (3, 3)")
    return pair(kernel_size, "kernel_size", layer)


def conv_padding(padding, layer: str):
    """Flax's padding forms -> those jax_nvfp4.conv takes ('SAME', 'SAME_LOWER', 'VALID', or
    ((lo, hi), (lo, hi))): an int p pads p on every side, a pair of ints (p_h, p_w) both sides."""
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "SAME_LOWER", "VALID"):
            raise ValueError(f"{layer}: padding={padding!r} is not supported (use 'SAME', "
                             "'SAME_LOWER', 'VALID', an int or explicit pairs)")
        return padding.upper()
    try:
        pads = ((padding, padding),) * 2 if _is_int(padding) else tuple(
            (p, p) if _is_int(p) else tuple(p) for p in padding)
    except TypeError:  # not a sequence of ints and pairs (None, say)
        pads = ()
    if len(pads) != 2 or any(len(p) != 2 or not all(_is_int(v) for v in p) for p in pads):
        raise ValueError(f"{layer}: padding={padding!r} must be 'SAME', 'SAME_LOWER', 'VALID', an "
                         "int, or ints or (lo, hi) pairs of ints for the 2 spatial dims")
    if any(v < 0 for p in pads for v in p):  # Flax crops there; jax_nvfp4.conv does not
        raise ValueError(f"{layer}: negative padding {padding!r} is not supported")
    return pads


def conv(x, kernel, bias, *, in_features: int, strides, padding, dilation, dtype, param_dtype,
         act_quant: bool, act_s_enc, reduce_dtype, layer: str):
    """2-D NHWC convolution for x [..., H, W, in_features] (any number of batch dims, or none).

    kernel: an NVFP4Array [R, S, out, in] (inference) or a float HWIO array [R, S, in, out]
    in Flax's layout (quantization-aware training). dtype rules as `dense`."""
    x, out_dtype = _input(x, dtype, param_dtype, (kernel, bias), in_features, 3, layer)
    reduce_dtype = reduce_dtype_of(reduce_dtype, layer)
    lead = x.shape[:-3]
    x4 = x.reshape(-1, *x.shape[-3:])
    kw = dict(window_strides=strides, padding=padding, rhs_dilation=dilation,
              reduce_dtype=reduce_dtype)
    if isinstance(kernel, NVFP4Array):
        x_in = quantize(x4, s_enc=act_s_enc) if act_quant else x4
        y = nvfp4_conv(x_in, kernel, bias=bias, out_dtype=out_dtype, **kw)
    else:
        y = qat_conv(x4, kernel, bias, quantize_activations=act_quant, act_s_enc=act_s_enc,
                     out_dtype=out_dtype, **kw)
    return y.reshape(*lead, *y.shape[1:])


def group_axis_name(names, layer: str, what: str):
    """One sharding name for several kernel axes flattened into one: the outermost axis's name
    (sharding the outermost axis of a row-major group = sharding the flattened axis in blocks).
    Names on inner axes cannot be carried over and are rejected."""
    names = tuple(names)
    if any(n is not None for n in names[1:]):
        raise ValueError(f"{layer}: {what} axes named {names} are flattened into one NVFP4 axis; "
                         "only the outermost of them may carry a sharding name")
    return names[0] if names else None


def nvfp4_field_names(in_name, out_name, lead=()) -> dict:
    """Sharding names of the NVFP4 fields of a weight whose Flax kernel axes are named
    (*lead, in_name, out_name) (lead: a conv's spatial axes): codes [*lead, out, in]; tiled
    scales [*lead, out tiles, in tiles, 32, 4, 4], so a split into whole 128-row / 64-column
    tiles follows the codes' split; s_dec is replicated."""
    lead = tuple(lead)
    return {"codes": (*lead, out_name, in_name),
            "scales": (*lead, out_name, in_name, None, None, None),
            "s_dec": ()}


def split_kernel_names(names, layer: str):
    """A dense [in, out] or conv [R, S, in, out] kernel's axis names -> (lead, in, out)."""
    names = tuple(names)
    if len(names) not in (2, 4):
        raise ValueError(f"{layer}: kernel sharding names {names} must name the kernel's axes "
                         "([in, out], or [R, S, in, out] for a convolution)")
    return names[:-2], names[-2], names[-1]
