"""Shared machinery for defining a primitive with a CUDA kernel path and a reference path."""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.extend
import jax.numpy as jnp
from jax import lax
from jax._src import dispatch
from jax.interpreters import ad, mlir
from jax.sharding import PartitionSpec

from jax_nvfp4 import _extension

try:  # public home of ShapedArray differs across jax releases
    from jax.core import ShapedArray
except ImportError:  # pragma: no cover
    from jax._src.core import ShapedArray

__all__ = ["ShapedArray", "define_primitive", "ffi_kernel_call", "batch_size", "to_front",
           "map_batcher", "empty_f32", "on_auto_axes", "zero_like", "is_zero",
           "typed_like"]


def _no_elements(ctx) -> bool:
    """Whether an operand or result of the call being lowered has no elements (an empty batch,
    zero rows or columns): a degenerate problem, which every path gives the reference's result."""
    return any(0 in aval.shape for aval in (*ctx.avals_in, *ctx.avals_out))


def define_primitive(name, *, abstract_eval, reference, kernel, ffi_target, multiple_results=True):
    """Creates primitive `name`.

    abstract_eval(*avals, **params) -> aval(s).
    reference(*args, **params)      pure-JAX implementation (CPU and fallback lowering, and the
                                    CUDA lowering of a call with an empty operand or result).
    kernel(*args, **params)         implementation through jax.ffi.ffi_call (CUDA lowering).
    ffi_target(**params) -> str     the FFI target the kernel path calls.
    """
    prim = jax.extend.core.Primitive(name)
    prim.multiple_results = multiple_results
    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    prim.def_abstract_eval(abstract_eval)

    reference_rule = mlir.lower_fun(reference, multiple_results=multiple_results)
    kernel_rule = mlir.lower_fun(kernel, multiple_results=multiple_results)
    mlir.register_lowering(prim, reference_rule)

    def cuda_rule(ctx, *args, **params):
        target = ffi_target(**params)
        if _no_elements(ctx):  # nothing to launch; the reference still sets s_dec and the like
            return reference_rule(ctx, *args, **params)
        if _extension.kernel_available(target):
            return kernel_rule(ctx, *args, **params)
        _extension.warn_reference_fallback(target)
        return reference_rule(ctx, *args, **params)

    mlir.register_lowering(prim, cuda_rule, platform="cuda")
    return prim


def ffi_kernel_call(target, result_types, *operands, workspace=None, **attrs):
    """jax.ffi.ffi_call of `target` returning `result_types` (a list of ShapeDtypeStruct).

    A target that needs device scratch memory takes it as one more uint8 result, sized here by
    the extension for these shapes and the visible GPU (unless the caller knows it: `workspace`
    bytes), and dropped from what this returns. Attributes whose choice depends on the GPU beyond
    its compute capability are settled first (_extension.settled_attrs)."""
    attrs = _extension.settled_attrs(target, operands, result_types, attrs)
    nbytes = workspace if workspace is not None else _extension.workspace_bytes(
        target, operands, result_types, attrs)
    types = list(result_types)
    if nbytes is not None:
        types.append(jax.ShapeDtypeStruct((nbytes,), jnp.uint8))
    outs = jax.ffi.ffi_call(target, types)(*operands, **attrs)
    return outs[:len(result_types)]


def batch_size(args, dims) -> int:
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def to_front(x, dim, size):
    """Moves batch dim `dim` of x to axis 0, broadcasting when x is not batched."""
    if dim is None:
        return jnp.broadcast_to(x, (size,) + x.shape)
    return jnp.moveaxis(x, dim, 0)


def map_batcher(prim):
    """A batching rule that runs the primitive once per batch element (lax.map): correct for
    any combination of batched operands; primitives use it for the cases they cannot fold."""

    def rule(args, dims, **params):
        mapped = [d is not None for d in dims]
        xs = [jnp.moveaxis(a, d, 0) for a, d, m in zip(args, dims, mapped) if m]

        def one(slices):
            it = iter(slices)
            return prim.bind(*[next(it) if m else a for a, m in zip(args, mapped)], **params)

        outs = lax.map(one, xs)
        if prim.multiple_results:
            return outs, [0] * len(outs)
        return outs, 0

    return rule


def on_auto_axes(fn):
    """`fn`, run with a mesh's Explicit axes made Auto (its results typed replicated). On Explicit axes `vmap` wants every mapped operand split alike along the
    mapped dimension, and `lax.map` (the vmap of a primitive with no stacked form, conv, over a
    stacked weight) refuses to loop over a split one: a stacked twin's unpartitioned trace and
    its per-element tangents run through this (a partitioned stack runs per shard, on its local
    elements)."""

    def run(*args):
        if not jax.sharding.get_abstract_mesh().explicit_axes:
            return fn(*args)
        return jax.sharding.auto_axes(fn, out_sharding=PartitionSpec())(*args)

    return run


def split_as_prefix(a, count: int):
    """`a`, resharded where needed so that of its first `count` dims only a prefix is split. On
    Explicit axes JAX merges split dims into one only then (P("dp", "sp", None) but not
    P(None, "sp", None): a device's part of the latter is not whole rows of the merged dim). The
    later splits are dropped (those dims gathered), as GSPMD does on Auto axes."""
    if not jax.sharding.get_abstract_mesh().explicit_axes:
        return a
    spec = tuple(jax.typeof(a).sharding.spec)
    spec += (None,) * (a.ndim - len(spec))
    split = [e not in (None, ()) for e in spec[:count]]
    prefix = split.index(False) if False in split else count
    if not any(split[prefix:]):
        return a
    return jax.sharding.reshard(a, PartitionSpec(*spec[:prefix], *(None,) * (count - prefix),
                                                 *spec[count:]))


def merge_leading(a, count: int):
    """`a` with its first `count` dims merged into one (split_as_prefix first)."""
    a = split_as_prefix(a, count)
    return a.reshape(math.prod(a.shape[:count]), *a.shape[count:])


def zero_like(x):
    """A symbolic zero tangent for primal value x."""
    return ad.Zero(jax.typeof(x).to_tangent_aval())


def is_zero(t) -> bool:
    """Whether `t` is a symbolic zero tangent or cotangent."""
    return type(t) is ad.Zero


def typed_like(value, aval):
    """`value` resharded to the sharding in `aval`'s type. Under a mesh with Explicit axes every
    array's type carries its sharding, and a cotangent must match its primal's; the NVFP4
    primitives' outputs carry none (nor do results computed on Auto axes), so a cotangent
    computed from them is resharded here."""
    spec = getattr(getattr(aval, "sharding", None), "spec", None)
    if spec is None or all(p is None for p in spec):
        return value
    return jax.sharding.reshard(value, spec)


def empty_f32():
    """A zero-size float32 operand standing for an absent optional FFI argument."""
    return jnp.zeros((0,), jnp.float32)


def env_choice(env: str, choices: dict):
    """The value of `choices` (an FFI attribute, or a path's name) that environment variable `env`
    names ("" and "auto" mean the launcher's own choice). Raises ValueError naming an unknown value."""
    value = os.environ.get(env, "")
    if value not in choices:
        raise ValueError(f"{env} must be one of {sorted(k for k in choices if k)} (or unset), got {value!r}")
    return choices[value]
