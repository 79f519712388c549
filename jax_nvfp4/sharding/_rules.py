"""Shardy sharding rules (einsum-like factor mappings) for NVFP4 operands.

An NVFP4 tensor's codes [.., R, K] and tiled scales [.., R/128, K/64, 32, 4, 4] must shard
together: the codes' R dimension is the compound factor (row tile, row in tile) whose major part
is the scales' row-tile dimension, and likewise K = (K tile, element in tile). Only the tile
factors may be sharded; the within-tile factors and the scales' 32x4x4 tile interior are marked
need-replication. A dimension that is not a whole number of at least two tiles cannot be split
into whole tiles, so it gets plain factors that are all need-replication."""

from __future__ import annotations

from jax.experimental.custom_partitioning import ArrayMapping, CompoundFactor, SdyShardingRule

TILE_INTERIOR = ("si", "sj", "sl")  # the [32, 4, 4] interior of a scale tile


class RuleBuilder:
    """Collects operand/result factor mappings and the factors' kinds and sizes."""

    def __init__(self):
        self.need_replication: list[str] = list(TILE_INTERIOR)
        self.reduction: list[str] = []
        self.sizes: dict[str, int] = {}
        self.operands: list[tuple] = []
        self.results: list[tuple] = []

    def _replicated(self, *factors):
        for f in factors:
            if f not in self.need_replication:
                self.need_replication.append(f)

    def tiled(self, name: str, size: int, tile: int, *, reduce: bool = False):
        """Factors of a dimension of `size` whose scales come in tiles of `tile` elements.

        Returns (mapping of the codes' dimension, mapping of the scales' tile dimension)."""
        tiles = f"{name}t"
        if size % tile == 0 and size // tile > 1:
            if reduce:
                self.reduction.append(tiles)
            return self.compound(tiles, (f"{name}e", tile)), tiles
        self._replicated(name, tiles)
        return name, tiles

    def compound(self, major: str, *inner: tuple[str, int]):
        """A dimension made of factor `major` (shardable) and need-replication factors
        `inner` ((name, size) pairs, minor last)."""
        for name, size in inner:
            self.sizes[name] = size
            self._replicated(name)
        return CompoundFactor(major, *(name for name, _ in inner))

    def reduced(self, name: str) -> str:
        """A dimension an op sums over (its shards' results are added)."""
        self.reduction.append(name)
        return name

    def replicated(self, name: str) -> str:
        """A dimension that must not be sharded."""
        self._replicated(name)
        return name

    def operand(self, *dims):
        self.operands.append(dims)

    def result(self, *dims):
        self.results.append(dims)

    def scales(self, *tile_dims):
        """Mapping of tiled scales whose leading/tile dimensions map to `tile_dims`."""
        return (*tile_dims, *TILE_INTERIOR)

    def build(self) -> SdyShardingRule:
        # Shardy wants each kind's factors in the order the rule first names them.
        order = []
        for mapping in (*self.operands, *self.results):
            for dim in mapping:
                for f in (dim if isinstance(dim, CompoundFactor) else (dim,)):
                    if f not in order:
                        order.append(f)

        def in_order(factors):
            return tuple(sorted(set(factors), key=order.index))

        return SdyShardingRule(
            tuple(ArrayMapping(*m) for m in self.operands),
            tuple(ArrayMapping(*m) for m in self.results),
            reduction_factors=in_order(self.reduction),
            need_replication_factors=in_order(self.need_replication),
            **self.sizes)
