"""Timing of jitted JAX calls on the device: the benchmarks (bench/) and the demo read GPU
time with it, not the host's dispatch of each call."""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax

TARGET_S = 0.02  # wall time of the shorter of the two runs a reading takes (LoopTimer)
WARM_S = 0.15  # untimed running of the loop before each reading (LoopTimer.__call__)
IDLE_S = 0.1  # idle GPU before each reading of a round-robin (interleaved_times)
ATTEMPTS = 5  # timed pairs of runs a reading may take before it gives up (LoopTimer.__call__)
# Operand sets a rotating loop calls fn on per iteration: 8 x 9.4 MB (the smallest NVFP4 weight
# benchmarked) exceed the L2 (H200 60 MB, H100 50 MB); fewer only where 8 would pass COPIES_BYTES
# a device, more where the operands are split over devices (rotation_copies).
COPIES = 8
COPIES_BYTES = 4 * 2**30


def bytes_a_device(leaf) -> int:
    """The bytes of `leaf` one device holds: all of them unless it is split over devices."""
    shards = getattr(leaf, "addressable_shards", None)
    return shards[0].data.nbytes if shards else leaf.nbytes


def rotation_copies(total_bytes: int, device_bytes: int) -> int:
    """Operand sets a rotating LoopTimer makes, for operands of `total_bytes` of which one device
    holds `device_bytes`: COPIES, times the split, so that a device rotates through as many bytes
    as one device holding them whole would (8 copies of a 4096 x 4096 NVFP4 weight split over 4
    GPUs are 19 MB a GPU, inside its L2); at most COPIES_BYTES a device."""
    split = -(-total_bytes // max(device_bytes, 1))
    return int(min(COPIES * split, max(1, COPIES_BYTES // max(device_bytes, 1))))


class LoopTimer:
    """A jitted loop of many calls of fn(*args), compiled and calibrated once, timed on demand.

    The trip count is static: XLA:GPU then runs the loop without reading its condition back to
    the host every iteration (a dynamic count costs a device->host sync, ~20-30 us, per call).
    With `rotate`, each iteration calls fn on COPIES copies of the operands, together larger
    than the L2 cache, so every call reads its weights from HBM as it would in a model; without
    it, one operand set stays warm in L2 (as PyTorch's timing loop leaves cuDNN's). The copy
    count does not depend on the operands' size (unless they are huge), so the loop's own
    per-iteration cost is spread over as many calls for a bf16 GEMV as for ours: sized by the L2
    alone, the bf16 dot's 117 MB weights got 2 copies and NVFP4's 33 MB 6. Operands split over
    devices get as many more copies as they are split (rotation_copies): each device then rotates
    through the bytes one device would. fn returns one array. With `chain`,
    each iteration calls fn that many times in a row on each operand set, each call's operands
    passed through an optimization barrier together with the previous call's output: the calls
    stay distinct (XLA cannot merge them) and run back to back, as PyTorch's are, and the loop's
    own per-iteration work (its counter kernel and launch gaps, ~10 us on an H200) is spread over
    them. Every output passes through an optimization barrier, so XLA must produce all of it, and
    only the sum of one element of each is carried to the next iteration: the loop state holds no
    whole output that XLA might copy into it every iteration, and that sum is one small kernel an
    iteration (a slice of each output carried on its own was one kernel per call, ~1-2 us each).

    A reading is the steady time of a call: runs of n and 2n iterations are timed back to back
    and the difference is divided by the n more iterations' calls. What a run costs once (its
    dispatch, the wait for its result, XLA's set-up of the loop) drops out of it: 0.4-1 ms a run on
    an H100 for loops of 128 chained convs, which read 0.15-0.35 us a call (1-2 %) high over runs
    of 16 iterations (bench/results/loop_fixed_cost_h100_2026-11-27.md). PyTorch's CUDA-graph timer
    (bench_conv.py) carries no such cost either: its events bracket the GPU work alone.

    fn is traced and compiled here, so anything read at lowering time (an environment variable
    that picks a kernel) takes effect for the lifetime of the timer."""

    def __init__(self, fn, args, rotate: bool = True, chain: int = 1):
        y0 = jax.eval_shape(fn, *args)
        leaves = jax.tree.leaves(args)
        copies = rotation_copies(sum(leaf.nbytes for leaf in leaves),
                                 sum(bytes_a_device(leaf) for leaf in leaves)) if rotate else 1
        self._sets = [args] + [jax.tree.map(lambda a: jnp.array(a, copy=True), args) for _ in range(copies - 1)]
        corner = (slice(0, 1),) * len(y0.shape)

        def make(n):
            @jax.jit
            def run(sets):
                def chained(a):  # the outputs of `chain` calls, each after the one before
                    ys = [fn(*a)]
                    for _ in range(chain - 1):
                        a, ys[-1] = lax.optimization_barrier((a, ys[-1]))
                        ys.append(fn(*a))
                    return ys

                def body(_, carry):
                    sets, _ = lax.optimization_barrier(carry)
                    outs = lax.optimization_barrier(tuple(y for a in sets for y in chained(a)))
                    return sets, sum(y[corner].astype(jnp.float32).sum() for y in outs)
                return lax.fori_loop(0, n, body, (sets, jnp.zeros((), jnp.float32)))[1]
            return run.lower(self._sets).compile()

        probe = make(8)
        jax.block_until_ready(probe(self._sets))
        t0 = time.perf_counter()
        jax.block_until_ready(probe(self._sets))
        calls = copies * chain  # per iteration
        per_call = (time.perf_counter() - t0) / (8 * calls)
        n = int(min(1000, max(16, TARGET_S / max(per_call * calls, 1e-7))))
        self._runs, self._calls = (make(n), make(2 * n)), n * calls
        for run in self._runs:
            jax.block_until_ready(run(self._sets))

    def __call__(self, warm_s: float = WARM_S) -> float:
        """Seconds per call: the loop run untimed (n iterations at a time) for at least `warm_s`
        seconds, then two timed runs, n and 2n iterations, their difference.

        The untimed running puts the GPU in this loop's steady state. Read right after another
        op's loop, a reading can be far off: Mixtral's grouped gate/up GEMM (a tensor-core-bound
        loop) read 17-25% high right after XLA's dequantize + ragged_dot, where identical timers
        read after one another agreed within 0.6-2.4% (a reading is a difference of two runs, so
        a drift within them weighs on it twice). One untimed n-run (56 ms) left 11% of it, three
        (170 ms) 1.3%, 150 ms 1.9%; a decode GEMV showed none
        (bench/results/timer_order_h200_2026-11-29.md). Such a fading is what a clock settling
        under a new load would give; the cause was not measured.

        The runs are timed on the host's clock. Where the host stalls in the n-run long enough to
        make it last as long as the 2n-run (24 test processes on one machine did), the pair says
        nothing: it is timed again, up to ATTEMPTS pairs, and a RuntimeError names the last
        pair's times if none holds."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warm_s:
            jax.block_until_ready(self._runs[0](self._sets))
        for _ in range(ATTEMPTS):
            seconds = []
            for run in self._runs:
                t0 = time.perf_counter()
                jax.block_until_ready(run(self._sets))
                seconds.append(time.perf_counter() - t0)
            if seconds[1] > seconds[0]:
                return (seconds[1] - seconds[0]) / self._calls
        raise RuntimeError(
            f"LoopTimer: the {2 * self._calls} calls' run took {seconds[1]:.6f} s, no longer than "
            f"the {self._calls} calls' run ({seconds[0]:.6f} s), in {ATTEMPTS} tries: the host "
            "is too busy to time this loop")


def loop_time(fn, args, rotate: bool = True, reps: int = 3) -> float:
    """Seconds per call of fn(*args): the median of `reps` runs of a LoopTimer."""
    timer = LoopTimer(fn, args, rotate)
    return statistics.median(timer() for _ in range(reps))


def interleaved_times(timers: dict, rounds: int = 7) -> dict:
    """Median seconds per call of each timer (a LoopTimer, or any callable that times one run and
    returns seconds per call), timed round-robin: every round runs each timer once, in turn.
    Timed one after the other instead, candidates see different GPU clocks (the clock falls as
    the GPU heats under back-to-back GEMMs), which biased same-run comparisons by up to 15%
    (bench/results/prefill_gemm_h200_2026-11-21.md).

    So that the timer read before one does not bias it, a LoopTimer's reading starts with WARM_S
    of its own loop untimed (LoopTimer.__call__), and each reading here follows IDLE_S of an idle
    GPU. The warm-up alone did not do: whichever GEMM was read right after bench_matmul's
    dequantize + dot peers read 5-10% slow on an H200 at its power cap, with 0.15, 0.5 or 1 s of
    it alike; 0.1 s idle before each reading removed that
    (bench/results/matmul_h200_2026-11-30_v29.md)."""
    samples = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            time.sleep(IDLE_S)
            samples[name].append(timer())
    return {name: statistics.median(ts) for name, ts in samples.items()}
