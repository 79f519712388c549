"""Stacked forms of primitives: one bind for a `vmap` over a stack of weights.

A primitive's stacked form takes its operands with a leading stacked dimension on those flagged
in the parameter `stacked` (a bool per operand; the others are shared by every element) and
gives every result that leading dimension. Its rules here are generic over the unstacked
primitive `inner`: abstract eval from `inner`'s, vmap binding it once (`stacked_batcher`), and
JVP and transpose from `inner`'s own rules under vmap over the stack."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching
from jax.sharding import PartitionSpec

from jax_nvfp4.primitives._base import batch_size, map_batcher, to_front


def on_auto_axes(fn):
    """`fn`, run with a mesh's Explicit axes made Auto (results typed replicated, as the outer
    primitives' are). `vmap` of a primitive with no stacked form (conv) over a stacked weight runs
    `lax.map`, which refuses to loop over a dimension split on Explicit axes. Only unpartitioned
    computations and tangents need this; a partitioned stack runs per shard, on its local
    elements."""

    def run(*args):
        if not jax.sharding.get_abstract_mesh().explicit_axes:
            return fn(*args)
        return jax.sharding.auto_axes(fn, out_sharding=PartitionSpec())(*args)

    return run


def element_aval(aval):
    """The aval of one element of a stack (its type's sharding without the stacked dim)."""
    spec = PartitionSpec(*aval.sharding.spec[1:])
    return aval.update(shape=aval.shape[1:], sharding=aval.sharding.update(spec=spec))


def stacked_aval(aval, size):
    """A stack of `size` elements of `aval`; like the other outer primitives' results, its
    type does not carry the sharding the partitioner gives it."""
    spec = PartitionSpec(None, *aval.sharding.spec)
    return aval.update(shape=(size, *aval.shape), sharding=aval.sharding.update(spec=spec))


def stacked_batcher(prim):
    """A vmap rule binding the stacked twin `prim` once: the batched operands' batch dimension
    moved to the front, the others left as they are (not broadcast)."""

    def rule(args, dims, **params):
        size = batch_size(args, dims)
        stacked = tuple(d is not None for d in dims)
        operands = [to_front(a, d, size) if s else a for a, d, s in zip(args, dims, stacked)]
        outs = prim.bind(*operands, stacked=stacked, **params)
        if prim.multiple_results:
            return outs, [0] * len(outs)
        return outs, 0

    return rule


def _is_zero(t) -> bool:
    return type(t) is ad.Zero


def stacked_jvp(outer, inner, inner_params, primals, tangents, *, stacked, **params):
    """The primal partitioned (`outer`); the tangent from `inner`'s own JVP rule under vmap over
    the stack, like the unstacked outer primitives (outside the partitioning rules). Symbolic
    zero tangents stay symbolic: they are rebuilt per element instead of being vmapped."""
    rule = ad.primitive_jvps.get(inner)
    if rule is None:
        raise NotImplementedError(f"Differentiation rule for '{inner}' not implemented")
    live = [not _is_zero(t) for t in tangents]

    def one(element_primals, live_tangents):
        it = iter(live_tangents)
        element_tangents = [next(it) if is_live else ad.Zero(jax.typeof(p).to_tangent_aval())
                            for p, is_live in zip(element_primals, live)]
        _, outs = rule(element_primals, element_tangents, **inner_params(params))
        return [None if _is_zero(t) else t for t in outs]

    axes = [0 if s else None for s in stacked]
    live_axes = [a for a, is_live in zip(axes, live) if is_live]
    tangents_of = on_auto_axes(jax.vmap(one, in_axes=(axes, live_axes)))
    tangents_out = tangents_of(list(primals), [t for t, is_live in zip(tangents, live) if is_live])
    primal_out = outer.bind(*primals, stacked=stacked, **params)
    outs = primal_out if outer.multiple_results else [primal_out]
    tangents_out = [ad.Zero(jax.typeof(o).to_tangent_aval()) if t is None else t
                    for t, o in zip(tangents_out, outs)]
    return primal_out, tangents_out if outer.multiple_results else tangents_out[0]


def stacked_transpose(inner, inner_params, cts, *args, stacked, **params):
    """jax.linear_transpose of the stacked twin: `inner`'s transpose rule under vmap over the
    stack. A linear operand that is not stacked receives the sum over the stack of its
    per-element cotangents."""
    rule = ad.primitive_transposes.get(inner)
    if rule is None:
        raise NotImplementedError(f"Transpose rule for '{inner}' not implemented")
    cts = cts if isinstance(cts, (list, tuple)) else [cts]
    linear = [ad.is_undefined_primal(a) for a in args]
    zero_cts = [_is_zero(c) for c in cts]
    if all(zero_cts):
        return [ad.Zero(a.aval) if is_linear else None for a, is_linear in zip(args, linear)]

    def aval_of(a, s):  # of one element (a: a primal, cotangent or undefined primal)
        return element_aval(a.aval) if s else a.aval

    def one(live_cts, known):
        it_ct, it_arg = iter(live_cts), iter(known)
        element_cts = [ad.Zero(aval_of(c, True)) if z else next(it_ct)
                       for c, z in zip(cts, zero_cts)]
        element_args = [ad.UndefinedPrimal(aval_of(a, s)) if is_linear else next(it_arg)
                        for a, s, is_linear in zip(args, stacked, linear)]
        if not inner.multiple_results:
            element_cts = element_cts[0]
        return [None if r is None or _is_zero(r) else r
                for r in rule(element_cts, *element_args, **inner_params(params))]

    known_axes = [0 if s else None for s, is_linear in zip(stacked, linear) if not is_linear]
    cotangents_of = on_auto_axes(jax.vmap(one, in_axes=([0] * zero_cts.count(False), known_axes)))
    results = cotangents_of(
        [c for c, z in zip(cts, zero_cts) if not z],
        [a for a, is_linear in zip(args, linear) if not is_linear])
    out = []
    for a, s, is_linear, r in zip(args, stacked, linear, results):
        if not is_linear:
            out.append(None)
        elif r is None:
            out.append(ad.Zero(a.aval))
        else:
            out.append(r if s else r.astype(jnp.float32).sum(0).astype(r.dtype))
    return out


def stacked_abstract_eval(inner, inner_params):
    """Abstract eval of the stacked form of `inner` (`inner_params(params)`: its parameters)."""

    def abstract_eval(*avals, stacked, **params):
        size = next(a.shape[0] for a, s in zip(avals, stacked) if s)
        unstacked = [element_aval(a) if s else a for a, s in zip(avals, stacked)]
        outs = inner.abstract_eval(*unstacked, **inner_params(params))[0]
        outs = outs if inner.multiple_results else [outs]
        outs = [stacked_aval(o, size) for o in outs]
        return outs if inner.multiple_results else outs[0]

    return abstract_eval


def register_stacked_rules(prim, inner, inner_params):
    """JVP, transpose and vmap rules of `prim`, the stacked form of `inner`. A vmap of `prim`
    itself (a stack of stacks) runs it once per batch element."""
    ad.primitive_jvps[prim] = functools.partial(stacked_jvp, prim, inner, inner_params)
    ad.primitive_transposes[prim] = functools.partial(stacked_transpose, inner, inner_params)
    batching.primitive_batchers[prim] = map_batcher(prim)
