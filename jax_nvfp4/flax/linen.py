"""Flax linen layers with NVFP4 weights: `Dense`, `DenseGeneral` and `Conv`.

The attributes follow flax.linen's (features, use_bias, dtype, param_dtype, kernel_init,
bias_init; DenseGeneral's axis; Conv's kernel_size, strides, padding, kernel_dilation) plus:
- `qat`: keep a float master 'kernel' param (Flax's layout, [*in, *out] or HWIO) quantized in
  every forward pass with straight-through gradients; otherwise (inference) the 'kernel' param
  is an `NVFP4Array` ([N = prod(out), K = prod(in)], or [R, S, out, in] for Conv), which an
  optimizer must leave alone (`jax_nvfp4.flax.convert.trainable_mask`);
- `act_quant` / `act_s_enc`: W4A4 (quantize activations per call, or with a calibrated static
  encode scale) instead of the default W4A16;
- `reduce_dtype`: the dtype a row-parallel layer (input features split over devices) sums its
  partial products in across them: float32 (None, the default) or bfloat16 (`jax_nvfp4.matmul`);
- `activation` (Dense only): matmul's, in the GEMM's epilogue; with the gated "swiglu"/"geglu"
  the kernel has 2 * features columns (interleaved gate/up pairs) and the bias 2 * features.

Sharding: wrap `kernel_init` with `nn.with_logical_partitioning(init, names)` (or
`nn.with_partitioning`) in Flax's order, as for nn.Dense / nn.Conv. The NVFP4 fields are boxed
with the names moved to [..., out, in] (scales: [..., out tiles, in tiles, 32, 4, 4]); when
several axes are flattened into N or K, the outermost one's name is kept.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp
from flax.linen.linear import default_kernel_init

from jax_nvfp4.flax import _core
from jax_nvfp4.format import NVFP4Array

__all__ = ["Dense", "DenseGeneral", "Conv"]


def _layer_name(module) -> str:
    """How errors name a layer: its class, and its name where it has one (a top-level module
    applied on its own has none)."""
    kind = type(module).__name__
    return kind if module.name is None else f"{kind} {module.name!r}"


def quantize_kernel(kernel, layer: str, *, in_ndim: int = 1, conv: bool = False) -> NVFP4Array:
    """A float kernel, possibly boxed in nn.Partitioned / nn.LogicallyPartitioned -> its
    NVFP4Array, the codes and scales boxed with the mapped names:
    dense [*in, *out] (the first `in_ndim` axes are inputs) -> [prod(out), prod(in)];
    conv (HWIO) [R, S, in, out] -> [R, S, out, in]."""
    box = kernel if isinstance(kernel, nn.Partitioned) else None
    if box is None and isinstance(kernel, nn.meta.AxisMetadata):
        raise TypeError(f"{layer}: kernel metadata {type(kernel).__name__} is not supported; "
                        "use nn.with_partitioning or nn.with_logical_partitioning")
    value = jnp.asarray(box.value if box is not None else kernel)
    if conv:
        q = _core.quantize_kernel(value, conv=True)
    else:
        q = _core.quantize_kernel(value.reshape(math.prod(value.shape[:in_ndim]), -1))
    if box is None:
        return q
    names = tuple(box.names)
    if conv:
        lead, in_name, out_name = _core.split_kernel_names(names, layer)
    else:
        lead = ()
        in_name = _core.group_axis_name(names[:in_ndim], layer, "input")
        out_name = _core.group_axis_name(names[in_ndim:], layer, "output")
    fields = _core.nvfp4_field_names(in_name, out_name, lead)
    return NVFP4Array(box.replace(value=q.codes, names=fields["codes"]),
                      box.replace(value=q.scales, names=fields["scales"]), q.s_dec)


def _flax_kernel_init(module, in_ndim: int, conv: bool):
    """module.kernel_init as Flax's layers call it: a conv's on the HWIO shape, a dense kernel's
    on [prod(in), prod(out)] and reshaped to [*in, *out] (DenseGeneral's fan-in and fan-out)."""
    if conv:
        return module.kernel_init

    def init(rng, shape, dtype):
        kernel = module.kernel_init(rng, (math.prod(shape[:in_ndim]), math.prod(shape[in_ndim:])), dtype)
        if isinstance(kernel, nn.meta.AxisMetadata):
            return nn.meta.replace_boxed(kernel, jnp.reshape(kernel.unbox(), shape))
        return jnp.reshape(kernel, shape)

    return init


def _params(module, layer: str, kernel_shape, bias_shape, *, in_ndim: int = 1, conv: bool = False):
    """The module's 'kernel' param (the float master kernel with `qat`, else its NVFP4Array:
    `quantize_kernel` with in_ndim / conv) and its 'bias' param (None without `use_bias`)."""
    kernel_init = _flax_kernel_init(module, in_ndim, conv)
    if module.qat:
        kernel = module.param("kernel", kernel_init, kernel_shape, module.param_dtype)
    else:
        kernel = module.param("kernel", lambda rng: quantize_kernel(
            kernel_init(rng, kernel_shape, module.param_dtype), layer, in_ndim=in_ndim, conv=conv))
    # The layer's mode is `qat`, not the kind of params it is given: a float kernel in an inference
    # layer would be quantized on every call, an NVFP4 one in a QAT layer never trained.
    if module.qat and isinstance(kernel, NVFP4Array):
        raise TypeError(f"{layer}: qat=True trains a float 'kernel', but the params hold an "
                        "NVFP4Array (converted for inference); give it the float params, or "
                        "use qat=False")
    if not module.qat and not isinstance(kernel, NVFP4Array):
        raise TypeError(f"{layer}: an inference layer (qat=False) takes an NVFP4Array 'kernel', "
                        f"but the params hold a float array of shape {tuple(jnp.shape(kernel))}; "
                        "convert them with jax_nvfp4.flax.convert.quantize_params, or use "
                        "qat=True to train float weights")
    bias = None
    if module.use_bias:
        bias = module.param("bias", module.bias_init, bias_shape, module.param_dtype)
    return kernel, bias


def _apply(module, x, in_shape: tuple[int, ...], out_shape: tuple[int, ...], activation=None):
    """The parameters and forward pass of Dense/DenseGeneral: x [..., *in_shape] ->
    act(...) [..., *out_shape] (a gated activation: the kernel's and bias's last axis is twice
    out_shape's)."""
    layer = _layer_name(module)
    columns = _core.kernel_outputs(out_shape[-1], activation, layer)
    kernel_out = (*out_shape[:-1], columns)
    k, n = math.prod(in_shape), math.prod(kernel_out)
    _core.check_in_features(k, f"{layer} (input size {in_shape})")
    _core.check_act_quant(module.act_quant, module.act_s_enc, layer)
    kernel, bias = _params(module, layer, (*in_shape, *kernel_out), kernel_out,
                           in_ndim=len(in_shape))
    if module.qat:
        kernel = kernel.reshape(k, n)
    if bias is not None:
        bias = bias.reshape(n)
    lead = x.shape[:x.ndim - len(in_shape)]
    y = _core.dense(x.reshape(*lead, k), kernel, bias, in_features=k, dtype=module.dtype,
                    param_dtype=module.param_dtype, act_quant=module.act_quant,
                    act_s_enc=module.act_s_enc, reduce_dtype=module.reduce_dtype, layer=layer,
                    activation=activation)
    return y.reshape(*lead, *out_shape)


class Dense(nn.Module):
    """nn.Dense with an NVFP4 kernel: y = act(x @ kernel + bias) over x's last axis, whose size
    must be a multiple of 16 (`activation`: see the module docstring)."""

    features: int
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable = default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    qat: bool = False
    act_quant: bool = False
    act_s_enc: float | None = None
    reduce_dtype: Any = None
    activation: str | None = None

    @nn.compact
    def __call__(self, x):
        _core.check_out_features(self.features, f"{_layer_name(self)}: features")
        x = jnp.asarray(x)
        if x.ndim < 1:
            raise ValueError(f"{_layer_name(self)}: input must have rank >= 1, got a scalar")
        return _apply(self, x, (x.shape[-1],), (self.features,), self.activation)


class DenseGeneral(nn.Module):
    """nn.DenseGeneral with an NVFP4 kernel: contracts x's `axis` (their total size a multiple
    of 16) and produces `features` (an int or a tuple) as the trailing output axes. The kernel
    is Flax's [*in, *out] flattened to an NVFP4Array [prod(out), prod(in)]. (Flax's batch_dims
    is not supported.)"""

    features: int | Sequence[int]
    axis: int | Sequence[int] = -1
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable = default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    qat: bool = False
    act_quant: bool = False
    act_s_enc: float | None = None
    reduce_dtype: Any = None

    @nn.compact
    def __call__(self, x):
        layer = _layer_name(self)
        x = jnp.asarray(x)
        features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
        if not features:
            raise ValueError(f"{layer}: features must not be empty")
        for f in features:
            _core.check_out_features(f, f"{layer}: features {features}")
        axes = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
        norm = tuple(sorted(a + x.ndim if a < 0 else a for a in axes))  # as Flax orders them
        if not axes or any(not 0 <= a < x.ndim for a in norm) or len(set(norm)) != len(norm):
            raise ValueError(f"{layer}: axis={self.axis} is not a set of distinct axes of an "
                             f"input of shape {tuple(x.shape)}")
        # Contracting axes last, in the kernel's input-axis order.
        x = jnp.moveaxis(x, norm, tuple(range(x.ndim - len(norm), x.ndim)))
        return _apply(self, x, tuple(x.shape[x.ndim - len(norm):]), features)


class Conv(nn.Module):
    """nn.Conv (2-D, NHWC) with an NVFP4 filter. The float kernel is Flax's HWIO
    [R, S, in, out]; in inference mode the 'kernel' param is the NVFP4Array [R, S, out, in]
    `jax_nvfp4.conv` takes. The input channel count must be a multiple of 16. Padding: 'SAME',
    'SAME_LOWER', 'VALID', an int or ((lo, hi), (lo, hi)); feature groups, input dilation and
    masks are not supported. Inputs are [..., H, W, C] (batch dims optional)."""

    features: int
    kernel_size: int | Sequence[int]
    strides: int | Sequence[int] = 1
    padding: Any = "SAME"
    kernel_dilation: int | Sequence[int] = 1
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable = default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    qat: bool = False
    act_quant: bool = False
    act_s_enc: float | None = None
    reduce_dtype: Any = None

    @nn.compact
    def __call__(self, x):
        layer = _layer_name(self)
        _core.check_out_features(self.features, f"{layer}: features")
        _core.check_act_quant(self.act_quant, self.act_s_enc, layer)
        kernel_size = _core.kernel_pair(self.kernel_size, layer)
        x = jnp.asarray(x)
        if x.ndim < 3:
            raise ValueError(f"{layer}: input must be [..., H, W, C], got shape {tuple(x.shape)}")
        in_features = x.shape[-1]
        _core.check_in_features(in_features, f"{layer} (input channels)")
        kernel, bias = _params(self, layer, (*kernel_size, in_features, self.features),
                               (self.features,), conv=True)
        return _core.conv(x, kernel, bias, in_features=in_features,
                          strides=_core.pair(self.strides, "strides", layer),
                          padding=_core.conv_padding(self.padding, layer),
                          dilation=_core.pair(self.kernel_dilation, "kernel_dilation", layer),
                          dtype=self.dtype, param_dtype=self.param_dtype,
                          act_quant=self.act_quant, act_s_enc=self.act_s_enc,
                          reduce_dtype=self.reduce_dtype, layer=layer)
