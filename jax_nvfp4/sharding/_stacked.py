"""Stacked twins of the partitioned primitives: vmap over stacked weights, kept partitioned.

`vmap` of matmul or conv with the weight batched too (a stack of experts or layers: codes
[E, N, K], scales [E, ...], s_dec [E]) cannot fold the batch into M or the images. Run as a
`lax.map` of the outer primitive, it made XLA gather every stacked operand that was sharded along
E (its loop slices E dynamically), so an expert-parallel weight was all-gathered on each device.
The stacked twin binds once with `stacked` (which operands carry the leading E): its Shardy rule
is the op's with a factor "stack" prepended to those operands and to every result, its plan
shards E as the op's leader (the weight) has it and gives the rest of the mesh to the op's own
plan, and each shard runs the op's per-shard body under `vmap` over its local E (for matmul
that binds the stacked GEMM primitive: one kernel call a device; jax_nvfp4.primitives._stacking
has the rules both stacked forms share)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.extend
from jax._src import dispatch
from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule
from jax.interpreters import mlir

from jax_nvfp4.primitives._base import on_auto_axes
from jax_nvfp4.primitives._stacking import register_stacked_rules, stacked_abstract_eval
from jax_nvfp4.sharding._partitioned import (Plan, _avals_key, _partitioned_cached, local_body,
                                              typed_by_plan)
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
        return on_auto_axes(each)

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


def define_stacked_primitive(name, outer, inner, op):
    """The stacked twin `name` of the partitioned primitive `outer` (of `inner`, with rules `op`,
    which names its leader operand with `op.stack_leader(params)`). Parameters: `outer`'s and
    `stacked` (a bool per operand). Differentiated by `outer`'s own rules under vmap over the
    stack (their GEMMs bind `outer`, so vmap brings them back here, partitioned); its own vmap
    runs it per batch element."""
    prim = jax.extend.core.Primitive(name)
    prim.multiple_results = outer.multiple_results

    def outer_params(params):
        return {k: v for k, v in params.items() if k != "stacked"}

    def lowering(ctx, *args, stacked, **params):
        fn = _partitioned_cached(inner, _Stacked(op, stacked), _avals_key(ctx.avals_in),
                                 tuple(sorted(params.items())))
        return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)

    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    by_element = stacked_abstract_eval(outer, outer_params)

    def abstract_eval(*avals, stacked, **params):
        # Typed by the stacked plan (the stack split as the weight is), which replaces the type
        # the element's own plan gave (it sees the operands without their stacked dim).
        outs = by_element(*avals, stacked=stacked, **params)
        return typed_by_plan(outs, avals, _Stacked(op, stacked), params, prim.multiple_results)

    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, lowering)
    dispatch.prim_requires_devices_during_lowering.add(prim)
    register_stacked_rules(prim, outer, outer_params)
    return prim
