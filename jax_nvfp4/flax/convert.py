"""Turning trained float Flax models into NVFP4 ones, and saving/restoring them with orbax.

- `quantize_params(params, predicate=...)`: a float linen parameter tree (of a model built from
  nn.Dense / nn.DenseGeneral) -> the tree jax_nvfp4.flax.linen layers expect: each selected
  'kernel' [*in, *out] becomes an NVFP4Array [prod(out), prod(in)]; everything else is kept.
- `quantize_model(model, predicate=...)`: an nnx model, in place: each selected `nnx.Linear`
  (or QAT-mode `jax_nvfp4.flax.nnx.Linear`) becomes an inference-mode NVFP4 `Linear`.
- `save(directory, tree)` / `restore(directory, like)`: orbax checkpoints of either (an nnx
  model's `nnx.state(model)`, or a linen parameter tree).

A predicate is called as predicate(path, kernel) with the layer's path (a tuple of names /
indices) and its float kernel in Flax's [*in, *out] layout; `eligible` (the default) accepts
every kernel whose input size is a multiple of 16, `skip(*names)` also rejects the layers whose
path holds one of `names` (e.g. the embedding and the LM head).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from jax_nvfp4.flax import linen as nvfp4_linen
from jax_nvfp4.flax import nnx as nvfp4_nnx
from jax_nvfp4.format import BLOCK

Predicate = Callable[[tuple, Any], bool]


def eligible(path: tuple, kernel) -> bool:
    """True when `kernel` [..., in, out] contracts a multiple of 16 (one output axis)."""
    del path
    return kernel.ndim >= 2 and math.prod(kernel.shape[:-1]) % BLOCK == 0


def skip(*names: str) -> Predicate:
    """A predicate: `eligible`, except for layers whose path contains one of `names`."""

    def predicate(path: tuple, kernel) -> bool:
        return eligible(path, kernel) and not any(p in names for p in path)

    return predicate


def _unboxed(leaf):
    return leaf.value if isinstance(leaf, nn.Partitioned) else leaf


def _is_float_kernel(leaf) -> bool:
    value = _unboxed(leaf)
    return (hasattr(value, "ndim") and value.ndim >= 2
            and jnp.issubdtype(value.dtype, jnp.floating))


def quantize_params(params, *, predicate: Predicate = eligible,
                    in_ndim: Callable[[tuple, Any], int] | None = None):
    """The NVFP4 counterpart of a float linen parameter tree (see the module docstring).

    Each mapping holding a float 'kernel' of rank >= 2 is a dense layer; if
    predicate(path, kernel) accepts it, the kernel is quantized to an NVFP4Array and its sharding
    box (nn.with_partitioning / nn.with_logical_partitioning) is carried over. A rank-2 kernel
    is [in, out]; for a rank > 2 kernel (nn.DenseGeneral) `in_ndim(path, kernel)` says how many
    leading axes are inputs (default: all but the last). The input tree is not modified."""

    def convert(node, path):
        if not isinstance(node, Mapping):
            return node
        out = {key: convert(value, path + (key,)) for key, value in node.items()}
        kernel = node.get("kernel")
        if _is_float_kernel(kernel) and predicate(path, _unboxed(kernel)):
            n_in = in_ndim(path, _unboxed(kernel)) if in_ndim else _unboxed(kernel).ndim - 1
            if not 1 <= n_in < _unboxed(kernel).ndim:
                raise ValueError(f"quantize_params: in_ndim={n_in} for the kernel of shape "
                                 f"{_unboxed(kernel).shape} at {'/'.join(map(str, path))}")
            out["kernel"] = nvfp4_linen.quantize_kernel(kernel, n_in, "/".join(map(str, path)))
        return type(node)(out) if isinstance(node, nn.FrozenDict) else out

    return convert(params, ())


def _float_linear(module) -> bool:
    """An nnx layer quantize_model converts: a float nnx.Linear or a QAT-mode NVFP4 Linear."""
    if isinstance(module, nvfp4_nnx.Linear):
        return module.qat
    return type(module) is nnx.Linear


def _to_nvfp4(module, act_quant: bool, act_s_enc):
    if isinstance(module, nvfp4_nnx.Linear):  # QAT -> inference, same options
        act_quant, act_s_enc = module.act_quant, module.act_s_enc
    bias = module.bias[...] if module.bias is not None else None
    return nvfp4_nnx.Linear.from_float(
        module.kernel[...], bias, kernel_metadata=module.kernel.get_metadata(),
        bias_metadata={} if module.bias is None else module.bias.get_metadata(),
        dtype=module.dtype, act_quant=act_quant, act_s_enc=act_s_enc)


def quantize_model(model, *, predicate: Predicate = eligible, act_quant: bool = False,
                   act_s_enc: float | None = None):
    """Converts an nnx model's float `nnx.Linear` layers (and QAT-mode NVFP4 `Linear`s, which keep
    their activation options) accepted by predicate(path, kernel) into inference-mode NVFP4
    `Linear`s, in place; returns the model (the new layer itself when `model` is one layer).
    `act_quant`/`act_s_enc` set W4A4 on the converted nnx.Linear layers.
    Keep the float model with `nnx.clone(model)` first if you still need it."""
    selected = [(path, m) for path, m in nnx.iter_modules(model)
                if _float_linear(m) and predicate(path, m.kernel[...])]
    for path, module in selected:
        new = _to_nvfp4(module, act_quant, act_s_enc)
        if not path:
            return new
        parent = model
        for key in path[:-1]:
            parent = parent[key] if isinstance(key, int) else getattr(parent, key)
        if isinstance(path[-1], int):
            parent[path[-1]] = new
        else:
            setattr(parent, path[-1], new)
    return model


def save(directory: str | os.PathLike, tree) -> None:
    """Saves a pytree (an `nnx.state(model)` or a linen parameter tree, NVFP4Arrays included)
    as an orbax checkpoint in `directory` (which must not exist yet)."""
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.abspath(directory), tree)
        checkpointer.wait_until_finished()


def restore(directory: str | os.PathLike, like):
    """Restores a checkpoint written by `save`. `like` is a tree of the same structure, concrete
    or abstract (e.g. `nnx.state(nnx.eval_shape(build))` or `jax.eval_shape(model.init, ...)`);
    its arrays' shardings, if any, are those of the restored arrays."""
    import orbax.checkpoint as ocp

    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(os.path.abspath(directory), abstract)
