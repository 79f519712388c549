"""Stacked twins of the partitioned primitives: vmap over stacked weights, kept partitioned.

`vmap` of matmul or conv with the weight batched too (a stack of experts or layers: codes
[E, N, K], scales [E, ...], s_dec [E]) cannot fold the batch into M or the images. Run as a
`lax.map` of the outer primitive, it made XLA gather every stacked operand that was sharded along
E (its loop slices E dynamically), so an expert-parallel weight was all-gathered on each device.
The stacked twin binds once with `stacked` (which operands carry the leading E): its Shardy rule
is the op's with a factor "stack" prepended to those operands and to every result, its plan
shards E as the op's leader (the weight) has it and gives the rest of the mesh to the op's own
plan, and each shard runs the op's per-shard body under `vmap` over its local E."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.extend
import jax.numpy as jnp
from jax._src import dispatch
from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule
from jax.interpreters import ad, batching, mlir
from jax.sharding import PartitionSpec

from jax_nvfp4.primitives._base import batch_size, map_batcher, to_front
from jax_nvfp4.sharding._partitioned import (Plan, _avals_key, _partitioned_cached, _split_params,
                                             local_body)
from jax_nvfp4.sharding._specs import even_split, without

STACK = "stack"  # the Shardy factor of the stacked dimension


@dataclasses.dataclass(frozen=True)
class _Stacked:
    """`op`'s partitioning rules for operands of which those flagged in `stacked` carry a
    leading stacked dimension (results always do)."""

    op: Any
    stacked: tuple[bool, ...]

    @property
    def OPTIONS(self):  # noqa: N802 (the attribute name ops use)
        return getattr(self.op, "OPTIONS", ())

    def _in_axes(self):
        return tuple(0 if s else None for s in self.stacked)

    def _unstacked(self, avals):
        return [jax.ShapeDtypeStruct(a.shape[1:], a.dtype) if s else a
                for a, s in zip(avals, self.stacked)]

    def whole(self, inner, params):
        each = jax.vmap(local_body(inner, params), in_axes=self._in_axes())
        return _on_auto_axes(each)

    def rule(self, avals, params):
        rule = self.op.rule(self._unstacked(avals), params)
        lead = lambda mapping: ArrayMapping(STACK, *mapping)  # noqa: E731
        return SdyShardingRule(
            tuple(lead(m) if s else m for m, s in zip(rule.operand_mappings, self.stacked)),
            tuple(lead(m) for m in rule.result_mappings),
            reduction_factors=rule.reduction_factors,
            need_replication_factors=rule.need_replication_factors,
            permutation_factors=rule.permutation_factors, **rule.factor_sizes)

    def plan(self, mesh, dims, avals, params, result_dims=None, **options):
        # The stack is split as the leader (the weight, or else the first stacked operand) has
        # it, so a stacked weight is never gathered; the op's plan gets the other mesh axes.
        leader = self.op.stack_leader(params)
        if not self.stacked[leader]:
            leader = self.stacked.index(True)
        stack_ax = even_split(mesh, dims[leader][0], avals[leader].shape[0])
        inner_dims = [[without(d, stack_ax) for d in (ds[1:] if s else ds)]
                      for ds, s in zip(dims, self.stacked)]
        inner_results = None if result_dims is None else [
            [without(d, stack_ax) for d in ds[1:]] for ds in result_dims]
        plan = self.op.plan(mesh, inner_dims, self._unstacked(avals), params,
                            result_dims=inner_results, **options)
        return Plan([[stack_ax, *d] if s else d for d, s in zip(plan.operands, self.stacked)],
                    [[stack_ax, *d] for d in plan.results],
                    jax.vmap(plan.body, in_axes=self._in_axes()))

    def operands_from_results(self, dims, avals, params):
        stack_ax = dims[0][0]
        inner = self.op.operands_from_results([d[1:] for d in dims], self._unstacked(avals),
                                              params)
        return [[stack_ax, *d] if s else d for d, s in zip(inner, self.stacked)]


def _on_auto_axes(fn):
    """`fn`, run with a mesh's Explicit axes made Auto (results typed replicated, as the outer
    primitives' are). `vmap` of the inner primitives over a stacked weight runs `lax.map`, which
    refuses to loop over a dimension split on Explicit axes. Only the unpartitioned computation
    and the tangents need this; a partitioned stack runs per shard, on its local experts."""

    def run(*args):
        if not jax.sharding.get_abstract_mesh().explicit_axes:
            return fn(*args)
        return jax.sharding.auto_axes(fn, out_sharding=PartitionSpec())(*args)

    return run


def _element_aval(aval):
    """The aval of one element of a stack (its type's sharding without the stacked dim)."""
    spec = PartitionSpec(*aval.sharding.spec[1:])
    return aval.update(shape=aval.shape[1:], sharding=aval.sharding.update(spec=spec))


def _stacked_aval(aval, size):
    """A stack of `size` elements of `aval`; like the other outer primitives' results, its
    type does not carry the sharding the partitioner gives it."""
    spec = PartitionSpec(None, *aval.sharding.spec)
    return aval.update(shape=(size, *aval.shape), sharding=aval.sharding.update(spec=spec))


def define_stacked_primitive(name, inner, op):
    """The stacked twin `name` of the partitioned primitive of `inner` with rules `op` (which
    names its leader operand with `op.stack_leader(params)`). Parameters: `inner`'s, `op`'s
    OPTIONS, and `stacked` (a bool per operand). Its own vmap runs it per batch element."""
    prim = jax.extend.core.Primitive(name)
    prim.multiple_results = inner.multiple_results

    def inner_params(params):
        return _split_params(op, params)[0]

    def abstract_eval(*avals, stacked, **params):
        size = next(a.shape[0] for a, s in zip(avals, stacked) if s)
        unstacked = [_element_aval(a) if s else a for a, s in zip(avals, stacked)]
        outs = inner.abstract_eval(*unstacked, **inner_params(params))[0]
        outs = outs if inner.multiple_results else [outs]
        outs = [_stacked_aval(o, size) for o in outs]
        return outs if inner.multiple_results else outs[0]

    def lowering(ctx, *args, stacked, **params):
        fn = _partitioned_cached(inner, _Stacked(op, stacked), _avals_key(ctx.avals_in),
                                 tuple(sorted(params.items())))
        return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)

    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, lowering)
    dispatch.prim_requires_devices_during_lowering.add(prim)
    ad.primitive_jvps[prim] = functools.partial(_stacked_jvp, prim, inner, inner_params)
    ad.primitive_transposes[prim] = functools.partial(_stacked_transpose, inner, inner_params)
    batching.primitive_batchers[prim] = map_batcher(prim)
    return prim


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


def _stacked_jvp(outer, inner, inner_params, primals, tangents, *, stacked, **params):
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
    tangents_of = _on_auto_axes(jax.vmap(one, in_axes=(axes, live_axes)))
    tangents_out = tangents_of(list(primals), [t for t, is_live in zip(tangents, live) if is_live])
    primal_out = outer.bind(*primals, stacked=stacked, **params)
    outs = primal_out if outer.multiple_results else [primal_out]
    tangents_out = [ad.Zero(jax.typeof(o).to_tangent_aval()) if t is None else t
                    for t, o in zip(tangents_out, outs)]
    return primal_out, tangents_out if outer.multiple_results else tangents_out[0]


def _stacked_transpose(inner, inner_params, cts, *args, stacked, **params):
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

    def element_aval(a, s):
        return _element_aval(a.aval) if s else a.aval

    def one(live_cts, known):
        it_ct, it_arg = iter(live_cts), iter(known)
        element_cts = [ad.Zero(element_aval(c, True)) if z else next(it_ct)
                       for c, z in zip(cts, zero_cts)]
        element_args = [ad.UndefinedPrimal(element_aval(a, s)) if is_linear else next(it_arg)
                        for a, s, is_linear in zip(args, stacked, linear)]
        if not inner.multiple_results:
            element_cts = element_cts[0]
        return [None if r is None or _is_zero(r) else r
                for r in rule(element_cts, *element_args, **inner_params(params))]

    known_axes = [0 if s else None for s, is_linear in zip(stacked, linear) if not is_linear]
    cotangents_of = _on_auto_axes(jax.vmap(one, in_axes=([0] * zero_cts.count(False), known_axes)))
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
