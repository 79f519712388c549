"""Flax layers with NVFP4 weights (`nnx` and `linen`), checkpoint conversion and training.

    from jax_nvfp4.flax import nnx as nvnnx, linen as nvlinen, convert
"""

from jax_nvfp4.flax import convert, linen, nnx
from jax_nvfp4.flax._core import activation_s_enc
from jax_nvfp4.primitives.autodiff import qat_matmul

__all__ = ["nnx", "linen", "convert", "activation_s_enc", "qat_matmul"]
