"""PartitionSpec arithmetic shared by the partitioning rules.

A dimension's sharding is handled as a tuple of mesh axis names (empty: replicated), so specs of
any spelling (None, "x", ("x", "y")) compare and combine uniformly."""

from __future__ import annotations

import math

from jax.sharding import NamedSharding, PartitionSpec

from jax_nvfp4.format import BLOCK, TILE_K_BLOCKS, TILE_ROWS

TILE_K = BLOCK * TILE_K_BLOCKS  # 64 contracting elements per scale tile
REPLICATED: tuple[str, ...] = ()


def dim_axes(entry) -> tuple[str, ...]:
    """One PartitionSpec entry -> the tuple of mesh axes sharding that dimension."""
    if entry is None:
        return REPLICATED
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def spec_axes(sharding, ndim: int, mesh) -> list[tuple[str, ...]]:
    """The mesh axes sharding each of the `ndim` dimensions of an array with `sharding`.

    The partitioner hands over HLO shardings; this finds the PartitionSpec over `mesh` that
    gives the same one. A sharding that none expresses (Shardy splits a mesh axis into sub-axes
    when asked to split a dimension into more parts than it has scale tiles) is read as
    replicated: the op then reshards that operand explicitly instead of misreading it. So is
    None, which GSPMD hands over for an operand it has no sharding for (a constant the jitted
    function closes over)."""
    if sharding is None:
        return [REPLICATED] * ndim
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec)
        return [dim_axes(spec[d]) if d < len(spec) else REPLICATED for d in range(ndim)]
    hlo = sharding._to_xla_hlo_sharding(ndim)
    if hlo.is_replicated() or not hlo.is_tiled():
        return [REPLICATED] * ndim
    tiles = list(hlo.tile_assignment_dimensions())[:ndim]
    for dims in _specs_with_tiles(mesh, tiles, ()):
        if named(mesh, dims)._to_xla_hlo_sharding(ndim) == hlo:
            return list(dims)
    return [REPLICATED] * ndim


def _specs_with_tiles(mesh, tiles, used):
    """Every assignment of distinct mesh axes to dims that splits dim d into tiles[d] parts."""
    if not tiles:
        yield ()
        return
    for axes in _axis_tuples(mesh, tiles[0], used):
        for rest in _specs_with_tiles(mesh, tiles[1:], used + axes):
            yield (axes, *rest)


def _axis_tuples(mesh, parts, used):
    if parts == 1:
        yield REPLICATED
        return
    for name in mesh.axis_names:
        size = mesh.shape[name]
        if name not in used and size > 1 and parts % size == 0:
            for rest in _axis_tuples(mesh, parts // size, used + (name,)):
                yield (name, *rest)


def shard_count(mesh, axes) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def whole_tiles(mesh, axes, size: int, tile: int):
    """`axes` if splitting a dimension of `size` over them leaves every shard whole `tile`s
    (so the scales split along with the codes), else replicated."""
    if not axes:
        return REPLICATED
    if size % tile or (size // tile) % shard_count(mesh, axes):
        return REPLICATED
    return axes


def even_split(mesh, axes, size: int):
    """`axes` if they divide a dimension of `size` evenly, else replicated."""
    if axes and size % shard_count(mesh, axes) == 0:
        return axes
    return REPLICATED


def row_axes(mesh, axes, rows: int):
    """Sharding of a row dimension of an NVFP4 tensor: whole 128-row scale tiles only."""
    return whole_tiles(mesh, axes, rows, TILE_ROWS)


def k_axes(mesh, axes, k: int):
    """Sharding of the contracting dimension of an NVFP4 tensor: whole 64-element scale tiles."""
    return whole_tiles(mesh, axes, k, TILE_K)


def without(axes, used) -> tuple[str, ...]:
    """`axes`, or replicated when any of them is already used by another dimension."""
    return REPLICATED if set(axes) & set(used) else tuple(axes)


def scatters(mesh, wanted, own_ax, sum_ax, size: int, split) -> bool:
    """Whether a result dimension of `size`, split over `own_ax`, can take the further split over
    `sum_ax` (the axes a contraction is summed over) that `wanted` (the partitioner's choice for
    it) asks for, in whole pieces by `split` (e.g. whole scale tiles where it is NVFP4): then the
    partial sums can be reduce-scattered along it instead of all-reduced."""
    return tuple(wanted) == own_ax + sum_ax and split(mesh, wanted, size) == tuple(wanted)


def named(mesh, dims) -> NamedSharding:
    """NamedSharding of an array whose dimension d is sharded over the axes dims[d]."""
    entries = [None if not a else (a[0] if len(a) == 1 else tuple(a)) for a in dims]
    return NamedSharding(mesh, PartitionSpec(*entries))


def scale_dims(lead, rows, k) -> list[tuple[str, ...]]:
    """Sharding of tiled scales [*lead, R/128, K/64, 32, 4, 4] from that of their codes."""
    return [*lead, rows, k, REPLICATED, REPLICATED, REPLICATED]
