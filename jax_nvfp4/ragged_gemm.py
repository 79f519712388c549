"""Public ragged (grouped) NVFP4 matmul: lax.ragged_dot with NVFP4 weights, for MoE layers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_nvfp4 import exact_division
from jax_nvfp4.format import (CODE_DTYPE, GATED_ACTIVATIONS, SCALE_DTYPE, NVFP4Array, activation_of,
                              check_float_dtype, check_not_nvfp4, checked_activation, checked_output,
                              output_columns, reduce_dtype_of, tiled_scales_shape)
from jax_nvfp4.quantization import quantize
from jax_nvfp4.sharding.ragged import partitioned_ragged_matmul_p


def _checked_weight(w):
    if not isinstance(w, NVFP4Array):
        raise TypeError(f"ragged_matmul: w must be an NVFP4Array [G, N, K] (e.g. "
                        f"jax.vmap(jax_nvfp4.quantize) of the experts' [N, K] weights, or "
                        f"jax_nvfp4.quantize of the [G, N, K] stack), got {type(w).__name__}")
    w.validate("ragged_matmul: w")
    if w.ndim != 3 or w.s_dec.shape not in ((), w.shape[:1]):
        raise ValueError(f"ragged_matmul: w must be a 3-D [G, N, K] NVFP4Array with s_dec of shape "
                         f"() or ({w.shape[0] if w.ndim == 3 else 'G'},), got shape {w.shape} "
                         f"with s_dec shape {tuple(w.s_dec.shape)}")
    if w.shape[0] == 0:
        raise ValueError(f"ragged_matmul: w {w.shape} has no groups (G = 0); it needs at least one")


def _checked_group_sizes(group_sizes, groups: int):
    check_not_nvfp4(group_sizes, "ragged_matmul: group_sizes", "it counts rows", "an integer array")
    if not isinstance(group_sizes, jax.Array):  # NumPy or a list: kept as is (int64) until clipped
        group_sizes = np.asarray(group_sizes)
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"ragged_matmul: group_sizes must be an integer array, got {group_sizes.dtype}")
    if group_sizes.shape != (groups,):
        raise ValueError(f"ragged_matmul: group_sizes must have shape ({groups},) (one size per group "
                         f"of w), got {tuple(group_sizes.shape)}")
    # Clipped before the cast (a size past int32 would wrap): sizes count as 0 to int32's max.
    high = np.iinfo(np.int32).max
    if isinstance(group_sizes, jax.Array):
        return jnp.clip(group_sizes, 0, min(high, jnp.iinfo(group_sizes.dtype).max)).astype(jnp.int32)
    return jnp.asarray(np.clip(group_sizes, 0, high).astype(np.int32))


def _checked_bias(bias, groups: int, n: int):
    if bias is None:
        return None
    check_not_nvfp4(bias, "ragged_matmul: bias", "biases stay float")
    bias = jnp.asarray(bias)
    check_float_dtype(bias.dtype, "ragged_matmul: bias")
    if bias.shape != (groups, n):
        raise ValueError(f"ragged_matmul: bias must have shape ({groups}, {n}) (one row per group; "
                         f"broadcast a shared one with jnp.broadcast_to), got {tuple(bias.shape)}")
    return bias


def ragged_matmul(x, w: NVFP4Array, group_sizes, *, bias=None, activation=None, out_dtype=None,
                  out_s_enc=None, reduce_dtype=None):
    """Grouped matmul with NVFP4 weights (lax.ragged_dot's semantics): the rows of x come in
    consecutive groups, group g's group_sizes[g] rows after group g - 1's, and row m of group g
    gives y[m, n] = act(sum_k x[m, k] * w[g, n, k] (+ bias[g, n])). Rows past the groups' total
    are zero. A mixture-of-experts layer sorts its tokens by expert and calls this once.

    x: float [M, K] (float32/bfloat16/float16: "W4A16") or an NVFP4Array [M, K] with a scalar
       s_dec ("W4A4").
    w: NVFP4Array [G, N, K] (G experts' [out, in] weights) with s_dec of shape (G,) (e.g.
       `jax.vmap(jax_nvfp4.quantize)(weights)`, one encode scale per expert) or ().
    group_sizes: integer [G] (a device array: jit does not specialize on it). Negative sizes count
       as 0, sizes past int32's range as its maximum; rows past M are dropped.
    bias: optional float [G, N], group g's added to its rows, in float32.
    activation: None or one of matmul's ("relu", "gelu", "silu", or gated "swiglu"/"geglu" with
       interleaved gate/up rows in each w[g]; see interleave_gate_up), in the epilogue.
    out_dtype: float dtype of y [M, N] (N / 2 with a gated activation); default bfloat16; not
       with out_s_enc.
    out_s_enc: if given (a float32 scalar, finite and positive), y is returned as an NVFP4Array
       quantized with this encode scale from the float32 epilogue value (y's columns must be a
       multiple of 16; rows of no group are zero codes), so the next expert layer can run W4A4:
       `ragged_matmul(h, w2, group_sizes)` on it. It is the float32 product then
       jax_nvfp4.quantize, as matmul's sm_90a path does in one call (two launches either way).
    reduce_dtype: the dtype of the partial sums where K is split over devices (as in matmul).

    On Hopper (sm_90a) one kernel launch runs every group's rows and reads only the weights of
    the groups that hold rows (at decode, the experts the tokens were routed to): 8-row tiles at
    few rows a group, wgmma tiles past that. On Blackwell (sm_100a; K a multiple of 32, N of 4)
    CUTLASS's grouped block-scaled GEMM runs them, a float x quantized first as matmul does there
    (compiled, never run: docs/gemm_blackwell.md). On other GPUs and shapes XLA's ragged_dot runs
    on the weights' e2m1 x e4m3 values in x's dtype instead. Under a mesh, w split along G runs expert-parallel
    (each device its experts' rows, then one sum), along N column-parallel, along K row-parallel
    (jax_nvfp4.sharding.ragged). jax.vmap over x and group_sizes (a routing per element) runs
    one call over the whole batch, each expert's weights read once; batched weights or bias, or an
    NVFP4 x, run one call an element. Differentiable in a float x and in bias, to any order and
    under vmap (jacfwd, jacrev, hessian, per-example grads): the tangent products run through
    XLA's ragged_dot in bfloat16 on the dequantized weights. NVFP4 operands are constants; an
    NVFP4 output (a rounding step) is not differentiable."""
    _checked_weight(w)
    groups, n, k = w.shape
    x, a_nvfp4 = checked_activation(x, "ragged_matmul")
    if x.ndim != 2:
        raise ValueError(f"ragged_matmul: x must be [M, K] (rows grouped along M), got shape "
                         f"{tuple(x.shape)}")
    if x.shape[1] != k:
        raise ValueError(f"ragged_matmul: contracting dims differ: x has shape {tuple(x.shape)} (K="
                         f"{x.shape[1]}), w has shape {w.shape} (K={k})")
    group_sizes = _checked_group_sizes(group_sizes, groups)
    bias = _checked_bias(bias, groups, n)
    activation = activation_of(activation, "ragged_matmul")
    if activation in GATED_ACTIVATIONS and n % 2:
        raise ValueError(f"ragged_matmul: activation={activation!r} pairs w's rows (gate, up), so N "
                         f"must be even, got N={n}")
    out_dtype, out_s_enc = checked_output(out_dtype, out_s_enc, n, activation, "ragged_matmul")
    a_ops = [x.codes, x.scales, x.s_dec] if a_nvfp4 else [x]
    operands = [*a_ops, w.codes, w.scales, w.s_dec, group_sizes, jnp.zeros((), jnp.int32)]
    if bias is not None:
        operands.append(bias)
    out_nvfp4 = out_s_enc is not None
    cols = output_columns(n, activation)
    if out_nvfp4 and cols == 0:  # no columns to quantize: an empty NVFP4Array, as matmul gives
        shape = (x.shape[0], 0)
        return NVFP4Array(jnp.zeros(shape, CODE_DTYPE), jnp.zeros(tiled_scales_shape(shape), SCALE_DTYPE),
                          exact_division.divide(1.0, out_s_enc))
    (y,) = partitioned_ragged_matmul_p.bind(
        *operands, a_nvfp4=a_nvfp4, has_bias=bias is not None,
        out_dtype=jnp.dtype(jnp.float32) if out_nvfp4 else out_dtype, activation=activation,
        reduce_dtype=reduce_dtype_of(reduce_dtype, "ragged_matmul"))
    return quantize(y, s_enc=out_s_enc) if out_nvfp4 else y
