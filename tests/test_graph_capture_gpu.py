"""The FFI calls inside XLA command buffers (CUDA graphs) on a GPU (skips without one).

Every handler is registered as command-buffer compatible and takes its workspace as an
XLA-allocated result, so XLA may record a sequence of our calls once and replay it. These tests
check that it does (our custom calls sit in the compiled module's command-buffer computations)
and that replays compute what separate calls do: a loop of calls whose workspaces are reused
every iteration (the amax of quantize, the dequantized weights of the prefill GEMM) on data that
changes every iteration."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_nvfp4 as jn
from jax_nvfp4.primitives.matmul import GEMM_TARGET
from jax_nvfp4.primitives.quantize import DEQUANTIZE_TARGET, QUANTIZE_TARGET


@pytest.fixture
def kernels(gpu_kernels):
    return gpu_kernels(GEMM_TARGET, QUANTIZE_TARGET, DEQUANTIZE_TARGET)


def _step(x, w):
    """One layer: a matmul (decode or prefill by x's rows), then a dynamic-amax quantization."""
    y = jn.matmul(x, w, out_dtype=jnp.float32)
    return jn.dequantize(jn.quantize(y), jnp.bfloat16)[:, : x.shape[1]] * 0.5


def _loop(x0, w, steps):
    return lax.fori_loop(0, steps, lambda i, x: _step(x + i.astype(x.dtype), w), x0)


def _command_buffer_computations(hlo_text):
    """Bodies of the compiled module's command-buffer computations."""
    parts = re.split(r"\n(?=\S)", hlo_text)
    return [p for p in parts if re.match(r"(%?command_buffer\S*)\s", p)]


def _operands(m, k=256, n=256):
    rng = np.random.default_rng(m)
    x0 = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w = jn.quantize(jnp.asarray(rng.standard_normal((n, k)) * 0.1, jnp.float32))
    return x0, w


def test_a_sequence_of_calls_is_compiled_into_a_command_buffer(kernels):
    x0, w = _operands(1)
    text = jax.jit(lambda x, w: _step(_step(_step(x, w), w), w)).lower(x0, w).compile().as_text()
    captured = "\n".join(_command_buffer_computations(text))
    for target in (GEMM_TARGET, QUANTIZE_TARGET, DEQUANTIZE_TARGET):
        assert f'custom_call_target="{target}"' in captured, text[:6000]


@pytest.mark.parametrize("m", [1, 96])  # the sm_90a decode and prefill paths
def test_loop_of_calls_replays_like_separate_calls(kernels, m):
    x0, w = _operands(m)
    steps = 5
    looped = jax.jit(_loop, static_argnums=2)
    want = x0
    for i in range(steps):  # each call its own executable, no graph shared between them
        want = jax.jit(_step)(want + jnp.asarray(i, want.dtype), w)
    got = looped(x0, w, steps)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
