"""Partitioned NVFP4-weight convolution: batch- and output-channel-parallel.

Shardings honoured: the images N (any even split) and the output channels K (the weight's
[R, S, K, C] rows, by whole 128-row scale tiles), together on meshes of several axes. Neither
needs communication. The spatial dims (a split needs halo exchange), the filter taps and the
input channels C stay whole: other splits of them are resharded to replicated explicitly."""

from __future__ import annotations


from jax_nvfp4.format import TILE_ROWS
from jax_nvfp4.primitives.conv import conv_batcher, conv_p
from jax_nvfp4.sharding._partitioned import Plan, define_partitioned_primitive, register_batcher
from jax_nvfp4.sharding._rules import RuleBuilder
from jax_nvfp4.sharding._specs import REPLICATED, even_split, row_axes, scale_dims, without

_R = REPLICATED


class _ConvOp:
    """conv_p(x, [x_scales, x_s_dec,] w_codes, w_scales, w_s_dec, [bias])."""

    @staticmethod
    def _layout(avals, params):
        n_x = 3 if params["x_nvfp4"] else 1
        return n_x, avals[n_x].shape[2]  # (index of w_codes, output channels K)

    @staticmethod
    def rule(avals, params):
        n_x, k = _ConvOp._layout(avals, params)
        b = RuleBuilder()
        rep = b.replicated
        k_dim, k_tiles = b.tiled("k", k, TILE_ROWS)
        x = ("n", rep("h"), rep("w"), rep("c"))
        b.operand(*x)
        if params["x_nvfp4"]:
            b.operand("n", "h", *b.scales(rep("wt"), rep("ct")))
            b.operand()
        b.operand(rep("r"), rep("s"), k_dim, "c")
        b.operand("r", "s", *b.scales(k_tiles, "ct"))
        b.operand()
        if params["has_bias"]:
            b.operand(k_dim)
        b.result("n", rep("p"), rep("q"), k_dim)
        return b.build()

    @staticmethod
    def plan(mesh, dims, avals, params, result_dims=None):  # results follow the operands
        n_x, k = _ConvOp._layout(avals, params)
        k_ax = row_axes(mesh, dims[n_x][2], k)
        n_ax = without(even_split(mesh, dims[0][0], avals[0].shape[0]), k_ax)
        operands = [[n_ax, _R, _R, _R]]
        if params["x_nvfp4"]:
            operands += [scale_dims([n_ax, _R], _R, _R), []]
        operands += [[_R, _R, k_ax, _R], scale_dims([_R, _R], k_ax, _R), []]
        if params["has_bias"]:
            operands.append([k_ax])

        def body(*local):
            return tuple(conv_p.bind(*local, **params))

        return Plan(operands, [[n_ax, _R, _R, k_ax]], body)

    @staticmethod
    def operands_from_results(dims, avals, params):
        n_x, _ = _ConvOp._layout(avals, params)
        n_ax, _, _, k_ax = dims[0]
        out = [[]] * len(avals)
        out[0] = [n_ax, _R, _R, _R]
        out[n_x] = [_R, _R, k_ax, _R]
        return out


partitioned_conv_p = define_partitioned_primitive("nvfp4_conv_partitioned", conv_p, _ConvOp)

register_batcher(partitioned_conv_p, conv_batcher(partitioned_conv_p))
