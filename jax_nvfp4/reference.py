"""Pure-JAX reference of every op: the CPU path and the oracle for every kernel.

Quantization follows the recipe of docs/quantize.md (Numerics) operation by operation in float32
(the CUDA kernels produce the same bytes). Its divisions are correctly rounded on every backend
(jax_nvfp4.exact_division: XLA:GPU's float32 division is not). XLA may fold a float32 -> e4m3 ->
float32 round trip away (TransformerEngine hit this), so the E4M3 scale passes through an
optimization barrier before it is widened.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_nvfp4 import exact_division
from jax_nvfp4.format import (BLOCK, CODE_DTYPE, SCALE_DTYPE, plain_to_tiled, rows_and_lead,
                              tiled_to_plain)

E2M1_MAX = 6.0
E4M3_MAX = 448.0
FLT_MAX = float(np.finfo(np.float32).max)
E4M3_NAN_BITS = 0x7F


def tensor_amax(x, group_ndim: int = 0):
    """max |x| over the finite elements, per group of the first `group_ndim` dims (0 for an
    empty group, as for an all-zero one)."""
    x = x.astype(jnp.float32)
    mag = jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0)
    return jnp.max(mag, axis=tuple(range(group_ndim, x.ndim)), initial=0.0)


def encode_scale_from_amax(amax):
    """S_enc = 6*448/amax, or 1 where that is not a finite positive number (amax == 0 too)."""
    amax = jnp.asarray(amax, jnp.float32)
    s_enc = exact_division.divide(E2M1_MAX * E4M3_MAX, amax)
    bad = (amax == 0) | ~jnp.isfinite(s_enc) | (s_enc == 0)
    return jnp.where(bad, jnp.float32(1.0), s_enc)


def _e4m3_nan():
    return lax.bitcast_convert_type(jnp.uint8(E4M3_NAN_BITS), SCALE_DTYPE)


def _blocks(x):
    """[..., K] -> [..., K/16, 16] float32."""
    return x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def quantize(x, s_enc=None):
    """Reference quantization of float `x` [..., R, K] -> (codes, tiled scales, s_dec).

    `s_enc` (float32) is a scalar or has the shape of a prefix of x's leading dims (one encode
    scale per group of rows); None computes it from the tensor's amax."""
    if s_enc is None:
        s_enc = encode_scale_from_amax(tensor_amax(x))
    s_enc = jnp.asarray(s_enc, jnp.float32)
    g = s_enc.ndim
    s_dec = exact_division.divide(1.0, s_enc)
    # Broadcast the per-group scalars over [..., K/16] blocks.
    expand = (Ellipsis,) + (None,) * (x.ndim - g)
    s_enc_b, s_dec_b = s_enc[expand], s_dec[expand]

    blocks = _blocks(x)                                             # [..., KB, 16]
    finite = jnp.all(jnp.isfinite(blocks), axis=-1)                 # [..., KB]
    block_amax = jnp.max(jnp.where(jnp.isfinite(blocks), jnp.abs(blocks), 0.0), axis=-1)
    sb_f32 = block_amax * (s_enc_b * jnp.float32(1.0 / 6.0))
    sb = jnp.minimum(sb_f32, jnp.float32(E4M3_MAX)).astype(SCALE_DTYPE)  # rn, satfinite
    sb = jnp.where(finite, sb, _e4m3_nan())
    sb = lax.optimization_barrier(sb)  # keep the E4M3 rounding (see module docstring)
    sb_wide = sb.astype(jnp.float32)

    mult = jnp.minimum(exact_division.divide(1.0, sb_wide * s_dec_b), jnp.float32(FLT_MAX))
    scaled = jnp.clip(blocks * mult[..., None], -E2M1_MAX, E2M1_MAX)
    codes = jnp.where(finite[..., None], scaled, 0.0).astype(CODE_DTYPE)  # rn, ties to even
    codes = codes.reshape(x.shape)

    plain = sb if x.ndim >= 2 else sb.reshape(1, -1)
    return codes, plain_to_tiled(plain), s_dec


def block_scales_f32(scales, shape):
    """Tiled scales of a tensor of logical `shape` -> float32 [..., K/16] (plain, widened)."""
    lead, rows, k = rows_and_lead(shape)
    plain = tiled_to_plain(scales, rows, k // BLOCK)
    return plain.reshape(tuple(shape[:-1]) + (k // BLOCK,)).astype(jnp.float32)


def scaled_codes(codes, scales):
    """e2m1(code) * e4m3(scale) in float32 [..., K]: exact, and the operand the MMA sees."""
    sb = block_scales_f32(scales, codes.shape)
    vals = _blocks(codes) * sb[..., None]
    return vals.reshape(codes.shape)


def dequantize(codes, scales, s_dec, dtype=jnp.bfloat16):
    """Reference dequantization: e2m1(code) * e4m3(scale) * s_dec, in float32, then `dtype`."""
    s_dec = jnp.asarray(s_dec, jnp.float32)
    expand = (Ellipsis,) + (None,) * (codes.ndim - s_dec.ndim)
    return (scaled_codes(codes, scales) * s_dec[expand]).astype(dtype)


_SQRT_2_OVER_PI = 0.7978845608028654


@jax.custom_jvp
def _silu(y):
    return y / (1.0 + jnp.exp(-y))


@_silu.defjvp
def _silu_jvp(primals, tangents):
    # The quotient rule on y / (1 + exp(-y)) gives inf / inf = NaN once exp(-y) overflows
    # (y < -88.7); with s = sigmoid(y) the derivative s (1 + y (1 - s)) goes to 0 there.
    (y,), (t,) = primals, tangents
    s = jax.nn.sigmoid(y)
    return _silu(y), t * (s * (1.0 + y * (1.0 - s)))


def activation(y, name: str):
    """The GEMM epilogue's activation of a float32 y, with the kernels' formulas
    (cuda/common/activation.cuh): relu = y < 0 ? 0 : y (NaN stays NaN, -0 stays -0), gelu in its
    tanh approximation (jax.nn.gelu's default) 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))),
    silu = y / (1 + exp(-y)); "none" is the identity. The gated ones pair y's last axis
    (interleaved: 2j the gate, 2j + 1 the up value) into half as many columns:
    swiglu = silu(gate) * up, geglu = gelu(gate) * up."""
    if name == "none":
        return y
    if name == "relu":
        return jnp.where(y < 0, jnp.zeros_like(y), y)
    if name == "gelu":
        return 0.5 * y * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * (y * y * y))))
    if name == "silu":
        return _silu(y)
    if name in ("swiglu", "geglu"):
        gate, up = y[..., 0::2], y[..., 1::2]
        return activation(gate, "silu" if name == "swiglu" else "gelu") * up
    raise ValueError(f"unknown activation {name!r}")


def matmul(a, b_codes, b_scales, b_s_dec, *, a_scales=None, a_s_dec=None, bias=None,
           activation_name="none", out_dtype=jnp.bfloat16):
    """out[m, n] = act(alpha * sum_k a[m, k] * b[n, k] (+ bias)), in float32, then `out_dtype`
    (a gated act halves the columns).

    `a` is float [M, K] (W4A16) or float4 codes with `a_scales`/`a_s_dec` (W4A4). The block-scaled
    products are exact in float32; alpha = s_dec_a * s_dec_b is applied after the sum, then the
    bias and the activation `activation_name` (see `activation`), as the kernels' epilogue does."""
    if a.dtype == CODE_DTYPE:
        a_vals, alpha = scaled_codes(a, a_scales), a_s_dec * b_s_dec
    else:
        a_vals, alpha = a.astype(jnp.float32), b_s_dec
    acc = jnp.dot(a_vals, scaled_codes(b_codes, b_scales).T,
                  precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    out = acc * jnp.asarray(alpha, jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return activation(out, activation_name).astype(out_dtype)


def conv(x, w_codes, w_scales, w_s_dec, *, x_scales=None, x_s_dec=None, bias=None,
         window_strides=(1, 1), padding=((0, 0), (0, 0)), rhs_dilation=(1, 1),
         out_dtype=jnp.bfloat16):
    """NHWC convolution with NVFP4 weights [R, S, K, C] (quantized along C), in float32:
    out[n, p, q, k] = alpha * sum_{r, s, c} x[n, h, w, c] * w[r, s, k, c] (+ bias[k]).

    `x` is float [N, H, W, C] or float4 codes with `x_scales`/`x_s_dec` (NVFP4 activations);
    padding is explicit ((lo, hi), (lo, hi)). alpha = s_dec_x * s_dec_w comes after the sum, as
    in the kernels' epilogue."""
    if x.dtype == CODE_DTYPE:
        x_vals, alpha = scaled_codes(x, x_scales), x_s_dec * w_s_dec
    else:
        x_vals, alpha = x.astype(jnp.float32), w_s_dec
    acc = lax.conv_general_dilated(
        x_vals, scaled_codes(w_codes, w_scales), tuple(window_strides), tuple(padding),
        rhs_dilation=tuple(rhs_dilation), dimension_numbers=("NHWC", "HWOI", "NHWC"),
        precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    out = acc * jnp.asarray(alpha, jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(out_dtype)


def ragged_segments(group_sizes, first_row, m: int):
    """Where each group's rows end, and where group 0's begin, among `m` rows: group g holds the
    group_sizes[g] rows after group g - 1's, group 0's from row `first_row` (clipped to [0, m]);
    negative sizes count as 0 and rows past m are dropped (the ragged GEMM kernel's rule).
    Returns (first, ends) as int32, ends [G] nondecreasing and at most m."""
    sizes = jnp.clip(group_sizes.astype(jnp.int32), 0, m)  # clipped to m: the sum cannot overflow
    first = jnp.clip(jnp.asarray(first_row, jnp.int32), 0, m)
    # The running sum as a triangular one (G x G, G the experts): a jnp.cumsum in a primitive's
    # per-platform lowering aborts XLA:CPU's compile of a module exported for both "cpu" and
    # "cuda" (jax 0.11.2; a CHECK in its computation partitioner, as openxla/xla#47373).
    groups = jnp.arange(sizes.shape[0])
    upto = groups[:, None] >= groups[None, :]
    running = jnp.sum(jnp.where(upto, sizes, 0), axis=1, dtype=jnp.int32)
    return first, jnp.minimum(first + running, m)


def ragged_row_groups(group_sizes, first_row, m: int):
    """(group, held) for each of `m` rows (`ragged_segments`): the group holding the row (clipped
    to the last group where none does) and whether one does."""
    first, ends = ragged_segments(group_sizes, first_row, m)
    rows = jnp.arange(m, dtype=jnp.int32)
    group = jnp.searchsorted(ends, rows, side="right")  # the first group ending past the row
    held = (rows >= first) & (group < ends.shape[0])
    return jnp.minimum(group, ends.shape[0] - 1), held


def _ragged_dot_groups(group_sizes, first_row, m: int):
    """(counts, group, held) for lax.ragged_dot over `m` rows: counts [G] put every row in a
    group, the rows of none joining group 0 (those before it) or the last (those after), which
    the callers zero; group and held as ragged_row_groups gives them."""
    first, ends = ragged_segments(group_sizes, first_row, m)
    counts = ends - jnp.concatenate([first[None], ends[:-1]])
    counts = counts.at[0].add(first).at[-1].add(m - ends[-1])
    return (counts, *ragged_row_groups(group_sizes, first_row, m))


def ragged_epilogue(acc, alpha, bias, group, held, activation_name, out_dtype):
    """The ragged GEMM's epilogue on its float32 sums `acc` [M, N]: alpha (a scalar or [G]) and
    bias ([G, N] or None) of each row's group, the activation, zeros on rows of no group."""
    alpha = jnp.asarray(alpha, jnp.float32)
    out = acc * (alpha[group][:, None] if alpha.ndim else alpha)
    if bias is not None:
        out = out + bias.astype(jnp.float32)[group]
    out = activation(out, activation_name)
    return jnp.where(held[:, None], out, 0.0).astype(out_dtype)


def ragged_matmul(a, b_codes, b_scales, b_s_dec, group_sizes, first_row=0, *, a_scales=None,
                  a_s_dec=None, bias=None, activation_name="none", out_dtype=jnp.bfloat16,
                  compute_dtype=jnp.float32):
    """out[m] = act(alpha_g * a[m] @ b[g].T (+ bias[g])) with g the group of row m
    (`ragged_segments`), rows of no group zero; b [G, N, K] NVFP4 (b_s_dec [G] or a scalar),
    bias [G, N] or None; `a` float [M, K] or float4 codes with `a_scales`/`a_s_dec`.

    The products run through lax.ragged_dot_general on e2m1 * e4m3 values in `compute_dtype`
    (exact in bfloat16 too; float32 uses HIGHEST precision), against the [G, N, K] weights as they
    are (no copy but the dequantized one), alpha = s_dec_a * s_dec_b[g] after the sum, then the
    bias and the activation, as the kernels' epilogue does."""
    m = a.shape[0]
    if a.dtype == CODE_DTYPE:
        a_vals, a_alpha = scaled_codes(a, a_scales), jnp.asarray(a_s_dec, jnp.float32)
    else:
        a_vals, a_alpha = a.astype(jnp.float32), jnp.float32(1.0)
    counts, group, held = _ragged_dot_groups(group_sizes, first_row, m)
    lhs = jnp.where(held[:, None], a_vals, 0.0).astype(compute_dtype)
    rhs = scaled_codes(b_codes, b_scales).astype(compute_dtype)
    dims = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [2]), ([], [])),
                                         lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
    precision = lax.Precision.HIGHEST if compute_dtype == jnp.float32 else None
    acc = lax.ragged_dot_general(lhs, rhs, counts, dims, precision=precision,
                                 preferred_element_type=jnp.float32)
    return ragged_epilogue(acc, a_alpha * jnp.asarray(b_s_dec, jnp.float32), bias, group, held,
                           activation_name, out_dtype)


def ragged_matmul_transposed(ct, b_codes, b_scales, b_s_dec, group_sizes, first_row=0, *,
                             compute_dtype=jnp.bfloat16):
    """The transpose of ragged_matmul in a float `a` (no bias, no activation): d_a[m] =
    s_dec_b[g] * ct[m] @ b[g] for the rows of a group g, zero elsewhere; float32 [M, K]."""
    counts, group, held = _ragged_dot_groups(group_sizes, first_row, ct.shape[0])
    alpha = jnp.asarray(b_s_dec, jnp.float32)
    alpha = alpha[group][:, None] if alpha.ndim else alpha
    lhs = jnp.where(held[:, None], ct.astype(jnp.float32) * alpha, 0.0).astype(compute_dtype)
    rhs = scaled_codes(b_codes, b_scales).astype(compute_dtype)
    dims = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [1]), ([], [])),
                                         lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
    precision = lax.Precision.HIGHEST if compute_dtype == jnp.float32 else None
    return lax.ragged_dot_general(lhs, rhs, counts, dims, precision=precision,
                                  preferred_element_type=jnp.float32)
