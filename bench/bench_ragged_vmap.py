"""ragged_matmul under jax.vmap: a batch of B independent routings (B sequences, each of T tokens
routed to its own experts) in one run on one GPU.

    python bench/bench_ragged_vmap.py --out DIR

vmap of ragged_matmul folds the batch into one call: its B * T * top_k rows sorted by expert
(an argsort), one kernel launch over them, the results gathered back in place. Beside it:
  NVFP4 sorted   the same launch on rows already sorted by expert: what the fold costs on top;
  NVFP4 map      lax.map of ragged_matmul, one launch an element (vmap's rule before the fold),
                 which reads each element's experts' weights again;
  bf16 sorted    bf16 lax.ragged_dot on the rows already sorted by expert (the sort not timed):
                 jax's vmap of lax.ragged_dot with a batched group_sizes raises
                 NotImplementedError, so this hand-flattened call is the bf16 peer;
  bf16 map       lax.map of bf16 lax.ragged_dot.
Layers, routing and timing as bench_ragged.py (weights rotated past the L2, medians of round-robin
LoopTimer readings, us per call of the whole batch). Results: DIR/ragged_vmap_<device>.md.
"""

from __future__ import annotations

import datetime
import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_nvfp4 as nv
from jax_nvfp4.timing import LoopTimer, interleaved_times

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ragged import LAYERS, bf16_ragged_dot, expert_weights, routing  # noqa: E402
from report import table_parser, write_table  # noqa: E402

# (layer, batch elements B, tokens per element T)
CASES = [(layer[0], b, t) for layer in LAYERS if "w1+w3" in layer[0]
         for b, t in ((8, 1), (64, 1), (8, 16))]


def run(out_dir: Path, rounds: int):
    name = jax.devices()[0].device_kind
    lines = [f"# ragged_matmul under vmap on {name}", "",
             f"{datetime.date.today()} · jax {jax.__version__} · bf16 x and output · us per call of "
             f"the whole batch (median of round-robin LoopTimer readings, weights rotated past the "
             f"L2) · B elements of T tokens, each element routed on its own",
             "",
             "| layer | B | T | rows | experts used | NVFP4 vmap | NVFP4 sorted | NVFP4 map | "
             "bf16 sorted | bf16 map | vmap vs NVFP4 map | vmap vs bf16 sorted |",
             "|---|" + "---:|" * 11]
    keys = jax.random.split(jax.random.key(0), 2)
    for layer, groups, n, k, activation, top_k in LAYERS:
        cases = [(b, t) for name_, b, t in CASES if name_ == layer]
        if not cases:
            continue
        wq, w_kn = expert_weights(keys[0], groups, n, k)
        ours = functools.partial(nv.ragged_matmul, activation=activation)
        bf16 = functools.partial(bf16_ragged_dot, activation=activation)

        def per_element(fn):
            return lambda x, w, sizes: lax.map(lambda xs: fn(xs[0], w, xs[1]), (x, sizes))

        for b, t in cases:
            sizes = np.stack([routing(t, groups, top_k, seed=1000 * b + e) for e in range(b)])
            rows = t * top_k
            x = jax.random.normal(keys[1], (b, rows, k), jnp.bfloat16)
            # The batch's rows sorted by expert, and the summed sizes: what the fold builds.
            group_of_row = np.concatenate([np.repeat(np.arange(groups), s) for s in sizes])
            x_sorted = x.reshape(b * rows, k)[np.argsort(group_of_row, kind="stable")]
            total = jnp.asarray(sizes.sum(0), jnp.int32)
            s = jnp.asarray(sizes)
            timers = {"vmap": LoopTimer(jax.vmap(ours, (0, None, 0)), (x, wq, s)),
                      "sorted": LoopTimer(ours, (x_sorted, wq, total)),
                      "map": LoopTimer(per_element(ours), (x, wq, s)),
                      "bf16 sorted": LoopTimer(bf16, (x_sorted, w_kn, total)),
                      "bf16 map": LoopTimer(per_element(bf16), (x, w_kn, s))}
            us = {key: v * 1e6 for key, v in interleaved_times(timers, rounds).items()}
            lines.append(f"| {layer} | {b} | {t} | {b * rows} | {int((total > 0).sum())} of "
                         f"{groups} | {us['vmap']:.1f} | {us['sorted']:.1f} | {us['map']:.1f} | "
                         f"{us['bf16 sorted']:.1f} | {us['bf16 map']:.1f} | "
                         f"{us['map'] / us['vmap']:.2f}x | {us['bf16 sorted'] / us['vmap']:.2f}x |")
            print(lines[-1], flush=True)
            del timers
        del wq, w_kn
    write_table(lines, out_dir, "ragged_vmap", name)


def main():
    args = table_parser(__doc__).parse_args()
    run(args.out, args.rounds)


if __name__ == "__main__":
    main()
