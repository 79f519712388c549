"""Turning trained float Flax models into NVFP4 ones, and saving/restoring them with orbax.

- `quantize_params(params, predicate=...)`: a float linen parameter tree (of a model built from
  nn.Dense / nn.DenseGeneral / nn.Conv) -> the tree jax_nvfp4.flax.linen layers expect: each
  selected 'kernel' becomes an NVFP4Array (dense [*in, *out] -> [prod(out), prod(in)], conv
  HWIO -> [R, S, out, in]); everything else is kept.
- `quantize_model(model, predicate=...)`: an nnx model, in place: each selected `nnx.Linear` /
  `nnx.Conv` (or QAT-mode NVFP4 layer) becomes an inference-mode NVFP4 `Linear` / `Conv`.
- `save(directory, tree)` / `restore(directory, like)`: orbax checkpoints of either (an nnx
  model's `nnx.state(model)`, or a linen parameter tree). Importing this module also registers
  NVFP4Array with `flax.serialization` (`to_bytes` / `from_bytes`, `to_state_dict`).
- `trainable_mask(params)`: which leaves of a linen tree an optimizer may update (not the
  NVFP4Array fields of inference layers).

A predicate is called as predicate(path, kernel) with the layer's path (a tuple of names /
indices) and its float kernel in Flax's layout; `quantize_all` is the default, `skip(*names)`
rejects the layers whose path holds one of `names` (e.g. the embedding and the LM head).
Layers NVFP4 cannot hold (an input size, or a conv's input channels, not a multiple of 16) stay
float whatever the predicate says.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx, serialization
from jax import lax

from jax_nvfp4.flax import _core
from jax_nvfp4.flax import linen as nvfp4_linen
from jax_nvfp4.flax import nnx as nvfp4_nnx
from jax_nvfp4.format import BLOCK, FIELDS, NVFP4Array

__all__ = ["quantize_params", "quantize_model", "save", "restore", "trainable_mask",
           "quantize_all", "skip", "is_conv", "Predicate"]

Predicate = Callable[[tuple, Any], bool]


def quantize_all(path: tuple, kernel) -> bool:
    """The default predicate: every layer NVFP4 can hold."""
    del path, kernel
    return True


def skip(*names: str) -> Predicate:
    """A predicate rejecting the layers whose path contains one of `names`."""

    def predicate(path: tuple, kernel) -> bool:
        del kernel
        return not any(p in names for p in path)

    return predicate


def is_conv(path: tuple, kernel) -> bool:
    """The default rule telling conv kernels from dense ones in a linen tree: rank 4 (HWIO)."""
    del path
    return kernel.ndim == 4


def _unboxed(leaf):
    return leaf.value if isinstance(leaf, nn.Partitioned) else leaf


def _is_float_kernel(leaf) -> bool:
    value = _unboxed(leaf)
    return (hasattr(value, "ndim") and value.ndim >= 2
            and jnp.issubdtype(value.dtype, jnp.floating))


def quantize_params(params, *, predicate: Predicate = quantize_all, conv: Predicate = is_conv,
                    in_ndim: Callable[[tuple, Any], int] | None = None,
                    stack_ndim: Callable[[tuple, Any], int] | None = None):
    """The NVFP4 counterpart of a float linen parameter tree (see the module docstring).

    Each mapping holding a float 'kernel' of rank >= 2 is a layer; if predicate(path, kernel)
    accepts it, the kernel is quantized to an NVFP4Array and its sharding box
    (nn.with_partitioning / nn.with_logical_partitioning) is carried over. conv(path, kernel)
    tells an nn.Conv kernel (HWIO; default: rank 4) from a dense one. A dense kernel of rank 2
    is [in, out]; for a rank > 2 one (nn.DenseGeneral) `in_ndim(path, kernel)` says how many
    leading axes are inputs (default: all but the last). Layers stacked by nn.scan / nn.vmap
    have leading stack axes, which the tree does not tell from a DenseGeneral's: give their
    number with `stack_ndim(path, kernel)` (default 0), and each layer of the stack is quantized
    on its own (one s_dec a layer, as the stacked NVFP4 layers hold it); `conv` and `in_ndim`
    then see one layer's kernel. A stacked kernel's box names the stack axes first (nn.vmap /
    nn.scan `metadata_params={nn.PARTITION_NAME: ...}`); the NVFP4 codes and scales keep those
    names, s_dec [E] is not boxed (replicated). The input tree is not modified. An abstract tree
    (jax.ShapeDtypeStruct leaves, e.g. `jax.eval_shape` of `init`, to restore a checkpoint into)
    gives the abstract NVFP4 tree."""
    if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(params)):
        return jax.eval_shape(functools.partial(quantize_params, predicate=predicate, conv=conv,
                                                in_ndim=in_ndim, stack_ndim=stack_ndim), params)

    def quantized(kernel, path):
        where = "/".join(map(str, path))
        value = _unboxed(kernel)
        n_stack = stack_ndim(path, value) if stack_ndim else 0
        if n_stack:
            if not 0 < n_stack <= value.ndim - 2:
                raise ValueError(f"quantize_params: stack_ndim={n_stack} for the kernel of shape "
                                 f"{value.shape} at {where}")
            stack_names = ()
            if kernel is not value:  # a box: one layer's names inside the vmap, the stack's after
                stack_names = tuple(kernel.names[:n_stack])
                kernel = kernel.replace(names=tuple(kernel.names[n_stack:]))
            one_layer = lambda k: quantized_layer(k, path, where)  # noqa: E731
            for _ in range(n_stack):
                one_layer = jax.vmap(one_layer)
            return _with_stack_names(one_layer(kernel), stack_names)
        return quantized_layer(kernel, path, where)

    def quantized_layer(kernel, path, where):
        value = _unboxed(kernel)
        if conv(path, value):
            if value.shape[2] % BLOCK:
                return kernel
            return nvfp4_linen.quantize_kernel(kernel, where, conv=True)
        n_in = in_ndim(path, value) if in_ndim else value.ndim - 1
        if not 1 <= n_in < value.ndim:
            raise ValueError(f"quantize_params: in_ndim={n_in} for the kernel of shape "
                             f"{value.shape} at {where}")
        if math.prod(value.shape[:n_in]) % BLOCK:
            return kernel
        return nvfp4_linen.quantize_kernel(kernel, where, in_ndim=n_in)

    def convert(node, path):
        if not isinstance(node, Mapping):
            return node
        out = {key: convert(value, path + (key,)) for key, value in node.items()}
        kernel = node.get("kernel")
        if _is_float_kernel(kernel) and predicate(path, _unboxed(kernel)):
            out["kernel"] = quantized(kernel, path)
        return type(node)(out) if isinstance(node, nn.FrozenDict) else out

    return convert(params, ())


def _with_stack_names(tree, stack_names: tuple):
    """The sharding boxes in `tree` (a stacked layer's kernel, quantized or left float) with the
    stack axes' names put before their own."""
    if not stack_names:
        return tree
    return jax.tree.map(lambda leaf: leaf.replace(names=stack_names + tuple(leaf.names))
                        if isinstance(leaf, nn.Partitioned) else leaf,
                        tree, is_leaf=lambda leaf: isinstance(leaf, nn.Partitioned))


def _ones(value) -> bool:
    return all(v == 1 for v in ((value,) if isinstance(value, int) else value))


def _convertible(module) -> bool:
    """An nnx layer quantize_model converts: a QAT-mode NVFP4 layer, a float nnx.Linear with a
    multiple of 16 inputs, or a float 2-D nnx.Conv NVFP4 can represent (a multiple of 16 input
    channels; no feature groups, input dilation or mask; a padding jax_nvfp4.conv takes); in
    both cases with Flax's own product and no preferred_element_type."""
    if isinstance(module, nvfp4_nnx.Linear):  # QAT: one layer or a stack
        return module.qat and _layer_axes_last(module)
    if isinstance(module, nvfp4_nnx.Conv):  # QAT: one layer (stacks of convs are not converted)
        return module.qat and module.kernel[...].ndim == 4
    if type(module) not in (nnx.Linear, nnx.Conv) or module.kernel[...].shape[-2] % BLOCK:
        return False
    # A custom product (an fp8 or AQT dot_general, say) or a wider output type than the layer's
    # dtype is an NVFP4 layer cannot keep: such layers stay as they are.
    linear = type(module) is nnx.Linear
    product = module.dot_general if linear else module.conv_general_dilated
    if product is not (lax.dot_general if linear else lax.conv_general_dilated) or \
            getattr(module, "preferred_element_type", None) is not None:
        return False
    if linear:  # one layer, or a stack of them (nnx.vmap)
        return _layer_axes_last(module)
    # a 2-D conv (not a 1-D one stacked by nnx.vmap, whose kernel has 4 axes too)
    return (len(module.kernel_size) == 2 and module.kernel[...].ndim == 4
            and module.feature_group_count == 1
            and module.mask is None and _ones(module.input_dilation) and _padding_supported(module.padding))


def _layer_metadata(variable, depth: int) -> tuple[dict, tuple]:
    """The metadata of a variable stacked by nnx.vmap as one layer of the stack has it (its
    sharding names without the `depth` leading stack axes), and the stack axes' names (None where
    unnamed)."""
    metadata = dict(variable.get_metadata())
    stack = (None,) * depth
    for key in nvfp4_nnx.SHARDING_KEYS:
        if metadata.get(key):
            names = tuple(metadata[key])
            stack, metadata[key] = names[:depth], names[depth:]
    return metadata, stack


def _layer_axes_last(module) -> bool:
    """Whether a Linear's kernel ends with one layer's [in, out] axes: always for one layer, and
    for a stack where nnx.vmap put the stack axes first (out_axes=0, its default). A stack on
    other axes is left as it is: read as leading stack axes, its kernel would be misquantized.
    The kernel's shape alone cannot tell a stack of in_features layers on axis 1 from one on
    axis 0; its bias, stacked on the same axis, can ([out, E] against [E, out])."""
    columns = _core.kernel_outputs(module.out_features, getattr(module, "activation", None),
                                   type(module).__name__)
    shape = module.kernel[...].shape
    if module.bias is not None and module.bias[...].shape != (*shape[:-2], columns):
        return False
    return shape[-2:] == (module.in_features, columns)


def _stack_depth(module) -> int:
    """The stack axes of a Linear made by nnx.vmap (one layer's kernel is [in, out]). Stacks of
    convs are not converted."""
    linear = isinstance(module, (nnx.Linear, nvfp4_nnx.Linear))
    return module.kernel[...].ndim - 2 if linear else 0


def _padding_supported(padding) -> bool:
    try:
        _core.conv_padding(padding, "Conv")
    except (ValueError, TypeError):  # e.g. 'CIRCULAR', 'REFLECT'
        return False
    return True


def _to_nvfp4(module, act_quant: bool, act_s_enc, reduce_dtype):
    if isinstance(module, (nvfp4_nnx.Linear, nvfp4_nnx.Conv)):  # QAT -> inference, same options
        act_quant, act_s_enc = module.act_quant, module.act_s_enc
        reduce_dtype = module.reduce_dtype
    kwargs = dict(dtype=module.dtype, act_quant=act_quant, act_s_enc=act_s_enc,
                  reduce_dtype=reduce_dtype)
    if isinstance(module, nvfp4_nnx.Linear):
        kwargs["activation"] = module.activation
    if isinstance(module, (nnx.Conv, nvfp4_nnx.Conv)):
        cls = nvfp4_nnx.Conv
        kwargs.update(strides=module.strides, padding=module.padding,
                      kernel_dilation=module.kernel_dilation)
    else:
        cls = nvfp4_nnx.Linear
    bias = module.bias[...] if module.bias is not None else None
    depth = _stack_depth(module)
    if depth:
        # Each layer of the stack quantized on its own (one s_dec a layer), with the sharding
        # names of one layer; nnx.vmap stacks the layers again and puts the stack axes' names
        # back on the variables that have names, as it did on the float stack's. s_dec [E] has
        # none: it is replicated.
        kernel_metadata, stack = _layer_metadata(module.kernel, depth)
        bias_metadata, bias_stack = ({}, stack) if module.bias is None else \
            _layer_metadata(module.bias, depth)
        if any(bias_metadata.get(key) for key in nvfp4_nnx.SHARDING_KEYS) and bias_stack != stack:
            raise ValueError(f"quantize_model: a stack of {type(module).__name__} layers names "
                             f"its stack axes {stack} in the kernel but {bias_stack} in the bias")

        def build(kernel, bias):  # a closure: nnx.vmap does not wrap a keyword partial twice
            return cls.from_float(kernel, bias, kernel_metadata=kernel_metadata,
                                  bias_metadata=bias_metadata, **kwargs)

        for name in reversed(stack):  # the innermost stack axis first
            build = nnx.vmap(build, in_axes=0, out_axes=0,
                             transform_metadata={nnx.PARTITION_NAME: name})
        return build(module.kernel[...], bias)
    return cls.from_float(
        module.kernel[...], bias, kernel_metadata=module.kernel.get_metadata(),
        bias_metadata={} if module.bias is None else module.bias.get_metadata(), **kwargs)


def quantize_model(model, *, predicate: Predicate = quantize_all, act_quant: bool = False,
                   act_s_enc: float | None = None, reduce_dtype=None):
    """Converts an nnx model's float `nnx.Linear` / `nnx.Conv` layers (and QAT-mode NVFP4 layers,
    which keep their options) accepted by predicate(path, kernel) into inference-mode NVFP4
    `Linear` / `Conv` layers, in place; returns the model (the new layer itself when `model` is
    one layer). A stack of Linear layers made by nnx.vmap becomes a stack of NVFP4 layers (each
    quantized on its own, one s_dec a layer; sharding names carried over, the stack axes'
    included); its stack axes must lead (nnx.vmap's default out_axes=0), a stack on other axes
    is left as it is. Convolutions NVFP4 cannot represent (feature groups, input dilation, masks,
    circular or negative padding) stay float. An error names the layer's path.
    `act_quant`/`act_s_enc` set W4A4 and `reduce_dtype` the row-parallel sum's dtype on the
    converted float layers.
    Keep the float model with `nnx.clone(model)` first if you still need it."""
    modules = list(nnx.iter_modules(model))
    # Every replacement is built before the model changes, so an error leaves it as it was.
    new_of = {}
    for path, m in modules:
        if not (_convertible(m) and predicate(path, m.kernel[...])):
            continue
        try:
            new_of[id(m)] = _to_nvfp4(m, act_quant, act_s_enc, reduce_dtype)
        except (ValueError, TypeError) as e:
            if type(e) not in (ValueError, TypeError):  # a subclass may take other arguments
                raise
            where = "/".join(map(str, path)) or "(the model itself)"
            raise type(e)(f"quantize_model: layer {where}: {e}") from e
    if id(model) in new_of:
        return new_of[id(model)]
    # Each module once (iter_modules visits a shared one once): every attribute that refers to
    # a converted layer, directly or inside a dict / list / tuple, is pointed at its new layer,
    # so layers used in several places stay shared.
    for _, module in modules:
        for name, value in list(vars(module).items()):
            if name.startswith("_pytree__"):  # nnx's own bookkeeping, never a layer
                continue
            swapped = _swapped(value, new_of)  # private attributes too: nnx visits them
            if swapped is not value:
                setattr(module, name, swapped)
    return model


def _swapped(value, new_of: dict):
    """`value` with the modules of new_of (by id) replaced: itself if none is in it, else the new
    module or container (a dict or list updated in place is returned as itself)."""
    if id(value) in new_of:
        return new_of[id(value)]
    if isinstance(value, dict):
        for key, item in list(value.items()):
            value[key] = _swapped(item, new_of)
    elif isinstance(value, list):
        value[:] = [_swapped(item, new_of) for item in value]
    elif isinstance(value, tuple):
        items = [_swapped(item, new_of) for item in value]
        if any(a is not b for a, b in zip(items, value)):
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


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


def trainable_mask(params):
    """A mask for `optax.masked` (a prefix of `params`): False at each NVFP4Array, True at every
    other leaf. linen inference layers keep their NVFP4Array in the 'params' collection, where
    `jax.grad` gives its float4/float8 fields zero gradients; an optimizer that divides by its
    second moment (Adam) turns those zeros into NaN, and weight decay would shift the codes. So
    fine-tune the float leaves of a converted tree only:
    `optax.masked(optax.adam(lr), convert.trainable_mask(params))`. (nnx keeps NVFP4 weights in
    `NVFP4Param`, which `nnx.Optimizer(wrt=nnx.Param)` skips.)"""
    is_nvfp4 = lambda leaf: isinstance(leaf, NVFP4Array)  # noqa: E731
    return jax.tree.map(lambda leaf: not is_nvfp4(leaf), params, is_leaf=is_nvfp4)


# flax.serialization (msgpack `to_bytes`, `to_state_dict`) sees an NVFP4Array as its three fields.


def _nvfp4_to_state_dict(q: NVFP4Array) -> dict:
    return {f: serialization.to_state_dict(getattr(q, f)) for f in FIELDS}


def _nvfp4_from_state_dict(target: NVFP4Array, state: dict) -> NVFP4Array:
    missing = [f for f in FIELDS if f not in state]
    if missing:
        raise ValueError(f"an NVFP4Array state needs the fields {FIELDS}; missing {missing}")
    return NVFP4Array(*(serialization.from_state_dict(getattr(target, f), state[f], name=f)
                        for f in FIELDS))


serialization.register_serialization_state(NVFP4Array, _nvfp4_to_state_dict, _nvfp4_from_state_dict,
                                           override=True)
