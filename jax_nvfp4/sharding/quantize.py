"""Partitioned quantize / dequantize.

Sharding honoured: any split of the leading dims (even), of the rows R by whole 128-row scale
tiles, and of K by whole 64-element scale tiles; the scales shard with their codes. Any other
split of R or K is resharded to replicated before the op (explicitly, by the partitioner).

Dynamic quantization (no s_enc) gives the bytes of a one-device run: each shard takes the amax
of its elements, the amax is all-reduced (max) over the mesh axes that split the tensor, and
the shard is quantized with the S_enc of the global amax (correctly rounded, as the kernel
divides: reference.encode_scale_from_amax)."""

from __future__ import annotations

from jax import lax

from jax_nvfp4 import reference
from jax_nvfp4.format import TILE_ROWS, rows_and_lead
from jax_nvfp4.primitives.quantize import (dequantize_batcher, dequantize_p, quantize_batcher,
                                             quantize_p)
from jax_nvfp4.sharding._partitioned import (Plan, define_partitioned_primitive, local_body,
                                             register_batcher)
from jax_nvfp4.sharding._rules import RuleBuilder
from jax_nvfp4.sharding._specs import (REPLICATED, TILE_K, even_split, k_axes, row_axes,
                                       scale_dims)


def _tensor_rule(b: RuleBuilder, shape):
    """Factors of an NVFP4 tensor of logical `shape`: (codes mapping, scales mapping, leads)."""
    lead, rows, k = rows_and_lead(shape)
    leads = [f"b{i}" for i in range(len(lead))]
    k_dim, k_tiles = b.tiled("k", k, TILE_K)
    if len(shape) == 1:  # one row: the scales' row-tile dim has no codes counterpart
        return (k_dim,), b.scales(b.replicated("rt"), k_tiles), leads
    r_dim, r_tiles = b.tiled("r", rows, TILE_ROWS)
    return (*leads, r_dim, k_dim), b.scales(*leads, r_tiles, k_tiles), leads


def _tensor_dims(mesh, dims, shape):
    """Honoured sharding of an NVFP4 tensor from its codes' sharding `dims`:
    (codes dims, scales dims)."""
    lead, rows, k = rows_and_lead(shape)
    n = len(lead)
    if len(shape) == 1:
        kd = k_axes(mesh, dims[0], k)
        return [kd], scale_dims([], REPLICATED, kd)
    lead_d = [even_split(mesh, a, s) for a, s in zip(dims[:n], lead)]
    rd, kd = row_axes(mesh, dims[n], rows), k_axes(mesh, dims[n + 1], k)
    return [*lead_d, rd, kd], scale_dims(lead_d, rd, kd)


class _QuantizeOp:
    """quantize_p(x[, s_enc]) -> (codes, scales, s_dec)."""

    @staticmethod
    def rule(avals, params):
        b = RuleBuilder()
        codes, scales, leads = _tensor_rule(b, avals[0].shape)
        g = avals[1].ndim if len(avals) == 2 else 0
        b.operand(*codes)
        if len(avals) == 2:
            b.operand(*leads[:g])
        b.result(*codes)
        b.result(*scales)
        b.result(*leads[:g])
        return b.build()

    @staticmethod
    def plan(mesh, dims, avals, params, result_dims=None):  # results follow the operands
        codes, scales = _tensor_dims(mesh, dims[0], avals[0].shape)
        has_s_enc = len(avals) == 2
        group = codes[: avals[1].ndim] if has_s_enc else []
        split_axes = tuple(a for d in codes for a in d)
        if has_s_enc or not split_axes:
            body = local_body(quantize_p, params)
        else:
            def body(x):
                amax = lax.pmax(reference.tensor_amax(x), split_axes)
                return tuple(quantize_p.bind(x, reference.encode_scale_from_amax(amax)))
        operands = [codes, group] if has_s_enc else [codes]
        return Plan(operands, [codes, scales, group], body)

    @staticmethod
    def operands_from_results(dims, avals, params):
        return [dims[0], dims[0][: avals[1].ndim]] if len(avals) == 2 else [dims[0]]


class _DequantizeOp:
    """dequantize_p(codes, scales, s_dec, dtype=...) -> values."""

    @staticmethod
    def rule(avals, params):
        b = RuleBuilder()
        codes, scales, leads = _tensor_rule(b, avals[0].shape)
        b.operand(*codes)
        b.operand(*scales)
        b.operand(*leads[: avals[2].ndim])
        b.result(*codes)
        return b.build()

    @staticmethod
    def plan(mesh, dims, avals, params, result_dims=None):  # results follow the operands
        codes, scales = _tensor_dims(mesh, dims[0], avals[0].shape)
        group = codes[: avals[2].ndim]

        return Plan([codes, scales, group], [codes], local_body(dequantize_p, params))

    @staticmethod
    def operands_from_results(dims, avals, params):
        return [dims[0], [], []]  # the plan derives the scales' and s_dec's from the codes


partitioned_quantize_p = define_partitioned_primitive(
    "nvfp4_quantize_partitioned", quantize_p, _QuantizeOp)
partitioned_dequantize_p = define_partitioned_primitive(
    "nvfp4_dequantize_partitioned", dequantize_p, _DequantizeOp)


register_batcher(partitioned_quantize_p, quantize_batcher(partitioned_quantize_p))
register_batcher(partitioned_dequantize_p, dequantize_batcher(partitioned_dequantize_p))
