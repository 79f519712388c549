"""Timing of jitted JAX calls on the device, shared by the benchmarks."""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax

TARGET_S = 0.02  # wall time of one timed loop
L2_BYTES = 60 * 2**20  # H200 (H100: 50 MB): operand sets rotate through more than this


def loop_time(fn, args, rotate: bool = True) -> float:
    """Seconds per call of fn(*args), timed inside one jitted fori_loop.

    The trip count is static: XLA:GPU then runs the loop without reading its condition back to
    the host every iteration (a dynamic count costs a device->host sync, ~20-30 us, per call).
    With `rotate`, each iteration calls fn on several copies of the operands, together larger
    than the L2 cache, so every call reads its weights from HBM as it would in a model; without
    it, one operand set stays warm in L2 (as PyTorch's timing loop leaves cuDNN's). Every output
    passes through an optimization barrier, so XLA must produce all of it, and only a one-element
    slice of it is carried to the next iteration: the loop state holds no whole output that XLA
    might copy into it every iteration."""
    y0 = jax.eval_shape(fn, *args)
    nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(args))
    copies = int(min(8, max(1, -(-3 * L2_BYTES // nbytes)))) if rotate else 1
    sets = [args] + [jax.tree.map(lambda a: jnp.array(a, copy=True), args) for _ in range(copies - 1)]
    corner = (slice(0, 1),) * len(y0.shape)

    def make(n):
        @jax.jit
        def run(sets):
            def body(_, carry):
                sets, _ = lax.optimization_barrier(carry)
                outs = lax.optimization_barrier(tuple(fn(*a) for a in sets))
                return sets, tuple(y[corner] for y in outs)
            zeros = tuple(jnp.zeros((1,) * len(y0.shape), y0.dtype) for _ in sets)
            return lax.fori_loop(0, n, body, (sets, zeros))[1]
        return run

    def timed(run, reps):
        jax.block_until_ready(run(sets))
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(run(sets))
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    probe = timed(make(8), 1) / (8 * copies)
    n = int(min(1000, max(16, TARGET_S / max(probe * copies, 1e-7))))
    return timed(make(n), 3) / (n * copies)
