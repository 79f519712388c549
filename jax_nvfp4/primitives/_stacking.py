"""Stacked forms of primitives: one bind for a `vmap` over a stack of weights.

A primitive's stacked form takes its operands with a leading stacked dimension on those flagged
in the parameter `stacked` (a bool per operand; the others are shared by every element) and
gives every result that leading dimension. Its rules here are generic over the primitive of one
element: abstract eval from that primitive's, vmap binding the stacked form once
(`stacked_batcher`), and JVP and transpose from the element primitive's own rules under vmap over
the stack."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching
from jax.sharding import PartitionSpec

from jax_nvfp4.primitives._base import (batch_size, is_zero, map_batcher, on_auto_axes, to_front,
                                        typed_like, zero_like)


def element_aval(aval):
    """The aval of one element of a stack (its type's sharding without the stacked dim)."""
    spec = PartitionSpec(*aval.sharding.spec[1:])
    return aval.update(shape=aval.shape[1:], sharding=aval.sharding.update(spec=spec))


def stacked_aval(aval, size):
    """A stack of `size` elements of `aval`, the stacked dim unsplit in its type (a stacked twin
    then types its results by its plan, jax_nvfp4.sharding._stacked)."""
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


def stacked_jvp(outer, element, element_params, primals, tangents, *, stacked, **params):
    """JVP of `outer`, the stacked form of `element`: the primal by `outer`; the tangent from
    `element`'s own JVP rule under vmap over the stack. Symbolic zero tangents stay symbolic:
    they are rebuilt per element instead of being vmapped."""
    rule = ad.primitive_jvps.get(element)
    if rule is None:
        raise NotImplementedError(f"Differentiation rule for '{element}' not implemented")
    live = [not is_zero(t) for t in tangents]

    def one(element_primals, live_tangents):
        it = iter(live_tangents)
        element_tangents = [next(it) if is_live else zero_like(p)
                            for p, is_live in zip(element_primals, live)]
        _, outs = rule(element_primals, element_tangents, **element_params(params))
        outs = outs if element.multiple_results else [outs]
        return [None if is_zero(t) else t for t in outs]

    axes = [0 if s else None for s in stacked]
    live_axes = [a for a, is_live in zip(axes, live) if is_live]
    tangents_out = on_auto_axes(jax.vmap(one, in_axes=(axes, live_axes)))(
        list(primals), [t for t, is_live in zip(tangents, live) if is_live])
    primal_out = outer.bind(*primals, stacked=stacked, **params)
    outs = primal_out if outer.multiple_results else [primal_out]
    tangents_out = [zero_like(o) if t is None else t
                    for t, o in zip(tangents_out, outs)]
    return primal_out, tangents_out if outer.multiple_results else tangents_out[0]


def stacked_transpose(element, element_params, cts, *args, stacked, **params):
    """Transpose of the stacked form of `element`: `element`'s transpose rule under vmap over the
    stack. A linear operand that is not stacked receives the sum over the stack of its
    per-element cotangents."""
    rule = ad.primitive_transposes.get(element)
    if rule is None:
        raise NotImplementedError(f"Transpose rule for '{element}' not implemented")
    cts = cts if isinstance(cts, (list, tuple)) else [cts]
    linear = [ad.is_undefined_primal(a) for a in args]
    zero_cts = [is_zero(c) for c in cts]
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
        if not element.multiple_results:
            element_cts = element_cts[0]
        return [None if r is None or is_zero(r) else r
                for r in rule(element_cts, *element_args, **element_params(params))]

    known_axes = [0 if s else None for s, is_linear in zip(stacked, linear) if not is_linear]
    cotangents_of = on_auto_axes(jax.vmap(one, in_axes=([0] * zero_cts.count(False), known_axes)))
    results = cotangents_of([c for c, z in zip(cts, zero_cts) if not z],
                            [a for a, is_linear in zip(args, linear) if not is_linear])
    out = []
    for a, s, is_linear, r in zip(args, stacked, linear, results):
        if not is_linear:
            out.append(None)
        elif r is None:
            out.append(ad.Zero(a.aval))
        else:
            r = r if s else r.astype(jnp.float32).sum(0).astype(r.dtype)
            out.append(typed_like(r, a.aval))
    return out


def stacked_abstract_eval(element, element_params):
    """Abstract eval of the stacked form of `element` (`element_params(params)`: its
    parameters)."""

    def abstract_eval(*avals, stacked, **params):
        size = next(a.shape[0] for a, s in zip(avals, stacked) if s)
        unstacked = [element_aval(a) if s else a for a, s in zip(avals, stacked)]
        outs = element.abstract_eval(*unstacked, **element_params(params))[0]
        outs = outs if element.multiple_results else [outs]
        outs = [stacked_aval(o, size) for o in outs]
        return outs if element.multiple_results else outs[0]

    return abstract_eval


def register_stacked_rules(prim, element, element_params):
    """JVP, transpose and vmap rules of `prim`, the stacked form of `element`. A vmap of `prim`
    itself (a stack of stacks) runs it once per batch element."""
    ad.primitive_jvps[prim] = functools.partial(stacked_jvp, prim, element, element_params)
    ad.primitive_transposes[prim] = functools.partial(stacked_transpose, element, element_params)
    batching.primitive_batchers[prim] = map_batcher(prim)
