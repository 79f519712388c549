"""The FFI calls inside XLA command buffers (CUDA graphs) on a GPU (skips without one).

Every handler is registered as command-buffer compatible and takes its workspace as an
XLA-allocated result, so XLA may record a loop of our calls once and replay it. These tests check
that it does (the handlers run on the host far fewer times than the kernels run) and that the
replays compute what separate calls do: a loop whose workspaces are reused every iteration (the
amax of quantize, the dequantized weights of the prefill GEMM) on data that changes every
iteration."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_nvfp4 as jn
from jax_nvfp4 import _extension
from jax_nvfp4.primitives.matmul import GEMM_TARGET
from jax_nvfp4.primitives.quantize import DEQUANTIZE_TARGET, QUANTIZE_TARGET


@pytest.fixture
def kernels(gpu_kernels):
    return gpu_kernels(GEMM_TARGET, QUANTIZE_TARGET, DEQUANTIZE_TARGET)


def _step(x, w):
    """One layer: a matmul (decode or prefill by x's rows), then a dynamic-amax quantization."""
    y = jn.matmul(x, w, out_dtype=jnp.float32)
    return jn.dequantize(jn.quantize(y), jnp.bfloat16) * 0.5


def _loop(x0, w, steps):
    return lax.fori_loop(0, steps, lambda i, x: _step(x + i.astype(x.dtype), w), x0)


def _operands(m, k=256):
    rng = np.random.default_rng(m)
    x0 = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w = jn.quantize(jnp.asarray(rng.standard_normal((k, k)) * 0.1, jnp.float32))
    return x0, w


def test_a_loop_of_calls_runs_the_handlers_once_not_every_iteration(kernels):
    x0, w = _operands(1)
    steps = 32
    looped = jax.jit(_loop, static_argnums=2)
    targets = (GEMM_TARGET, QUANTIZE_TARGET, DEQUANTIZE_TARGET)
    start = {t: _extension.host_calls(t) for t in targets}
    looped(x0, w, steps).block_until_ready()  # compile and record
    before = {t: _extension.host_calls(t) for t in targets}
    # the loop does reach every handler (not the XLA reference), at least while it is recorded
    assert all(before[t] > start[t] for t in targets), (start, before)
    looped(x0, w, steps).block_until_ready()
    ran = {t: _extension.host_calls(t) - n for t, n in before.items()}
    # Without a graph every iteration runs each handler (32 times); recorded, at most a re-record.
    assert all(n <= 2 for n in ran.values()), ran


# The sm_90a decode, fused and prefill paths (the last with cuBLASLt's GEMM where built).
@pytest.mark.parametrize("m", [1, 96, 1100])
def test_loop_of_calls_replays_like_separate_calls(kernels, m):
    x0, w = _operands(m)
    steps = 5
    looped = jax.jit(_loop, static_argnums=2)
    want = x0
    for i in range(steps):  # each call its own executable, no graph shared between them
        want = jax.jit(_step)(want + jnp.asarray(i, want.dtype), w)
    got = looped(x0, w, steps)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
