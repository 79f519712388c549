"""Runs the CUDA quantize/dequantize kernels on tail-heavy shapes, for compute-sanitizer:

    compute-sanitizer --tool memcheck python3 bench/memcheck_quantize.py

Exits non-zero if a result differs from the XLA reference (computed on the CPU)."""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_nvfp4
from jax_nvfp4 import reference

SHAPES = [(1, 16), (3, 48), (129, 80), (2, 130, 208), (257, 1040)]


def main() -> int:
    gpu = jax.devices("cuda")[0]
    cpu = jax.devices("cpu")[0]
    quantize_ref = jax.jit(reference.quantize)
    dequantize_ref = jax.jit(functools.partial(reference.dequantize, dtype=jnp.bfloat16))
    cpu_quantize = lambda x: quantize_ref(jax.device_put(x, cpu))  # noqa: E731
    cpu_dequantize = lambda *q: dequantize_ref(*jax.device_put(q, cpu))  # noqa: E731
    failures = 0
    for shape in SHAPES:
        for dtype in (np.float32, jnp.bfloat16, np.float16):
            x = np.random.default_rng(len(shape)).standard_normal(shape).astype(dtype)
            q = jax_nvfp4.quantize(jax.device_put(x, gpu))
            want = cpu_quantize(x)
            got = (q.codes, q.scales, q.s_dec)
            same = all(np.array_equal(np.atleast_1d(np.asarray(a)).view(np.uint8),
                                      np.atleast_1d(np.asarray(b)).view(np.uint8))
                       for a, b in zip(got[1:], want[1:]))
            same &= np.array_equal(np.asarray(got[0]).astype(np.float32),
                                   np.asarray(want[0]).astype(np.float32))
            back = jax_nvfp4.dequantize(q, jnp.bfloat16)
            same &= np.array_equal(np.asarray(back).view(np.uint16),
                                   np.asarray(cpu_dequantize(*want)).view(np.uint16))
            print(f"{shape} {np.dtype(dtype).name}: {'ok' if same else 'MISMATCH'}")
            failures += not same
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
