"""Partitioned ragged NVFP4 matmul: y[m] = x[m] @ w[g(m)].T over groups of rows (MoE layers).

Shardings honoured (and combined on meshes of several axes):
  G (expert-parallel)  w's groups (and s_dec's, the bias's), evenly: each shard multiplies the
                       rows its groups hold (group_sizes stays whole: a shard's first row is the
                       sum of the sizes before its groups) and gives zeros elsewhere, so the
                       shards' outputs are summed (psum) in the output dtype, exactly.
  N (column-parallel)  w's rows by whole 128-row scale tiles; y's columns follow; no traffic.
  K (row-parallel)     w's and x's K by whole 64-element scale tiles, when G is not split: the
                       partial sums (float32, or `reduce_dtype`) are all-reduced, then each row's
                       group's bias, the activation and the cast follow, once.
x's rows (M) are not split: the groups index them globally; an M-split x is gathered. A split that
is not whole scale tiles, that does not divide G, or that reuses a mesh axis already taken is
dropped (that operand is resharded explicitly)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_nvfp4 import reference
from jax_nvfp4.primitives.ragged import (group_sizes_operand, operand_names, ragged_batcher,
                                         ragged_matmul_p)
from jax_nvfp4.sharding._partitioned import (Plan, define_partitioned_primitive, local_body,
                                             register_batcher, summed_partials)
from jax_nvfp4.sharding._rules import RuleBuilder
from jax_nvfp4.sharding._specs import (REPLICATED, TILE_K, even_split, k_axes, row_axes,
                                       scale_dims, shard_count, without)
from jax_nvfp4.sharding.matmul import weight_row_factors


class _RaggedOp:
    """ragged_matmul_p(a, [a_scales, a_s_dec,] b_codes, b_scales, b_s_dec, group_sizes,
    first_row, [bias])."""

    OPTIONS = ("reduce_dtype",)

    @staticmethod
    def rule(avals, params):
        names = operand_names(params["a_nvfp4"], params["has_bias"])
        avals = dict(zip(names, avals))
        m, k = avals["a"].shape
        _, n, _ = avals["b_codes"].shape
        b = RuleBuilder()
        k_dim, k_tiles = b.tiled("k", k, TILE_K, reduce=True)
        m_dim = b.replicated("m")
        n_dim, y_n_dim, n_tiles, _ = weight_row_factors(b, n, params["activation"], False)
        g = b.reduced("g")
        mappings = {
            "a": (m_dim, k_dim),
            "a_scales": b.scales(b.replicated("mt") if params["a_nvfp4"] else None, k_tiles),
            "a_s_dec": (),
            "b_codes": (g, n_dim, k_dim),
            "b_scales": (g, *b.scales(n_tiles, k_tiles)),
            "b_s_dec": (g,) if avals["b_s_dec"].ndim else (),
            "group_sizes": (b.replicated("gs"),),
            "first_row": (),
            "bias": (g, n_dim),
        }
        for name in names:
            b.operand(*mappings[name])
        b.result(m_dim, y_n_dim)
        return b.build()

    @staticmethod
    def plan(mesh, dims, avals, params, result_dims=None, reduce_dtype=jnp.dtype(jnp.float32)):
        names = operand_names(params["a_nvfp4"], params["has_bias"])
        dims, avals = dict(zip(names, dims)), dict(zip(names, avals))
        groups, n, k = avals["b_codes"].shape
        # The weight decides G, N and K (x follows it); K only where G is not split.
        g_ax = even_split(mesh, dims["b_codes"][0], groups)
        n_ax = without(row_axes(mesh, dims["b_codes"][1], n), g_ax)
        k_ax = () if g_ax else without(k_axes(mesh, dims["b_codes"][2] or dims["a"][1], k), n_ax)
        operand_dims = {
            "a": [REPLICATED, k_ax],
            "a_scales": scale_dims([], REPLICATED, k_ax),
            "a_s_dec": [],
            "b_codes": [g_ax, n_ax, k_ax],
            "b_scales": scale_dims([g_ax], n_ax, k_ax),
            "b_s_dec": [g_ax] if avals["b_s_dec"].ndim else [],
            "group_sizes": [REPLICATED],
            "first_row": [],
            "bias": [g_ax, n_ax],
        }
        if g_ax:
            body = _expert_parallel_body(names, params, g_ax, groups // shard_count(mesh, g_ax))
        elif k_ax:
            body = _row_parallel_body(names, params, k_ax, reduce_dtype)
        else:
            body = local_body(ragged_matmul_p, params)
        return Plan([operand_dims[name] for name in names], [[REPLICATED, n_ax]], body)

    @staticmethod
    def operands_from_results(dims, avals, params):
        names = operand_names(params["a_nvfp4"], params["has_bias"])
        given = {"a": [REPLICATED, REPLICATED], "b_codes": [REPLICATED, dims[0][1], REPLICATED]}
        return [given.get(name, []) for name in names]


def _expert_parallel_body(names, params, g_ax, local_groups):
    """A shard of the groups: its groups' rows (from the sum of the sizes before them) with the
    whole epilogue, zeros elsewhere, then summed over the shards (one nonzero term a row)."""

    def body(*operands):
        ops = dict(zip(names, operands))
        sizes, m = ops["group_sizes"], ops["a"].shape[0]
        g0 = lax.axis_index(g_ax) * local_groups
        before = jnp.where(jnp.arange(sizes.shape[0]) < g0, jnp.clip(sizes, 0, m), 0)
        ops["first_row"] = ops["first_row"] + jnp.sum(before).astype(jnp.int32)
        ops["group_sizes"] = lax.dynamic_slice(sizes, (g0,), (local_groups,))
        (y,) = ragged_matmul_p.bind(*[ops[name] for name in names], **params)
        return (lax.psum(y, g_ax),)

    return body


def _row_parallel_body(names, params, k_ax, reduce_dtype):
    """A shard of K: its partial products (float32 sums stored in `reduce_dtype`) summed over
    `k_ax`, then in float32 each row's group's bias, the activation and zeros on the rows of no
    group, exactly once."""

    def body(*operands):
        ops = dict(zip(names, operands))
        gemm = [ops[name] for name in names if name != "bias"]
        (partial,) = ragged_matmul_p.bind(*gemm, a_nvfp4=params["a_nvfp4"], has_bias=False,
                                          out_dtype=reduce_dtype, activation="none")
        group, held = reference.ragged_row_groups(ops["group_sizes"], ops["first_row"],
                                                  ops["a"].shape[0])
        y = reference.ragged_epilogue(summed_partials(partial, k_ax), 1.0, ops.get("bias"),
                                      group, held, params["activation"], params["out_dtype"])
        return (y,)

    return body


partitioned_ragged_matmul_p = define_partitioned_primitive(
    "nvfp4_ragged_matmul_partitioned", ragged_matmul_p, _RaggedOp)
register_batcher(partitioned_ragged_matmul_p,
                 ragged_batcher(partitioned_ragged_matmul_p, group_sizes_operand))
