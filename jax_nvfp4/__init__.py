"""jax_nvfp4: NVFP4 (4-bit E2M1 + E4M3 block scales) quantization, GEMM and convolution for JAX.

CUDA kernels (Hopper sm_90a, Blackwell sm_100a) behind XLA FFI custom calls, with a pure-JAX
reference path on every other platform."""

from jax_nvfp4 import _extension
from jax_nvfp4.convolution import conv, quantize_conv_weight
from jax_nvfp4.format import NVFP4Array
from jax_nvfp4.gemm import interleave_gate_up, matmul
from jax_nvfp4.primitives import autodiff as _autodiff  # noqa: F401  (registers grad rules)
from jax_nvfp4.quantization import dequantize, quantize
from jax_nvfp4.ragged_gemm import ragged_matmul
from jax_nvfp4.selftest import selftest

__version__ = "0.1.0"

__all__ = ["NVFP4Array", "quantize", "dequantize", "matmul", "ragged_matmul", "interleave_gate_up", "conv",
           "quantize_conv_weight", "selftest", "cuda_archs", "__version__"]

cuda_archs = _extension.cuda_archs
