"""The ragged (grouped) NVFP4 GEMM primitive: lax.ragged_dot with NVFP4 weights, for MoE layers.

ragged_matmul_p.bind(a, [a_scales, a_s_dec,] b_codes, b_scales, b_s_dec, group_sizes, first_row,
                     [bias,] a_nvfp4=..., has_bias=..., out_dtype=..., activation=...)
    a            float [M, K] (W4A16) or float4 codes [M, K] (W4A4, then a_scales/a_s_dec follow)
    b_*          the weights [G, N, K]: codes, tiled scales, s_dec [G] or a scalar
    group_sizes  int32 [G];  first_row  int32 scalar (0 unless a shard of the groups runs:
                 reference.ragged_segments says which rows each group holds)
    bias         optional [G, N], any float dtype
    out          float [M, C] of out_dtype, rows of no group zero; C = N, or N / 2 with a gated
                 activation

FFI target "jax_nvfp4_gemm_ragged" (cuda/gemm/gemm_ffi.cc) on sm_90a, one launch reading only
the weights of groups that hold rows: the decode kernel over every group's 8-row tiles, or from
16 rows a group on average the fused_ws kernel (wgmma) over each group's rows staged in 64-, 128-
or 256-row tiles; the launcher picks (cuda/gemm/sm90/gemm_sm90.h). On an H200 it beat XLA's
path at every M measured (bench/results/ragged_h200_2026-11-29.md). On sm_100a (K a multiple of
32, N of 4, a concrete M) CUTLASS's grouped block-scaled tcgen05 GEMM over the groups' rows, a
float x quantized first with its dynamic amax as sm_100a's matmul does (docs/gemm_blackwell.md;
compiled and statically checked, never run). On GPUs without a kernel, and for other shapes, the
CUDA lowering is XLA's:
the weights' e2m1 x e4m3 values in x's dtype (exact in bfloat16 and float16) and
lax.ragged_dot_general, then the reference's epilogue.
"""

from __future__ import annotations

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax._src import dispatch
from jax.interpreters import ad, batching, mlir

from jax_nvfp4 import _extension, reference
from jax_nvfp4.format import SCALE_DTYPE, output_columns, tiled_scales_shape
from jax_nvfp4.primitives._base import (ShapedArray, batch_size, define_primitive, empty_f32,
                                        env_choice, ffi_kernel_call, is_zero, map_batcher,
                                        merge_leading, to_front, zero_like)
from jax_nvfp4.primitives.matmul import ACTIVATION_CODES

RAGGED_TARGET = "jax_nvfp4_gemm_ragged"

# JAX_NVFP4_RAGGED_PATH forces one CUDA path (tests and benchmarks): "kernel" (the FFI target, its
# launcher choosing the kernel), "decode", "fused_ws_64", "fused_ws" or "fused_ws_256" (that
# kernel on tiles of 64, 128 or 256 rows), "xla"; read when a call is lowered, like
# JAX_NVFP4_GEMM_SM90_PATH.
RAGGED_PATH_ENV = "JAX_NVFP4_RAGGED_PATH"
# The FFI target's path attribute (GemmPath, cuda/gemm/gemm_problem.h).
_KERNEL_PATHS = {"decode": 1, "fused_ws_64": 7, "fused_ws": 4, "fused_ws_256": 6}
_PATHS = {name: name for name in ("auto", "kernel", "xla", *_KERNEL_PATHS)} | {"": "auto"}


def operand_names(a_nvfp4: bool, has_bias: bool) -> list[str]:
    """The names of ragged_matmul_p's operands, in order."""
    names = ["a"] + (["a_scales", "a_s_dec"] if a_nvfp4 else [])
    names += ["b_codes", "b_scales", "b_s_dec", "group_sizes", "first_row"]
    return names + (["bias"] if has_bias else [])


def _unpack(args, a_nvfp4, has_bias):
    """Names the variadic operands: returns a dict with None for the absent ones."""
    ops = dict.fromkeys(operand_names(True, True))
    ops.update(zip(operand_names(a_nvfp4, has_bias), args))
    return ops


def _abstract(*args, a_nvfp4, has_bias, out_dtype, activation):
    ops = _unpack(args, a_nvfp4, has_bias)
    for name, codes in (("a", ops["a"] if a_nvfp4 else None), ("b", ops["b_codes"])):
        if codes is not None and tuple(ops[f"{name}_scales"].shape) != tiled_scales_shape(codes.shape):
            raise ValueError(f"nvfp4_ragged_matmul: {name}_scales has shape "
                             f"{ops[name + '_scales'].shape}; codes of shape {codes.shape} need "
                             f"{tiled_scales_shape(codes.shape)}")
    groups, n, _ = ops["b_codes"].shape
    if ops["group_sizes"].shape != (groups,) or ops["group_sizes"].dtype != jnp.int32:
        raise ValueError(f"nvfp4_ragged_matmul: group_sizes must be int32 ({groups},), got "
                         f"{ops['group_sizes'].dtype} {ops['group_sizes'].shape}")
    return (ShapedArray((ops["a"].shape[0], output_columns(n, activation)), out_dtype),)


def _computed(ops, out_dtype, activation, compute_dtype):
    """reference.ragged_matmul on the named operands, its products in `compute_dtype`."""
    return (reference.ragged_matmul(
        ops["a"], ops["b_codes"], ops["b_scales"], ops["b_s_dec"], ops["group_sizes"],
        ops["first_row"], a_scales=ops["a_scales"], a_s_dec=ops["a_s_dec"], bias=ops["bias"],
        activation_name=activation, out_dtype=out_dtype, compute_dtype=compute_dtype),)


def _reference(*args, a_nvfp4, has_bias, out_dtype, activation):
    ops = _unpack(args, a_nvfp4, has_bias)
    return _computed(ops, out_dtype, activation, jnp.float32)


def _xla(ops, a_nvfp4, out_dtype, activation):
    """The CUDA lowering without the kernel: ragged_dot in x's float dtype (bfloat16 for an NVFP4
    x, whose e2m1 x e4m3 values it holds exactly)."""
    compute = jnp.bfloat16 if a_nvfp4 else ops["a"].dtype
    return _computed(ops, out_dtype, activation, compute)


def ragged_path() -> str:
    """The CUDA path RAGGED_PATH_ENV names: "auto", "kernel", "xla" or a kernel's."""
    return env_choice(RAGGED_PATH_ENV, _PATHS)


def sm100_takes(m, n: int, k: int) -> bool:
    """Whether sm_100a's grouped kernel runs a ragged call of these dimensions: rows of k codes
    and of n float32 results 16 bytes apart (TMA), and a concrete M (its workspace holds M rows)."""
    return isinstance(m, int) and k % 32 == 0 and n % 4 == 0


def _kernel(*args, a_nvfp4, has_bias, out_dtype, activation):
    ops = _unpack(args, a_nvfp4, has_bias)
    m = ops["a"].shape[0]
    n, k = ops["b_codes"].shape[1], ops["a"].shape[1]
    path = ragged_path()
    arch = _extension.visible_cuda_arch()
    if arch == "sm_100a" and path in _KERNEL_PATHS:
        raise ValueError(f"{RAGGED_PATH_ENV}={path!r} forces an sm_90a kernel; this GPU is sm_100a, "
                         "which has one ragged kernel (\"kernel\" or \"auto\")")
    if path == "xla" or arch not in ("sm_90a", "sm_100a") or (
            arch == "sm_100a" and not sm100_takes(m, n, k)):
        return _xla(ops, a_nvfp4, out_dtype, activation)
    # A symbolic M (jax.export) takes sm_90a's decode kernel, which runs any M (its grid is sized
    # per call) without a workspace (fused_ws's holds M staged rows).
    symbolic = not isinstance(m, int)
    if symbolic:
        path = "decode"
    out = jax.ShapeDtypeStruct((m, output_columns(n, activation)), out_dtype)
    return ffi_kernel_call(
        RAGGED_TARGET, [out],
        ops["a"],
        ops["a_scales"] if a_nvfp4 else jnp.zeros((0,), SCALE_DTYPE),
        ops["a_s_dec"] if a_nvfp4 else jnp.ones((), jnp.float32),
        ops["b_codes"], ops["b_scales"], ops["b_s_dec"],
        ops["bias"] if has_bias else empty_f32(),
        empty_f32(),  # out_s_enc: the output is float
        ops["group_sizes"], ops["first_row"],
        workspace=0 if symbolic else None, path=np.int64(_KERNEL_PATHS.get(path, 0)),
        activation=np.int64(ACTIVATION_CODES[activation]))


def _fold_plan(sizes, first_row, m: int):
    """How a batch of B ragged problems over `m` rows each (sizes [B, G], first_row [B]) folds
    into one over B * m rows: group 0's rows of every element, then group 1's, and so on.
    Returns (total [G], the folded problem's group sizes; place [B, m], each row's folded row;
    held [B, m], whether a group holds the row; order [B * m], each folded row's row in the
    flattened batch (0 past the total, rows the call zeroes)). Sums of comparisons, a gather and
    one scatter: no sort, no loop, a few fused kernels."""
    batch, groups = sizes.shape
    first, ends = jax.vmap(reference.ragged_segments, (0, 0, None))(sizes, first_row, m)
    starts = jnp.concatenate([first[:, None], ends[:, :-1]], axis=1)
    counts = ends - starts
    total = counts.sum(0, dtype=jnp.int32)  # group_sizes' dtype, also where x64 would widen it
    offset = jnp.cumsum(total) - total  # group g's first folded row
    before = jnp.cumsum(counts, axis=0) - counts  # group g's rows in the elements before
    rows = jnp.arange(m, dtype=jnp.int32)
    group = jnp.sum(ends[:, None, :] <= rows[None, :, None], axis=2, dtype=jnp.int32)
    held = (rows >= first[:, None]) & (group < groups)
    g = jnp.minimum(group, groups - 1)
    in_element = lambda table: jnp.take_along_axis(table, g, axis=1)  # noqa: E731
    place = offset[g] + in_element(before) + rows - in_element(starts)
    flat = jnp.arange(batch * m, dtype=jnp.int32)
    order = jnp.zeros_like(flat).at[jnp.where(held, place, batch * m).reshape(-1)].set(
        flat, mode="drop", unique_indices=True)
    return total, place, held, order


def ragged_batcher(prim, sizes_at):
    """A batching rule for a ragged primitive whose operand 0 holds the rows and operands
    `sizes_at(params)` and the one after it group_sizes and first_row. Where only those three are
    batched (and the rows are floats), the batch folds into one call over all its rows, each
    group's rows of every element together (_fold_plan), and the results go back in place: the
    weights of a group are read once for the whole batch, not once an element. Any other
    batching (the weights, the bias, an NVFP4 x whose scales are tiled over rows) runs the
    primitive once per element (map_batcher)."""
    per_element = map_batcher(prim)

    def rule(args, dims, **params):
        at = sizes_at(params)
        if params.get("a_nvfp4") or any(d is not None for i, d in enumerate(dims)
                                         if i not in (0, at, at + 1)):
            return per_element(args, dims, **params)
        size = batch_size(args, dims)
        rows = to_front(args[0], dims[0], size)
        batch, m = rows.shape[:2]
        total, place, held, order = _fold_plan(to_front(args[at], dims[at], size),
                                               to_front(args[at + 1], dims[at + 1], size), m)
        folded = list(args)
        folded[0] = merge_leading(rows, 2)[order]
        folded[at], folded[at + 1] = total, jnp.zeros((), jnp.int32)
        out = prim.bind(*folded, **params)
        unfold = lambda y: jnp.where(held[..., None], y[place], 0)  # noqa: E731
        if prim.multiple_results:
            return [unfold(y) for y in out], [0] * len(out)
        return unfold(out), 0

    return rule


ragged_matmul_p = define_primitive(
    "nvfp4_ragged_matmul", abstract_eval=_abstract, reference=_reference, kernel=_kernel,
    ffi_target=lambda **_: RAGGED_TARGET)


def group_sizes_operand(params) -> int:
    """Where group_sizes is among ragged_matmul_p's operands (first_row follows it)."""
    return operand_names(params["a_nvfp4"], params["has_bias"]).index("group_sizes")


batching.primitive_batchers[ragged_matmul_p] = ragged_batcher(ragged_matmul_p, group_sizes_operand)


# --------------------------------------------------------------------------- tangent products
# The JVP of ragged_matmul_p (primitives/autodiff.py) multiplies x's tangent by the weights, and
# its transpose multiplies the cotangent by the transposed weights. Both are primitives of their
# own, lowered to XLA's ragged_dot in bfloat16 (float32 sums) on every platform: so they batch
# (ragged_batcher: XLA's ragged_dot has no batching rule past its leading dimension), and each
# is the other's transpose (jacrev, hessian). Operands: the float tangent [M, K] or cotangent
# [M, N], then b_codes, b_scales, b_s_dec, group_sizes, first_row; result float32.

_TANGENT_SIZES_AT = 4  # group_sizes, after the rows and the weights' codes, scales and s_dec


def _tangent_abstract(t, b_codes, *_):
    return ShapedArray((t.shape[0], b_codes.shape[1]), jnp.float32)


def _cotangent_abstract(ct, b_codes, *_):
    return ShapedArray((ct.shape[0], b_codes.shape[2]), jnp.float32)


def _tangent_product(t, b_codes, b_scales, b_s_dec, group_sizes, first_row):
    return reference.ragged_matmul(t, b_codes, b_scales, b_s_dec, group_sizes, first_row,
                                   out_dtype=jnp.float32, compute_dtype=jnp.bfloat16)


def _cotangent_product(ct, b_codes, b_scales, b_s_dec, group_sizes, first_row):
    return reference.ragged_matmul_transposed(ct, b_codes, b_scales, b_s_dec, group_sizes,
                                              first_row)


def _linear_primitive(name, abstract_eval, product):
    prim = jax.extend.core.Primitive(name)
    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, mlir.lower_fun(product, multiple_results=False))
    batching.primitive_batchers[prim] = ragged_batcher(prim, lambda _: _TANGENT_SIZES_AT)
    return prim


ragged_tangent_p = _linear_primitive("nvfp4_ragged_tangent", _tangent_abstract, _tangent_product)
ragged_cotangent_p = _linear_primitive("nvfp4_ragged_cotangent", _cotangent_abstract,
                                       _cotangent_product)


def _linear_in_first(prim, other):
    """JVP and transpose of `prim`, linear in its first operand, whose transpose is `other`."""

    def jvp(primals, tangents):
        out = prim.bind(*primals)
        if is_zero(tangents[0]):
            return out, zero_like(out)
        return out, prim.bind(tangents[0], *primals[1:])

    def transpose(ct, t, *weights):
        if is_zero(ct):
            return [ad.Zero(t.aval)] + [None] * len(weights)
        return [other.bind(ct, *weights).astype(t.aval.dtype)] + [None] * len(weights)

    ad.primitive_jvps[prim] = jvp
    ad.primitive_transposes[prim] = transpose


_linear_in_first(ragged_tangent_p, ragged_cotangent_p)
_linear_in_first(ragged_cotangent_p, ragged_tangent_p)
