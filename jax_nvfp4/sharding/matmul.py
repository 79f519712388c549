"""Partitioned NVFP4 matmul: y[m, n] = sum_k x[m, k] * w[n, k].

Shardings honoured (and combined on meshes of several axes):
  M (data-parallel)    x's rows; by whole 128-row tiles when x or y is NVFP4.
  N (column-parallel)  w's rows by whole 128-row scale tiles; y's columns follow; no traffic.
                       With a gated activation y's column j is w's rows 2j, 2j + 1: a tile of
                       w's rows is 64 of y's columns, and every pair stays on one shard.
  K (row-parallel)     w's and x's K by whole 64-element scale tiles: each shard multiplies its
                       K slice in float32 (alpha = s_dec_x * s_dec_w applies to every partial
                       sum, which is linear), the partial sums are all-reduced (psum) in
                       `reduce_dtype` (float32, or bfloat16 for half the bytes), and the
                       bias, the activation and the cast (or the NVFP4 output quantization)
                       follow, once. Where
                       the partitioner asks for y's rows split over the K axes too (after x's
                       row axes), or y's columns (after w's row axes), the partial sums are
                       reduce-scattered (psum_scatter) along that dimension instead.
The weight's sharding wins: x is resharded to match w's K split (a weight replicated along K is
sliced locally to x's split instead), so no weight is gathered. A split that is not whole scale tiles, or that reuses a mesh axis already
taken by another dimension, is dropped (that operand is resharded explicitly)."""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.custom_partitioning import CompoundFactor

from jax_nvfp4 import reference
from jax_nvfp4.format import GATED_ACTIVATIONS, TILE_ROWS, output_columns
from jax_nvfp4.primitives.matmul import matmul_batcher, matmul_p
from jax_nvfp4.primitives.quantize import quantize_p
from jax_nvfp4.primitives._stacking import stacked_batcher
from jax_nvfp4.sharding._partitioned import (Plan, define_partitioned_primitive, local_body,
                                             register_batcher, summed_partials)
from jax_nvfp4.sharding._rules import RuleBuilder
from jax_nvfp4.sharding._stacked import define_stacked_primitive
from jax_nvfp4.sharding._specs import (REPLICATED, TILE_K, even_split, k_axes, row_axes,
                                       scale_dims, scatters, without)

_SCALARS = ()  # mapping of a scalar operand


def _operand_names(a_nvfp4, has_bias, out_nvfp4):
    names = ["a"] + (["a_scales", "a_s_dec"] if a_nvfp4 else [])
    names += ["b_codes", "b_scales", "b_s_dec"]
    names += ["bias"] if has_bias else []
    names += ["out_s_enc"] if out_nvfp4 else []
    return names


def weight_row_factors(b, n: int, activation: str, out_nvfp4: bool):
    """The Shardy factors of a weight's N rows, in `b` (a RuleBuilder): (mapping of w's N dim,
    of y's column dim, of w's scale row tiles, of an NVFP4 y's scale column tiles or None)."""
    whole_n_tiles = n % TILE_ROWS == 0 and n // TILE_ROWS > 1
    if activation in GATED_ACTIVATIONS:
        # y's column j is w's rows 2j, 2j + 1: N = (nt, nq, gu) with nq = 64 and gu = 2, y's
        # columns (nt, nq), and an NVFP4 y's 64-column scale tiles are nt as well.
        if whole_n_tiles:
            n_dim = b.compound("nt", ("nq", TILE_K), ("gu", 2))
            return n_dim, CompoundFactor("nt", "nq"), "nt", "nt"
        n_dim, y_n_dim, n_tiles = (b.replicated(f) for f in ("n", "f", "nt"))
        return n_dim, y_n_dim, n_tiles, b.replicated("fk") if out_nvfp4 else None
    if out_nvfp4:
        # N is both w's rows (128-row tiles) and y's K (64-element tiles): N = (nt, nh, nq)
        # with nh = 2, nq = 64, so the y scales' tile dim is the compound (nt, nh).
        if whole_n_tiles:
            n_dim = b.compound("nt", ("nh", 2), ("nq", TILE_K))
            return n_dim, n_dim, "nt", CompoundFactor("nt", "nh")
        n_dim, n_tiles, y_n_tiles = (b.replicated(f) for f in ("n", "nt", "nk"))
        return n_dim, n_dim, n_tiles, y_n_tiles
    n_dim, n_tiles = b.tiled("n", n, TILE_ROWS)
    return n_dim, n_dim, n_tiles, None


class _MatmulOp:
    """matmul_p(a, [a_scales, a_s_dec,] b_codes, b_scales, b_s_dec, [bias,] [out_s_enc])."""

    OPTIONS = ("reduce_dtype",)

    @staticmethod
    def rule(avals, params):
        a_nvfp4, out_nvfp4 = params["a_nvfp4"], params["out_nvfp4"]
        names = _operand_names(a_nvfp4, params["has_bias"], out_nvfp4)
        m, k = avals[0].shape
        n = avals[names.index("b_codes")].shape[0]
        b = RuleBuilder()
        k_dim, k_tiles = b.tiled("k", k, TILE_K, reduce=True)
        if a_nvfp4 or out_nvfp4:  # M carries scale tiles
            m_dim, m_tiles = b.tiled("m", m, TILE_ROWS)
        else:
            m_dim, m_tiles = "m", None
        n_dim, y_n_dim, n_tiles, y_n_tiles = weight_row_factors(b, n, params["activation"], out_nvfp4)
        mappings = {
            "a": (m_dim, k_dim),
            "a_scales": b.scales(m_tiles, k_tiles),
            "a_s_dec": _SCALARS,
            "b_codes": (n_dim, k_dim),
            "b_scales": b.scales(n_tiles, k_tiles),
            "b_s_dec": _SCALARS,
            "bias": (n_dim,),
            "out_s_enc": _SCALARS,
        }
        for name in names:
            b.operand(*mappings[name])
        b.result(m_dim, y_n_dim)
        if out_nvfp4:
            b.result(*b.scales(m_tiles, y_n_tiles))
            b.result(*_SCALARS)
        return b.build()

    @staticmethod
    def plan(mesh, dims, avals, params, result_dims=None, reduce_dtype=jnp.dtype(jnp.float32)):
        a_nvfp4, has_bias, out_nvfp4 = params["a_nvfp4"], params["has_bias"], params["out_nvfp4"]
        names = _operand_names(a_nvfp4, has_bias, out_nvfp4)
        a_dims, b_dims = dims[0], dims[names.index("b_codes")]
        m, k = avals[0].shape
        n = avals[names.index("b_codes")].shape[0]
        # The weight decides N and K (x follows it); M takes the axes left.
        n_ax = row_axes(mesh, b_dims[0], n)
        k_ax = without(k_axes(mesh, b_dims[1] or a_dims[1], k), n_ax)
        m_split = row_axes if (a_nvfp4 or out_nvfp4) else even_split
        m_ax = without(m_split(mesh, a_dims[0], m), n_ax + k_ax)

        # Row-parallel with y's rows (sequence-parallel layers) or columns asked split further
        # over the K axes: reduce-scatter the partial sums along that dimension instead of
        # all-reducing them. Where y is NVFP4, only in whole scale tiles.
        scatter = None
        if k_ax and result_dims is not None:
            y_rows, y_cols = result_dims[0][:2]
            if scatters(mesh, y_rows, m_ax, k_ax, m, row_axes if out_nvfp4 else even_split):
                scatter = 0
            elif scatters(mesh, y_cols, n_ax, k_ax, output_columns(n, params["activation"]),
                          k_axes if out_nvfp4 else even_split):
                scatter = 1
        y_m_ax = m_ax + k_ax if scatter == 0 else m_ax
        y_n_ax = n_ax + k_ax if scatter == 1 else n_ax

        operand_dims = {
            "a": [m_ax, k_ax],
            "a_scales": scale_dims([], m_ax, k_ax),
            "a_s_dec": [],
            "b_codes": [n_ax, k_ax],
            "b_scales": scale_dims([], n_ax, k_ax),
            "b_s_dec": [],
            "bias": [y_n_ax],  # added after the sum, to y's columns (gated: their pairs)
            "out_s_enc": [],
        }
        results = [[y_m_ax, y_n_ax]]
        if out_nvfp4:
            results += [scale_dims([], y_m_ax, y_n_ax), []]
        if k_ax:
            body = _row_parallel_body(names, params, k_ax, scatter, reduce_dtype)
        else:  # whole dot products on every shard
            body = local_body(matmul_p, params)
        return Plan([operand_dims[name] for name in names], results, body)

    @staticmethod
    def stack_leader(params):
        """The operand whose stacked sharding a stacked matmul follows: the weight's codes."""
        return 3 if params["a_nvfp4"] else 1

    @staticmethod
    def operands_from_results(dims, avals, params):
        names = _operand_names(params["a_nvfp4"], params["has_bias"], params["out_nvfp4"])
        m_ax, n_ax = dims[0]
        given = {"a": [m_ax, REPLICATED], "b_codes": [n_ax, REPLICATED]}
        return [given.get(name, []) for name in names]


def _row_parallel_body(names, params, k_ax, scatter, reduce_dtype):
    """Row-parallel shard: partial product of this K slice (accumulated in float32, stored in
    `reduce_dtype`), summed over `k_ax` (psum, or, with `scatter` a dimension of y, psum_scatter,
    which leaves each shard its slice of that dimension), then in float32 the bias, the activation
    (reference.activation, the kernels' formulas) and the output conversion exactly once."""

    def body(*operands):
        ops = dict(zip(names, operands))
        gemm_operands = [ops[n] for n in names if n not in ("bias", "out_s_enc")]
        (partial,) = matmul_p.bind(*gemm_operands, a_nvfp4=params["a_nvfp4"], has_bias=False,
                                   out_nvfp4=False, out_dtype=reduce_dtype, activation="none")
        y = reference.activation(summed_partials(partial, k_ax, ops.get("bias"), scatter),
                                 params["activation"])
        if params["out_nvfp4"]:
            return tuple(quantize_p.bind(y, ops["out_s_enc"]))
        return (y.astype(params["out_dtype"]),)

    return body


partitioned_matmul_p = define_partitioned_primitive(
    "nvfp4_matmul_partitioned", matmul_p, _MatmulOp)

stacked_matmul_p = define_stacked_primitive("nvfp4_matmul_stacked", partitioned_matmul_p, matmul_p,
                                            _MatmulOp)

register_batcher(partitioned_matmul_p,
                 matmul_batcher(partitioned_matmul_p, stacked_batcher(stacked_matmul_p)))
