"""Outer primitives whose lowering is a `custom_partitioning` around an inner primitive.

The inner primitives (jax_nvfp4.primitives) know nothing of meshes. Each op here supplies
  rule(avals, params)                   its Shardy sharding rule,
  plan(mesh, dims, avals, params, result_dims=None, **options)
                                        from the operands' shardings (as per-dimension axis
                                        tuples), and in `partition` the results' as the
                                        partitioner chose them (which an op may honour): the
                                        shardings it honours and the per-shard body,
  operands_from_results(dims, avals, params)   operand shardings that give these results (for
                                        GSPMD's propagation from users),
  OPTIONS (optional)                    names of outer-primitive parameters that only say how
                                        shards combine their results (e.g. the dtype of a
                                        row-parallel sum): `plan` receives them as keywords, the
                                        inner primitive never sees them,
  whole(inner, params) (optional)       the unpartitioned computation, when it is not `inner`
                                        bound as is (a stacked op's, _stacked.py),
and this module wires them into `custom_partitioning` (Shardy rule plus the GSPMD callbacks).
The outer primitive is needed because `custom_partitioning` has no batching rule: vmap of the
outer primitive is defined by each op and binds the outer primitive again, so batched code stays
partitioned (as jax's own cudnn scaled_matmul does)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Callable, Sequence

import jax
import jax.extend
import jax.numpy as jnp
from jax import lax
from jax._src import dispatch
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import batching, mlir

from jax_nvfp4.sharding._specs import named, spec_axes

Dims = Sequence[tuple[str, ...]]  # the mesh axes sharding each dimension of one array


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one op runs on a mesh: the shardings it takes and gives, and the per-shard body
    (local operands -> tuple of local results, may use collectives over mesh axis names)."""

    operands: list[Dims]
    results: list[Dims]
    body: Callable


def _avals_key(avals):
    return tuple((tuple(a.shape), a.dtype) for a in avals)


def local_body(inner, params):
    """The body of a shard that needs no communication: `inner` on the local operands, as is."""

    def body(*operands):
        out = inner.bind(*operands, **params)
        return tuple(out) if inner.multiple_results else (out,)

    return body


def summed_partials(partial, axes, bias=None, scatter=None):
    """A contraction split over `axes` finished in float32: the shards' partial results summed
    (psum, or with `scatter` a dimension, psum_scatter along it, which leaves each shard its
    slice), then `bias` (over the last dimension) added once."""
    if scatter is None:
        y = lax.psum(partial, axes)
    else:
        y = lax.psum_scatter(partial, axes, scatter_dimension=scatter, tiled=True)
    y = y.astype(jnp.float32)
    return y if bias is None else y + bias.astype(jnp.float32)


def _split_params(op, params):
    """The outer primitive's parameters -> (those of the inner primitive, op.OPTIONS)."""
    names = getattr(op, "OPTIONS", ())
    inner = {k: v for k, v in params.items() if k not in names}
    return inner, {k: v for k, v in params.items() if k in names}


def _partitioned(inner, op, avals_key, params_key):
    """A custom_partitioning function running `inner` with the rules of `op` (cached per shape)."""
    avals = [jax.ShapeDtypeStruct(s, d) for s, d in avals_key]
    params, options = _split_params(op, dict(params_key))
    whole = op.whole(inner, params) if hasattr(op, "whole") else local_body(inner, params)

    def shardings(mesh, dims_list):
        return tuple(named(mesh, d) for d in dims_list)

    def dims_of(mesh, shapes):
        return [spec_axes(s.sharding, len(s.shape), mesh) for s in shapes]

    def partition(mesh, arg_shapes, result_shape):
        plan = op.plan(mesh, dims_of(mesh, arg_shapes), avals, params,
                       result_dims=dims_of(mesh, result_shape), **options)
        return (mesh, _per_device(plan.body), shardings(mesh, plan.results),
                shardings(mesh, plan.operands))

    def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
        plan = op.plan(mesh, dims_of(mesh, arg_shapes), avals, params, **options)
        return shardings(mesh, plan.results)

    def propagate_user_sharding(mesh, user_shape):
        dims = dims_of(mesh, user_shape)
        plan = op.plan(mesh, op.operands_from_results(dims, avals, params), avals, params,
                       **options)
        return shardings(mesh, plan.results)

    fn = custom_partitioning(whole)
    callbacks = dict(partition=partition, sharding_rule=op.rule(avals, params),
                     decode_shardings=False,  # read by _specs.spec_axes
                     infer_sharding_from_operands=infer_sharding_from_operands,
                     propagate_user_sharding=propagate_user_sharding)
    accepted = inspect.signature(fn.def_partition).parameters
    fn.def_partition(**{k: v for k, v in callbacks.items() if k in accepted})  # GSPMD's may go
    return fn


_NO_MESH = jax.sharding.AbstractMesh((), ())


def typed_by_plan(outs, avals, op, params, multiple_results: bool):
    """`outs` (the results' avals) typed, on a mesh with Explicit axes, with the shardings `op`'s
    plan gives them (a column-parallel output [M, N@tp], a row-parallel one replicated after its
    sum), so the ops after them keep the split instead of gathering a value typed replicated.
    Without Explicit axes in the operands' types, `outs` as they are."""
    meshes = [getattr(getattr(a, "sharding", None), "mesh", None) for a in avals]
    mesh = next((m for m in meshes if m is not None and m.explicit_axes), None)
    if mesh is None:
        return outs
    inner_params, options = _split_params(op, params)
    plan = op.plan(mesh, [spec_axes(a.sharding, a.ndim, mesh) for a in avals], avals, inner_params,
                   **options)
    typed = [o.update(sharding=named(mesh, d))
             for o, d in zip(outs if multiple_results else [outs], plan.results)]
    return typed if multiple_results else typed[0]


def _per_device(body):
    """`body` traced without the caller's mesh. It runs on one device's shard, after SPMD
    partitioning; under a mesh with Explicit axes (`jax.set_mesh`) its values would otherwise be
    typed as global arrays and carry sharding ops that nothing partitions any more (jax 0.11
    then fails at run time: "No registered implementation for untyped custom call to
    Sharding"). Collectives still name the mesh axes: custom_partitioning binds them."""

    def traced_without_mesh(*operands):
        with jax.sharding.use_abstract_mesh(_NO_MESH):
            return body(*operands)

    return traced_without_mesh


_partitioned_cached = functools.lru_cache(maxsize=256)(_partitioned)


def define_partitioned_primitive(name, inner, op):
    """The outer primitive `name`: abstract eval of `inner`, lowered through custom_partitioning
    with `op`'s rules. Give it a batching rule (`register_batcher`); jax_nvfp4.primitives.autodiff
    registers its JVP and transpose (the inner primitive's rules, binding the outer primitive, so
    tangents and cotangents are partitioned too)."""
    prim = jax.extend.core.Primitive(name)
    prim.multiple_results = inner.multiple_results
    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))

    def abstract_eval(*avals, **params):
        outs = inner.abstract_eval(*avals, **_split_params(op, params)[0])[0]
        return typed_by_plan(outs, avals, op, params, prim.multiple_results)

    prim.def_abstract_eval(abstract_eval)

    def lowering(ctx, *args, **params):
        fn = _partitioned_cached(inner, op, _avals_key(ctx.avals_in),
                                 tuple(sorted(params.items())))
        return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)

    mlir.register_lowering(prim, lowering)
    dispatch.prim_requires_devices_during_lowering.add(prim)
    return prim


def register_batcher(prim, rule):
    batching.primitive_batchers[prim] = rule
