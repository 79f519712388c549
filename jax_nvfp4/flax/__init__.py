"""Flax layers with NVFP4 weights (`nnx` and `linen`), conversion of float models, and training
(quantization-aware, straight-through gradients). See docs/flax.md.

    from jax_nvfp4.flax import convert, linen as nvlinen, nnx as nvnnx
"""

from jax_nvfp4.flax import convert, linen, nnx
from jax_nvfp4.flax._core import activation_s_enc
from jax_nvfp4.primitives.autodiff import qat_conv, qat_matmul

__all__ = ["nnx", "linen", "convert", "activation_s_enc", "qat_matmul", "qat_conv"]
