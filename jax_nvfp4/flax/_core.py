"""What the nnx and linen layers share: argument checks, the forward pass, kernel quantization
and the mapping of a float kernel's sharding names onto the NVFP4 fields."""

from __future__ import annotations

import math

import jax.numpy as jnp

from jax_nvfp4.format import BLOCK, NVFP4Array, check_float_dtype
from jax_nvfp4.gemm import matmul
from jax_nvfp4.primitives.autodiff import qat_matmul
from jax_nvfp4.quantization import quantize


def check_in_features(in_features, layer: str) -> None:
    """The contracting size must hold whole 16-element NVFP4 blocks."""
    if not isinstance(in_features, int) or in_features <= 0 or in_features % BLOCK:
        raise ValueError(f"{layer}: in_features={in_features!r} must be a positive multiple of "
                         f"{BLOCK} (NVFP4 quantizes the input axis in blocks of {BLOCK})")


def check_out_features(out_features, layer: str) -> None:
    if not isinstance(out_features, int) or out_features <= 0:
        raise ValueError(f"{layer}: out features {out_features!r} must be a positive int")


def check_act_quant(act_quant: bool, act_s_enc, layer: str) -> None:
    """act_s_enc (a calibrated static activation encode scale) needs act_quant=True."""
    if act_s_enc is None:
        return
    if not act_quant:
        raise ValueError(f"{layer}: act_s_enc={act_s_enc!r} is given but act_quant=False; "
                         "a static activation scale only applies to W4A4 (act_quant=True)")
    if not (isinstance(act_s_enc, (int, float)) and math.isfinite(act_s_enc) and act_s_enc > 0):
        raise ValueError(f"{layer}: act_s_enc must be a finite positive float, got {act_s_enc!r}")


def activation_s_enc(samples) -> float:
    """A static activation encode scale calibrated on `samples`: 6*448 / max|samples|, the
    scale dynamic W4A4 would derive from them (pass it as a layer's `act_s_enc`)."""
    from jax_nvfp4.reference import encode_scale_from_amax, tensor_amax

    return float(encode_scale_from_amax(tensor_amax(jnp.asarray(samples))))


def quantize_kernel(kernel) -> NVFP4Array:
    """A Flax float kernel [in, out] -> the NVFP4 weight [N=out, K=in] (K blocked by 16)."""
    return quantize(jnp.asarray(kernel).T)


def dense(x, kernel, bias, *, in_features: int, dtype, param_dtype, act_quant: bool, act_s_enc,
          layer: str):
    """y = x @ W^T + bias for x [..., in_features].

    kernel: an NVFP4Array [out, in] (inference) or a float array [in, out] in Flax's layout
    (quantization-aware training: quantized here, straight-through gradients).
    The output dtype is `dtype`, else that Flax's Dense would give: x's promoted with
    param_dtype. With `dtype` given, x is cast to it first."""
    x = jnp.asarray(x)
    check_float_dtype(x.dtype, f"{layer}: input")
    if x.ndim < 1 or x.shape[-1] != in_features:
        raise ValueError(f"{layer}: input of shape {tuple(x.shape)} does not end in "
                         f"in_features={in_features}")
    if dtype is not None:
        x = x.astype(dtype)
        out_dtype = jnp.dtype(dtype)
    else:
        out_dtype = jnp.result_type(x.dtype, param_dtype)
    if isinstance(kernel, NVFP4Array):
        x_in = quantize(x, s_enc=act_s_enc) if act_quant else x
        return matmul(x_in, kernel, bias=bias, out_dtype=out_dtype)
    return qat_matmul(x, kernel.T, bias, quantize_activations=act_quant, act_s_enc=act_s_enc,
                      out_dtype=out_dtype)


def group_axis_name(names, layer: str, what: str):
    """One sharding name for several kernel axes flattened into one: the outermost axis's name
    (sharding the outermost axis of a row-major group = sharding the flattened axis in blocks).
    Names on inner axes cannot be carried over and are rejected."""
    names = tuple(names)
    if any(n is not None for n in names[1:]):
        raise ValueError(f"{layer}: {what} axes named {names} are flattened into one NVFP4 axis; "
                         "only the outermost of them may carry a sharding name")
    return names[0] if names else None


def nvfp4_field_names(in_name, out_name) -> dict:
    """Sharding names of the NVFP4 fields of a weight whose Flax kernel axes are named
    (in_name, out_name): codes [out, in]; tiled scales [out tiles, in tiles, 32, 4, 4], so a
    split into whole 128-row / 64-column tiles follows the codes' split; s_dec is replicated."""
    return {"codes": (out_name, in_name),
            "scales": (out_name, in_name, None, None, None),
            "s_dec": ()}
