"""Does a LoopTimer's reading depend on when it was made, where it runs in a round, or which
op's loop ran just before it?

    python bench/bench_timer_order.py --out DIR [--only-between]

The benchmarks time several ops of a shape with one LoopTimer each, read round-robin
(jax_nvfp4.timing.interleaved_times). Here the timers of a case that are compared time the same
op on the same operands (each with its own rotating copies), so any difference between them is
the method's.
- Identical timers, read without warm-up in two schemes: "fixed", each round in the order the
  timers were made, and "rotated", round r starting at timer r mod count, so that every timer
  takes every place in a round. A spread in "fixed" that "rotated" removes would be the place in
  the round; one that stays, the order the timers were made (executables, copies' addresses).
- Identical timers made, and read, between timers of another op (as bench_matmul and
  bench_ragged make theirs), each reading after 0-300 ms of untimed running of its own loop
  (LoopTimer's warm-up, jax_nvfp4.timing.WARM_S), and, as the control, read among themselves
  only.
Its readings follow one another without the idle gap the benchmarks now leave before each
(jax_nvfp4.timing.IDLE_S, bench/results/matmul_h200_2026-11-30_v29.md): it reads the bare method.
Results: DIR/timer_order_<device>.md.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jax_nvfp4 as nv
from jax_nvfp4.primitives.ragged import RAGGED_PATH_ENV
from jax_nvfp4.timing import WARM_S, LoopTimer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ragged import expert_weights, routing  # noqa: E402
from report import DEFAULT_OUT, timer_forcing, write_table  # noqa: E402


def cases():
    """(name, fn, operands) of each op timed: decode and prefill GEMMs, ours and bf16, and a
    ragged MoE layer."""
    keys = jax.random.split(jax.random.key(0), 2)
    n, k = 14336, 4096
    w = (jax.random.normal(keys[0], (n, k), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    wq = nv.quantize(w)
    for m in (1, 16, 4096):
        x = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
        yield f"ours W4A16 {m} x {n} x {k}", nv.matmul, (x, wq)
        yield f"bf16 jnp.dot {m} x {n} x {k}", lambda a, b: a @ b.T, (x, w)
    yield ragged_case()


def ragged_case():
    """(name, fn, operands) of Mixtral-8x7B's gate/up experts at 384 tokens (bench_ragged)."""
    keys = jax.random.split(jax.random.key(1), 2)
    groups, n, k = 8, 28672, 4096
    eq, _ = expert_weights(keys[0], groups, n, k)
    sizes = routing(384, groups, 2, seed=384)
    x = jax.random.normal(keys[1], (int(sizes.sum()), k), jnp.bfloat16)
    return ("ours ragged Mixtral-8x7B w1+w3, 384 tokens",
            functools.partial(nv.ragged_matmul, activation="swiglu"), (x, eq, jnp.asarray(sizes)))


def made_between(count: int):
    """The cases where identical timers are made, and read, between timers of another op, as
    the benchmarks make them: (name, timers, which of them are the identical ones). Ours at M = 1
    between jax_nvfp4.dequantize (the kernel) + a bf16 dot of the same shape, and the ragged
    layer (auto path) between XLA's path (dequantize + ragged_dot, which allocates 1.9 GB
    temporaries), every ragged timer made with JAX's caches cleared around it
    (report.timer_forcing)."""
    keys = jax.random.split(jax.random.key(2), 2)
    w = (jax.random.normal(keys[0], (14336, 4096), jnp.float32) / 64).astype(jnp.bfloat16)
    dense = (nv.matmul, (jax.random.normal(keys[1], (1, 4096), jnp.bfloat16), nv.quantize(w)))
    dequant_dot = lambda x, q: x @ nv.dequantize(q).T  # noqa: E731
    _, fn, ops = ragged_case()
    for name, make, make_other in [
            ("ours W4A16 1 x 14336 x 4096, made between dequantize + dot timers",
             lambda: LoopTimer(*dense), lambda: LoopTimer(dequant_dot, dense[1])),
            ("ours ragged Mixtral-8x7B w1+w3, 384 tokens, made between XLA-path timers",
             lambda: timer_forcing(RAGGED_PATH_ENV, "auto", fn, ops),
             lambda: timer_forcing(RAGGED_PATH_ENV, "xla", fn, ops))]:
        timers, identical = [], []
        for i in range(count):
            if i:
                timers.append(make_other())
            identical.append(len(timers))
            timers.append(make())
        yield name, timers, identical


def read(timers: list, rounds: int, rotate: bool, warm_s: float) -> list[float]:
    """Median seconds per call of each timer over `rounds` rounds, each round in the order made
    or (rotate) starting one timer later than the round before; each reading after `warm_s`
    seconds of untimed runs."""
    samples = [[] for _ in timers]
    for r in range(rounds):
        start = r % len(timers) if rotate else 0
        for i in range(len(timers)):
            j = (start + i) % len(timers)
            samples[j].append(timers[j](warm_s))
    return [statistics.median(s) for s in samples]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--count", type=int, default=4, help="identical timers a case")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--only-between", action="store_true",
                    help="only the cases of timers made between another op's")
    args = ap.parse_args()
    device = jax.devices()[0].device_kind
    lines = [f"# LoopTimer readings by the order made and the place in a round, {device}", "",
             f"jax {jax.__version__} · {args.count} identical LoopTimers a case, made in order "
             f"0..{args.count - 1}, read {args.rounds} rounds in each scheme (fixed: made order "
             f"every round; rotated: round r starts at timer r mod {args.count}), without warm-up "
             f"unless a scheme names one; 'made between': each identical timer after one of "
             f"the other op, all read in made order, or 'identical only' among themselves · us "
             f"per call, median · spread: slowest / fastest - 1", "",
             "| case | scheme | " + " | ".join(f"timer {i}" for i in range(args.count))
             + " | spread |",
             "|---|---|" + "---:|" * (args.count + 1)]
    for name, fn, ops in [] if args.only_between else cases():
        timers = [LoopTimer(fn, ops) for _ in range(args.count)]
        for scheme in ("fixed", "rotated", "fixed"):
            us = [t * 1e6 for t in read(timers, args.rounds, scheme == "rotated", 0.0)]
            lines.append(f"| {name} | {scheme} | " + " | ".join(f"{u:.2f}" for u in us)
                         + f" | {100 * (max(us) / min(us) - 1):.1f}% |")
            print(lines[-1], flush=True)
        del timers
    for name, timers, identical in made_between(args.count):
        for warm_s in (0.0, 0.05, WARM_S, 0.3, None):
            if warm_s is None:  # the other op's timers made, not read
                scheme = "identical only"
                chosen = [timers[i] for i in identical]
                us = [t * 1e6 for t in read(chosen, args.rounds, False, 0.0)]
            else:
                scheme = f"fixed, {1000 * warm_s:.0f} ms warm-up"
                us = [t * 1e6 for t in read(timers, args.rounds, False, warm_s)]
                us = [us[i] for i in identical]
            lines.append(f"| {name} | {scheme} | " + " | ".join(f"{u:.2f}" for u in us)
                         + f" | {100 * (max(us) / min(us) - 1):.1f}% |")
            print(lines[-1], flush=True)
        del timers
    write_table(lines, args.out, "timer_order", device)


if __name__ == "__main__":
    main()
