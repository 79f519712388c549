"""Partitioned NVFP4-weight convolution: batch-, output-channel- and input-channel-parallel.

Shardings honoured, together on meshes of several axes:
  N  the images (any even split): no communication.
  K  the output channels (the weight's [R, S, K, C] rows, by whole 128-row scale tiles): no
     communication.
  C  the input channels, the contracting axis (the weight's and x's C, by whole 64-element scale
     tiles; x follows the weight): each shard convolves its C slice in float32 (alpha applies to
     every partial sum, which is linear), the partial sums are all-reduced (psum) in
     `reduce_dtype` (float32, or bfloat16 for half the bytes), and the bias and the output cast
     follow, once. Where the partitioner asks for y's images split over the C axes too (after
     x's batch axes), or y's output channels (after the weight's K axes), the partial sums are
     reduce-scattered (psum_scatter) along that dimension instead.
The spatial dims (a split needs halo exchange) and the filter taps stay whole: other splits of
them are resharded to replicated explicitly."""

from __future__ import annotations

import jax.numpy as jnp

from jax_nvfp4.format import TILE_ROWS
from jax_nvfp4.primitives.conv import conv_batcher, conv_p
from jax_nvfp4.primitives._stacking import stacked_batcher
from jax_nvfp4.sharding._partitioned import (Plan, define_partitioned_primitive, local_body,
                                             register_batcher, summed_partials)
from jax_nvfp4.sharding._rules import RuleBuilder
from jax_nvfp4.sharding._stacked import define_stacked_primitive
from jax_nvfp4.sharding._specs import (REPLICATED, TILE_K, even_split, k_axes, row_axes,
                                       scale_dims, scatters, without)

_R = REPLICATED


class _ConvOp:
    """conv_p(x, [x_scales, x_s_dec,] w_codes, w_scales, w_s_dec, [bias])."""

    OPTIONS = ("reduce_dtype",)

    @staticmethod
    def _layout(avals, params):
        n_x = 3 if params["x_nvfp4"] else 1
        return n_x, avals[n_x].shape[2], avals[n_x].shape[3]  # (index of w_codes, K, C)

    @staticmethod
    def rule(avals, params):
        n_x, k, c = _ConvOp._layout(avals, params)
        b = RuleBuilder()
        rep = b.replicated
        k_dim, k_tiles = b.tiled("k", k, TILE_ROWS)
        c_dim, c_tiles = b.tiled("c", c, TILE_K, reduce=True)
        b.operand("n", rep("h"), rep("w"), c_dim)
        if params["x_nvfp4"]:
            b.operand("n", "h", *b.scales(rep("wt"), c_tiles))
            b.operand()
        b.operand(rep("r"), rep("s"), k_dim, c_dim)
        b.operand("r", "s", *b.scales(k_tiles, c_tiles))
        b.operand()
        if params["has_bias"]:
            b.operand(k_dim)
        b.result("n", rep("p"), rep("q"), k_dim)
        return b.build()

    @staticmethod
    def plan(mesh, dims, avals, params, result_dims=None, reduce_dtype=jnp.dtype(jnp.float32)):
        n_x, k, c = _ConvOp._layout(avals, params)
        w_dims = dims[n_x]
        k_ax = row_axes(mesh, w_dims[2], k)
        c_ax = without(k_axes(mesh, w_dims[3] or dims[0][3], c), k_ax)
        batch = avals[0].shape[0]
        n_ax = without(even_split(mesh, dims[0][0], batch), k_ax + c_ax)
        # y's images or output channels asked split over the C axes as well: reduce-scatter.
        scatter = None
        if c_ax and result_dims is not None:
            y_n, y_k = result_dims[0][0], result_dims[0][3]
            if scatters(mesh, y_n, n_ax, c_ax, batch, even_split):
                scatter = 0
            elif scatters(mesh, y_k, k_ax, c_ax, k, even_split):
                scatter = 3
        y_n_ax = n_ax + c_ax if scatter == 0 else n_ax
        y_k_ax = k_ax + c_ax if scatter == 3 else k_ax
        operands = [[n_ax, _R, _R, c_ax]]
        if params["x_nvfp4"]:
            operands += [scale_dims([n_ax, _R], _R, c_ax), []]
        operands += [[_R, _R, k_ax, c_ax], scale_dims([_R, _R], k_ax, c_ax), []]
        if params["has_bias"]:
            operands.append([y_k_ax])  # added after the sum, to y's channels
        if c_ax:
            body = _input_channel_parallel_body(params, c_ax, reduce_dtype, scatter)
        else:
            body = local_body(conv_p, params)
        return Plan(operands, [[y_n_ax, _R, _R, y_k_ax]], body)

    @staticmethod
    def stack_leader(params):
        """The operand whose stacked sharding a stacked conv follows: the weight's codes."""
        return 3 if params["x_nvfp4"] else 1

    @staticmethod
    def operands_from_results(dims, avals, params):
        n_x, _, _ = _ConvOp._layout(avals, params)
        n_ax, _, _, k_ax = dims[0]
        out = [[]] * len(avals)
        out[0] = [n_ax, _R, _R, _R]
        out[n_x] = [_R, _R, k_ax, _R]
        return out


def _input_channel_parallel_body(params, c_ax, reduce_dtype, scatter):
    """C-split shard: partial convolution of this C slice (accumulated in float32, stored in
    `reduce_dtype`), summed over `c_ax` (psum, or, with `scatter` a dimension of y,
    psum_scatter), then in float32 the bias and the output cast exactly once."""

    def body(*local):
        operands, bias = (local[:-1], local[-1]) if params["has_bias"] else (local, None)
        (partial,) = conv_p.bind(*operands, **{**params, "has_bias": False,
                                               "out_dtype": reduce_dtype})
        y = summed_partials(partial, c_ax, bias, scatter)
        return (y.astype(params["out_dtype"]),)

    return body


partitioned_conv_p = define_partitioned_primitive("nvfp4_conv_partitioned", conv_p, _ConvOp)

stacked_conv_p = define_stacked_primitive("nvfp4_conv_stacked", partitioned_conv_p, conv_p, _ConvOp)

register_batcher(partitioned_conv_p,
                 conv_batcher(partitioned_conv_p, stacked_batcher(stacked_conv_p)))
