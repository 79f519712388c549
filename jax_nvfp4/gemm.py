"""Public NVFP4 matmul."""

from __future__ import annotations

import math

import jax.numpy as jnp

from jax_nvfp4.format import (BLOCK, GATED_ACTIVATIONS, TILE_ROWS, NVFP4Array, activation_of,
                              checked_activation, checked_bias, checked_output, checked_weight,
                              output_columns, plain_to_tiled, reduce_dtype_of, tiled_to_plain)
from jax_nvfp4.primitives._base import merge_leading, split_as_prefix
from jax_nvfp4.sharding.matmul import partitioned_matmul_p as matmul_p


def _scales_as_matrix(scales, lead, k):
    """Tiled scales of a [*lead, K] tensor -> those of the same data seen as [prod(lead), K]."""
    if len(lead) <= 1:
        return scales  # [K] and [M, K] already have one matrix of scales
    rows = lead[-1]
    if rows % TILE_ROWS == 0:  # whole tiles: the leading dims and the row tiles just merge
        # (sizes given: any may be 0)
        return scales.reshape(math.prod(lead[:-1]) * (rows // TILE_ROWS), *scales.shape[len(lead):])
    plain = tiled_to_plain(scales, rows, k // BLOCK)
    return plain_to_tiled(plain.reshape(-1, k // BLOCK))


def _scales_from_matrix(scales, lead, n):
    """Inverse of _scales_as_matrix for an output [*lead, N]."""
    if len(lead) <= 1:
        return scales
    rows = lead[-1]
    if rows % TILE_ROWS == 0:
        return scales.reshape(*lead[:-1], rows // TILE_ROWS, *scales.shape[1:])
    plain = tiled_to_plain(scales, math.prod(lead), n // BLOCK)
    return plain_to_tiled(plain.reshape(*lead, n // BLOCK))


def interleave_gate_up(gate, up):
    """The weight (or bias) of a gated matmul activation from its two halves: rows of `gate` and
    `up` ([F, ...] each, e.g. a SwiGLU MLP's gate and up projections stored [out, in]) interleaved
    along axis 0 into [2F, ...], row 2j = gate[j], row 2j + 1 = up[j]. Quantize the result:
    `matmul(x, quantize(interleave_gate_up(w_gate, w_up)), activation="swiglu")` is
    silu(x @ w_gate.T) * (x @ w_up.T). The pairs stay whole under any split of its rows into
    even pieces, so a column-parallel (N-sharded) layer needs no regrouping."""
    if isinstance(gate, NVFP4Array) or isinstance(up, NVFP4Array):
        raise TypeError("interleave_gate_up: interleave the float weights, then quantize the result "
                        "(NVFP4 scales come in 128-row tiles, which interleaving would split)")
    gate, up = jnp.asarray(gate), jnp.asarray(up)
    if gate.shape != up.shape or gate.ndim == 0:
        raise ValueError(f"interleave_gate_up: gate and up must have the same shape of at least one "
                         f"axis, got {tuple(gate.shape)} and {tuple(up.shape)}")
    if gate.dtype != up.dtype:
        raise TypeError(f"interleave_gate_up: gate and up must have the same dtype, got {gate.dtype} "
                        f"and {up.dtype}")
    return jnp.stack([gate, up], axis=1).reshape(2 * gate.shape[0], *gate.shape[1:])


def matmul(x, w: NVFP4Array, *, bias=None, activation=None, out_dtype=None, out_s_enc=None,
           reduce_dtype=None):
    """y = act(x @ w.T + bias) with NVFP4 weights: y[..., n] = act(sum_k x[..., k] * w[n, k]
    (+ bias[n])).

    x: a float array [..., K] (float32/bfloat16/float16: "W4A16") or an NVFP4Array [..., K] with a
       scalar s_dec ("W4A4").
    w: NVFP4Array [N, K] (e.g. `quantize(weight)` for a weight stored [out, in]).
    bias: optional [N] float array, added in float32.
    activation: None, "relu", "gelu" (tanh approximation, jax.nn.gelu's default) or "silu",
       applied in float32 to the epilogue value (after alpha and the bias, before the output
       cast or the NVFP4 output quantization), in the kernels' epilogue (formulas:
       jax_nvfp4.reference.activation). Or a gated one, "swiglu" (silu(gate) * up) or "geglu"
       (gelu(gate) * up): N must be even, w's rows are interleaved gate/up pairs (row 2j the gate,
       2j + 1 the up projection of output column j; see interleave_gate_up; the bias too) and y
       has N / 2 columns. Differentiable: the JVP recomputes the float32 pre-activation with a
       second GEMM.
    out_dtype: float dtype of y (default bfloat16); not with out_s_enc.
    out_s_enc: if given (a float32 scalar, finite and positive), y is returned as an NVFP4Array
       quantized with this encode scale straight from the float32 epilogue value (y's columns
       must be a multiple of 16), so a following W4A4 layer needs no float round trip.
    reduce_dtype: where K is split over devices (row-parallel, jax_nvfp4.sharding), the dtype the
       partial products are summed in across them: float32 (default; equal to one device up to
       the order of the sum) or bfloat16 (half the bytes on the links, as Megatron's row-parallel
       layers; each partial product is rounded to bfloat16 first). No effect without a K split.

    Accumulation is float32; s_dec_x * s_dec_w is applied in the epilogue.

    Under jax.vmap a batched x with a shared w folds into M (one GEMM); a batched w (a stack of
    experts or layers, e.g. `jax.vmap(quantize)(weights)`, each with its own s_dec) runs as one
    stacked call that multiplies each element in turn, reading it in place, and under a mesh
    keeps the stack split as w has it (expert parallelism, no gather).

    Differentiable in a float x and in bias. NVFP4 operands (w, an NVFP4 x) are constants: their
    fields, s_dec included, get zero gradients (train weights with jax_nvfp4.flax.qat_matmul)."""
    checked_weight(w, "matmul", "[N, K]", "jax_nvfp4.quantize")
    n, k = w.shape
    x, a_nvfp4 = checked_activation(x, "matmul")
    if x.shape[-1] != k:
        raise ValueError(f"matmul: contracting dims differ: x has shape {tuple(x.shape)} (K="
                         f"{x.shape[-1]}), w has shape {w.shape} (K={k})")
    reduce_dtype = reduce_dtype_of(reduce_dtype, "matmul")
    activation = activation_of(activation, "matmul")
    if activation in GATED_ACTIVATIONS and n % 2:
        raise ValueError(f"matmul: activation={activation!r} pairs w's rows (gate, up), so N must be "
                         f"even, got N={n}")
    cols = output_columns(n, activation)
    bias = checked_bias(bias, n, "matmul")
    out_dtype, out_s_enc = checked_output(out_dtype, out_s_enc, n, activation, "matmul")
    out_nvfp4 = out_s_enc is not None

    lead = tuple(x.shape[:-1])
    if a_nvfp4:  # the scales' leading dims are the codes' (the rows' as tiles)
        a_ops = [merge_leading(x.codes, len(lead)),
                 _scales_as_matrix(split_as_prefix(x.scales, len(lead)), lead, k), x.s_dec]
    else:
        a_ops = [merge_leading(x, len(lead))]
    operands = [*a_ops, w.codes, w.scales, w.s_dec]
    if bias is not None:
        operands.append(bias)
    if out_nvfp4:
        operands.append(out_s_enc)
    outs = matmul_p.bind(*operands, a_nvfp4=a_nvfp4, has_bias=bias is not None,
                         out_nvfp4=out_nvfp4, out_dtype=out_dtype, activation=activation,
                         reduce_dtype=reduce_dtype)
    if out_nvfp4:
        codes, scales, s_dec = outs
        return NVFP4Array(codes.reshape(*lead, cols), _scales_from_matrix(scales, lead, cols), s_dec)
    return outs[0].reshape(*lead, cols)
