"""Flax nnx layers with NVFP4 weights.

`Linear` and `Conv` follow the constructors of `flax.nnx.Linear` / `flax.nnx.Conv`
(in_features, out_features, use_bias, dtype, param_dtype, kernel_init, bias_init, rngs,
kernel_metadata, bias_metadata; Conv's kernel_size, strides, padding, kernel_dilation). Two modes:

- inference (default): the weight is stored as NVFP4 in an `NVFP4Kernel` (codes, tiled scales and
  s_dec as `NVFP4Param` variables: saved and sharded with the model's state, never trained);
- `qat=True`: a float master kernel `nnx.Param` in Flax's layout ([in, out], or HWIO), quantized
  in every forward pass with straight-through gradients (`qat_matmul` / `qat_conv`).

Activations stay float (W4A16) unless `act_quant=True` (W4A4), which quantizes them on each call
with their own amax or with a calibrated static encode scale `act_s_enc`. `reduce_dtype` is the
dtype a row-parallel layer (input features split over devices) sums its partial products in
across them: float32 (None, the default) or bfloat16 (`jax_nvfp4.matmul`). `Linear`'s
`activation` (None, "relu", "gelu", "silu", or the gated "swiglu"/"geglu") runs in the GEMM's
epilogue; a gated Linear's kernel has 2 * out_features columns, interleaved gate/up pairs.

Sharding: annotate the kernel as for nnx.Linear / nnx.Conv, in Flax's order
(`kernel_init=nnx.with_partitioning(init, ("embed", "mlp"))` or `kernel_metadata=`); the NVFP4
fields get the names moved to their [..., out, in] layout (see `_core.nvfp4_field_names`).
"""

from __future__ import annotations

import typing as tp
from types import MappingProxyType

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd as core_spmd
from flax.nnx.nn.linear import default_bias_init, default_kernel_init

from jax_nvfp4.flax import _core
from jax_nvfp4.format import FIELDS, TILE_ROWS, NVFP4Array, reduce_dtype_of
from jax_nvfp4.sharding._specs import TILE_K, dim_axes, shard_count, whole_tiles

__all__ = ["Linear", "Conv", "NVFP4Kernel", "NVFP4Param"]

# The metadata key nnx reads a variable's sharding from (it has changed across Flax releases).
SHARDING_KEYS = ("out_sharding", "sharding_names", "sharding")


class NVFP4Param(nnx.Variable):
    """A field (codes, scales or s_dec) of a stored NVFP4 weight. Not an `nnx.Param`, so
    optimizers and `nnx.grad` leave it alone; `nnx.state(model)` saves it."""


def _unwrap(value) -> tuple[tp.Any, dict]:
    """An initializer's result -> (raw value, metadata such as nnx.with_partitioning's)."""
    if isinstance(value, nnx.VariableMetadata):
        return value.raw_value, dict(value.metadata)
    return value, {}


def _field_metadata(kernel_metadata: tp.Mapping, layer: str) -> dict[str, dict]:
    """Metadata of a float kernel ([in, out], or conv [R, S, in, out]) -> that of each NVFP4
    field."""
    common = {k: v for k, v in kernel_metadata.items() if k not in SHARDING_KEYS}
    fields = {f: dict(common) for f in FIELDS}
    for key in SHARDING_KEYS:
        names = kernel_metadata.get(key)
        if not names:
            continue
        lead, in_name, out_name = _core.split_kernel_names(names, f"{layer} ({key})")
        for field, field_names in _core.nvfp4_field_names(in_name, out_name, lead).items():
            if field_names:  # s_dec is replicated: no sharding entry
                fields[field][key] = field_names
    return fields


def _uneven_split(weight: NVFP4Array, fields, layer: str, detail: str = "") -> ValueError:
    names = {f: {k: v for k, v in fields[f].items() if k in SHARDING_KEYS} for f in fields}
    return ValueError(
        f"{layer}: the sharding of the NVFP4 weight {weight.shape} splits a dimension into "
        f"uneven parts on the mesh; NVFP4 splits rows by whole {TILE_ROWS}-row scale "
        f"tiles and K by whole {TILE_K}-element tiles (fields' names: "
        f"codes {names['codes']}, scales {names['scales']}). Replicate that dimension or "
        f"use a smaller mesh axis.{detail}")


def _check_whole_tiles(weight: NVFP4Array, fields, layer: str) -> None:
    """Raises where the codes' names split the weight's rows or K, over the current mesh, into
    parts that are not whole scale tiles: the scales could not split with the codes (JAX itself
    only refuses splits that do not divide the tile count, and a misaligned one would gather the
    weight on every call)."""
    codes = fields["codes"]
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty and codes.get("mesh") is not None:  # nnx.with_partitioning(..., mesh=mesh)
        mesh = codes["mesh"]
    names = next((codes[k] for k in SHARDING_KEYS if codes.get(k)), None)
    if mesh.empty or not names:
        return
    # Logical names reach the mesh through the rules, as Flax resolves them when it places the
    # variables: the context's (nnx.logical_axis_rules) and the variable's own (sharding_rules).
    context_rules = core_spmd.get_logical_axis_rules()
    if context_rules or codes.get("sharding_rules"):
        rules = core_spmd.composite_rules(context_rules, codes.get("sharding_rules", ()))
        names = core_spmd.from_sharding_rules(names, rules)
    for entry, size, tile in ((names[-2], weight.shape[-2], TILE_ROWS),
                              (names[-1], weight.shape[-1], TILE_K)):
        axes = tuple(a for a in dim_axes(entry) if a in mesh.axis_names)  # others: not mesh axes
        if shard_count(mesh, axes) > 1 and whole_tiles(mesh, axes, size, tile) != axes:
            raise _uneven_split(weight, fields, layer)


class NVFP4Kernel(nnx.Module):
    """An NVFP4 weight ([out, in], or [R, S, out, in] for a convolution) held as three
    `NVFP4Param` variables with their own sharding metadata. `.value` is the `NVFP4Array`."""

    def __init__(self, weight: NVFP4Array, metadata: tp.Mapping = MappingProxyType({}),
                 *, layer: str = "NVFP4Kernel"):
        weight.validate(f"{layer}: weight")
        fields = _field_metadata(metadata, layer)
        _check_whole_tiles(weight, fields, layer)
        try:  # under a mesh, each variable is placed with its sharding here
            self.codes = NVFP4Param(weight.codes, **fields["codes"])
            self.scales = NVFP4Param(weight.scales, **fields["scales"])
            self.s_dec = NVFP4Param(weight.s_dec, **fields["s_dec"])
        except ValueError as e:
            if type(e).__name__ != "IndivisibleError":
                raise
            raise _uneven_split(weight, fields, layer, f" JAX said: {str(e).splitlines()[0]}") from e

    @property
    def value(self) -> NVFP4Array:
        return NVFP4Array(self.codes[...], self.scales[...], self.s_dec[...])


def _make_kernel(kernel, qat: bool, kernel_metadata, layer: str, conv: bool = False):
    """The layer's kernel: the float master nnx.Param (QAT) or the quantized NVFP4Kernel."""
    if qat:
        return nnx.Param(kernel, **kernel_metadata)
    value, metadata = _unwrap(kernel)
    return NVFP4Kernel(_core.quantize_kernel(value, conv=conv), {**metadata, **kernel_metadata},
                       layer=layer)


def _make_bias(use_bias, bias_init, rngs, size, param_dtype, bias_metadata):
    if not use_bias:
        return nnx.data(None)
    return nnx.Param(bias_init(rngs.params(), (size,), param_dtype), **bias_metadata)


class _NVFP4Layer(nnx.Module):
    """What Linear and Conv share: their construction from float weights and the weight the
    forward pass uses."""

    kernel: nnx.Param | NVFP4Kernel
    bias: nnx.Param | None

    @property
    def weight(self):
        """The weight the forward pass multiplies by: an NVFP4Array (inference) or the float
        master kernel in Flax's layout (QAT)."""
        if isinstance(self.kernel, NVFP4Kernel):
            return self.kernel.value
        return self.kernel[...]

    def _bias(self):
        return self.bias[...] if self.bias is not None else None

    def _init_weights(self, kernel_shape, *, in_features, out_features, use_bias, dtype,
                      param_dtype, kernel_init, bias_init, qat, act_quant, act_s_enc,
                      reduce_dtype, rngs, kernel_metadata, bias_metadata, conv):
        """Checks the constructor's common arguments, then creates the kernel (float [*, in,
        out] from `kernel_init`, stored as NVFP4 unless `qat`) and the bias (one per kernel
        output column)."""
        layer = type(self).__name__
        _core.check_in_features(in_features, layer)
        _core.check_out_features(out_features, layer)
        _core.check_act_quant(act_quant, act_s_enc, layer)
        reduce_dtype = reduce_dtype_of(reduce_dtype, layer)
        kernel = kernel_init(rngs.params(), kernel_shape, param_dtype)
        self.kernel = _make_kernel(kernel, qat, kernel_metadata, layer, conv=conv)
        self.bias = _make_bias(use_bias, bias_init, rngs, kernel_shape[-1], param_dtype,
                               bias_metadata)
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.qat = qat
        self.act_quant = act_quant
        self.act_s_enc = act_s_enc
        self.reduce_dtype = reduce_dtype

    @classmethod
    def _from_float(cls, kernel, bias, layout: str, ndim: int, shape_args, kernel_metadata,
                    bias_metadata, kwargs):
        """from_float of a layer whose float kernel has `ndim` axes in `layout`; shape_args maps
        its shape to the constructor's leading arguments."""
        kernel = jnp.asarray(kernel)
        if kernel.ndim != ndim:
            raise ValueError(f"{cls.__name__}.from_float: kernel must be {layout}, got shape "
                             f"{kernel.shape}")
        param_dtype = kwargs.pop("param_dtype", kernel.dtype)  # as a layer initialized in it
        kernel = kernel.astype(param_dtype)
        return cls(*shape_args(kernel.shape), use_bias=bias is not None, param_dtype=param_dtype,
                   kernel_init=lambda *_: kernel,
                   bias_init=lambda *_: jnp.asarray(bias, param_dtype),
                   kernel_metadata=kernel_metadata, bias_metadata=bias_metadata,
                   rngs=nnx.Rngs(0), **kwargs)


class Linear(_NVFP4Layer):
    """y = x @ kernel + bias with an NVFP4 kernel (see the module docstring for the modes).

    Args beyond nnx.Linear's: `qat` (float master weights, straight-through gradients),
    `act_quant` (W4A4: quantize the activations too), `act_s_enc` (a calibrated static
    activation encode scale, e.g. from `activation_s_enc`; None derives it per call),
    `reduce_dtype` (float32 or bfloat16: what a row-parallel layer's cross-device sum is in),
    `activation` (matmul's, applied in the GEMM's epilogue; the gated "swiglu"/"geglu" make the
    kernel [in, 2 * out_features] with gate/up columns interleaved, as
    `interleave_gate_up(gate.T, up.T).T`, and the bias 2 * out_features).
    `in_features` must be a multiple of 16 (NVFP4 blocks along the input axis)."""

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
                 dtype=None, param_dtype=jnp.float32, kernel_init=default_kernel_init,
                 bias_init=default_bias_init, qat: bool = False, act_quant: bool = False,
                 act_s_enc: float | None = None, reduce_dtype=None, activation=None,
                 rngs: nnx.Rngs,
                 kernel_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
                 bias_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({})):
        _core.check_out_features(out_features, type(self).__name__)
        columns = _core.kernel_outputs(out_features, activation, type(self).__name__)
        self.activation = activation
        self._init_weights((in_features, columns), in_features=in_features,
                           out_features=out_features, use_bias=use_bias, dtype=dtype,
                           param_dtype=param_dtype, kernel_init=kernel_init, bias_init=bias_init,
                           qat=qat, act_quant=act_quant, act_s_enc=act_s_enc,
                           reduce_dtype=reduce_dtype, rngs=rngs, kernel_metadata=kernel_metadata,
                           bias_metadata=bias_metadata, conv=False)

    @classmethod
    def from_float(cls, kernel, bias=None, *, kernel_metadata: tp.Mapping = MappingProxyType({}),
                   bias_metadata: tp.Mapping = MappingProxyType({}), **kwargs) -> "Linear":
        """An inference-mode layer from trained float weights: kernel [in, out] (Flax layout;
        with a gated `activation`, out = 2 * out_features interleaved gate/up columns), bias
        [out] or None. Metadata (e.g. sharding) is that of the float variables. `param_dtype`
        (default: the kernel's dtype) is the dtype the kernel is cast to before it is quantized
        and the bias is kept in, as in a layer initialized in it. Other keyword arguments are the
        constructor's (dtype, act_quant, act_s_enc, activation, ...), but for use_bias,
        kernel_init, bias_init and rngs, which the weights given decide."""
        activation = kwargs.get("activation")

        def shape_args(shape):  # kernel [in, columns] -> (in_features, out_features)
            per_output = _core.kernel_outputs(1, activation, f"{cls.__name__}.from_float")
            if shape[1] % per_output:
                raise ValueError(f"{cls.__name__}.from_float: activation={activation!r} needs an "
                                 f"even number of kernel columns (gate/up pairs), got kernel "
                                 f"shape {tuple(shape)}")
            return shape[0], shape[1] // per_output

        return cls._from_float(kernel, bias, "[in, out]", 2, shape_args, kernel_metadata,
                               bias_metadata, kwargs)

    def __call__(self, x, out_sharding=None):
        """`out_sharding`, as nnx.Linear's: the output's PartitionSpec on Explicit mesh axes (a
        row-parallel layer's output is otherwise replicated after its sum)."""
        y = _core.dense(x, self.weight, self._bias(), in_features=self.in_features,
                        dtype=self.dtype, param_dtype=self.param_dtype,
                        act_quant=self.act_quant, act_s_enc=self.act_s_enc,
                        reduce_dtype=self.reduce_dtype, layer=type(self).__name__,
                        activation=self.activation)
        return y if out_sharding is None else jax.sharding.reshard(y, out_sharding)


class Conv(_NVFP4Layer):
    """A 2-D NHWC convolution with an NVFP4 filter, following flax.nnx.Conv's constructor
    (in_features, out_features, kernel_size, strides, padding, kernel_dilation, use_bias, dtype,
    param_dtype, kernel_init, bias_init, rngs, kernel_metadata, bias_metadata) plus `qat`,
    `act_quant`, `act_s_enc` and `reduce_dtype` as in `Linear`. The float kernel is Flax's HWIO
    [R, S, in, out]; stored as NVFP4 it is [R, S, out, in] (see `jax_nvfp4.conv`).
    `in_features` must be a multiple of 16. Padding: 'SAME', 'SAME_LOWER', 'VALID', an int or
    ((lo, hi), (lo, hi)); feature groups, input dilation and masks are not supported.
    Inputs are [..., H, W, in_features] (batch dims optional)."""

    def __init__(self, in_features: int, out_features: int, kernel_size: int | tp.Sequence[int],
                 strides: int | tp.Sequence[int] = 1, *, padding="SAME",
                 kernel_dilation: int | tp.Sequence[int] = 1, use_bias: bool = True,
                 dtype=None, param_dtype=jnp.float32, kernel_init=default_kernel_init,
                 bias_init=default_bias_init, qat: bool = False, act_quant: bool = False,
                 act_s_enc: float | None = None, reduce_dtype=None, rngs: nnx.Rngs,
                 kernel_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({}),
                 bias_metadata: tp.Mapping[str, tp.Any] = MappingProxyType({})):
        layer = type(self).__name__
        self.kernel_size = _core.kernel_pair(kernel_size, layer)
        self.strides = _core.pair(strides, "strides", layer)
        self.kernel_dilation = _core.pair(kernel_dilation, "kernel_dilation", layer)
        self.padding = _core.conv_padding(padding, layer)
        self._init_weights((*self.kernel_size, in_features, out_features),
                           in_features=in_features, out_features=out_features,
                           use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                           kernel_init=kernel_init, bias_init=bias_init, qat=qat,
                           act_quant=act_quant, act_s_enc=act_s_enc, reduce_dtype=reduce_dtype,
                           rngs=rngs, kernel_metadata=kernel_metadata,
                           bias_metadata=bias_metadata, conv=True)

    @classmethod
    def from_float(cls, kernel, bias=None, *, kernel_metadata: tp.Mapping = MappingProxyType({}),
                   bias_metadata: tp.Mapping = MappingProxyType({}), **kwargs) -> "Conv":
        """An inference-mode layer from trained float weights: kernel HWIO [R, S, in, out],
        bias [out] or None; other keyword arguments as `Linear.from_float`'s."""
        return cls._from_float(kernel, bias, "HWIO [R, S, in, out]", 4,
                               lambda shape: (shape[2], shape[3], shape[:2]), kernel_metadata,
                               bias_metadata, kwargs)

    def __call__(self, x, out_sharding=None):
        """`out_sharding`: as nnx.Conv's (see `Linear`)."""
        y = _core.conv(x, self.weight, self._bias(), in_features=self.in_features,
                       strides=self.strides, padding=self.padding,
                       dilation=self.kernel_dilation, dtype=self.dtype,
                       param_dtype=self.param_dtype, act_quant=self.act_quant,
                       act_s_enc=self.act_s_enc, reduce_dtype=self.reduce_dtype,
                       layer=type(self).__name__)
        return y if out_sharding is None else jax.sharding.reshard(y, out_sharding)
