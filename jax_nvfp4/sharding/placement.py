"""Placing NVFP4 tensors on a mesh: the shardings of codes, scales and s_dec together."""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec

from jax_nvfp4.format import TILE_ROWS, NVFP4Array, rows_and_lead
from jax_nvfp4.sharding._specs import (REPLICATED, TILE_K, dim_axes, named, scale_dims,
                                       shard_count)


def nvfp4_sharding(mesh, spec, shape, *, s_dec_ndim: int = 0) -> NVFP4Array:
    """Shardings of an NVFP4 tensor of logical `shape` whose codes take PartitionSpec `spec`:
    an NVFP4Array of NamedShardings (a pytree prefix for jax.device_put and jit's shardings).

    The scales split with their codes; s_dec (of rank `s_dec_ndim`, a prefix of the leading
    dims) follows the codes' leading dims. Leading dims must split evenly, rows into whole
    128-row tiles and K into whole 64-element tiles, else ValueError."""
    if not (hasattr(mesh, "axis_names") and hasattr(mesh, "shape")):
        raise TypeError(f"nvfp4_sharding: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not isinstance(spec, (PartitionSpec, tuple, list)):  # a bare "tp" would split per letter
        raise TypeError(f"nvfp4_sharding: spec must be a PartitionSpec, got {spec!r}")
    shape = tuple(shape)
    lead, _, _ = rows_and_lead(shape)
    spec = tuple(spec)
    if len(spec) > len(shape):
        raise ValueError(f"nvfp4_sharding: spec {PartitionSpec(*spec)} has more entries than "
                         f"shape {shape} has dims")
    dims = [dim_axes(spec[d]) if d < len(spec) else REPLICATED for d in range(len(shape))]
    unknown = sorted({a for axes in dims for a in axes} - set(mesh.axis_names))
    if unknown:
        raise ValueError(f"nvfp4_sharding: spec {PartitionSpec(*spec)} names mesh axes {unknown}; "
                         f"the mesh has {tuple(mesh.axis_names)}")
    if not 0 <= s_dec_ndim <= len(lead):
        raise ValueError(f"nvfp4_sharding: s_dec_ndim={s_dec_ndim} must be between 0 and the "
                         f"{len(lead)} leading dims of shape {shape}")
    units = [1] * len(lead) + ([TILE_ROWS] if len(shape) > 1 else []) + [TILE_K]
    for d, (axes, size, unit) in enumerate(zip(dims, shape, units)):
        parts = shard_count(mesh, axes)
        if parts > 1 and (size % unit or (size // unit) % parts):
            what = f"whole {unit}-element scale tiles" if unit > 1 else "equal parts"
            raise ValueError(f"nvfp4_sharding: dim {d} of shape {shape} (size {size}) cannot be "
                             f"split over mesh axes {axes} ({parts} parts) into {what}")
    n = len(lead)
    if len(shape) == 1:
        scales = scale_dims([], REPLICATED, dims[0])
    else:
        scales = scale_dims(dims[:n], dims[n], dims[n + 1])
    return NVFP4Array(named(mesh, dims), named(mesh, scales), named(mesh, dims[:s_dec_ndim]))


def shard_nvfp4(q: NVFP4Array, mesh, spec) -> NVFP4Array:
    """`q` placed on `mesh` with its codes split by PartitionSpec `spec` (see nvfp4_sharding)."""
    if not isinstance(q, NVFP4Array):
        raise TypeError(f"shard_nvfp4 places an NVFP4Array (jax_nvfp4.quantize), got {type(q).__name__}")
    return jax.device_put(q, nvfp4_sharding(mesh, spec, q.shape, s_dec_ndim=q.s_dec.ndim))
