"""Row-parallel NVFP4 matmul over every local GPU: all-reduce against reduce-scatter, beside the
same bf16 dot sharded the same way, in one run.

    python bench/bench_sharded_matmul.py --out DIR

The weight [N, K] and x [M, K] are split along K over a 1-D mesh "tp" (the o and down
projections of a tensor-parallel layer). Each op is timed three times: with y replicated (partial
sums all-reduced), the same with the partial sums in bfloat16 (`reduce_dtype`; for the bf16 dot,
`preferred_element_type=bfloat16`), and with y asked split over "tp" (reduce-scattered): its rows
at prefill M (sequence-parallel layers), its columns at decode M, where one token's row cannot be
split.
Decode calls rotate through weight copies larger than the L2 (as in bench_matmul.py). Times are
medians of LoopTimer readings taken round-robin (jax_nvfp4/timing.py), us per call. The
bf16 dot accumulates in float32 and casts after the sum, like the matmul, so both sum float32
partials. The communication floor is what the collective must move per device over the
GPU-to-GPU links: all-reduce 2 (n-1)/n and reduce-scatter (n-1)/n of y's float32 bytes (half
that for the partial sums in bfloat16).
Results: DIR/sharded_matmul_<device>.md.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_nvfp4 as nv
from jax_nvfp4.sharding import shard_nvfp4
from jax_nvfp4.timing import LoopTimer, interleaved_times

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import table_parser, write_table  # noqa: E402

SHAPES = [(4096, 4096), (4096, 14336)]  # (N, K): o and down projections of Llama-3-8B
MS = [1, 16, 2048, 8192]
DECODE_MAX_M = 16  # up to here y's columns are scattered and the weights rotate


def _ops(mesh, m):
    """name -> fn(x, w) for each op and output layout."""
    scattered = P(None, "tp") if m <= DECODE_MAX_M else P("tp", None)
    layouts = {"all-reduce": P(None, None), "reduce-scatter": scattered}

    def constrained(f, spec):
        return lambda x, w: jax.lax.with_sharding_constraint(f(x, w), NamedSharding(mesh, spec))

    def nvfp4(x, w):
        return nv.matmul(x, w)

    def bf16(x, w):
        return jnp.einsum("mk,nk->mn", x, w, preferred_element_type=jnp.float32).astype(x.dtype)

    ops = {f"{model}, {coll}": (model, constrained(f, spec))
           for model, f in (("nvfp4", nvfp4), ("bf16", bf16)) for coll, spec in layouts.items()}
    # Partial sums all-reduced in bfloat16 (half the bytes), as Megatron's row-parallel layers.
    ops["nvfp4, all-reduce bf16"] = ("nvfp4", constrained(
        lambda x, w: nv.matmul(x, w, reduce_dtype=jnp.bfloat16), layouts["all-reduce"]))
    ops["bf16, all-reduce bf16"] = ("bf16", constrained(
        lambda x, w: jnp.einsum("mk,nk->mn", x, w, preferred_element_type=jnp.bfloat16),
        layouts["all-reduce"]))
    return ops


def run(out_dir: Path, rounds: int):
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("tp",))
    n_dev = len(devices)
    name = devices[0].device_kind
    lines = [f"# Row-parallel matmul over {n_dev} x {name}: all-reduce vs reduce-scatter", "",
             f"{datetime.date.today()} · jax {jax.__version__} · mesh tp={n_dev}, weight and x "
             "split along K · us per call (median of round-robin LoopTimer readings) · bf16 "
             "activations and output", "",
             "| M | N x K | y scattered over | NVFP4 all-reduce | NVFP4 reduce-scatter | "
             "NVFP4 all-reduce in bf16 | bf16 all-reduce | bf16 reduce-scatter | "
             "bf16 all-reduce in bf16 | NVFP4 RS vs AR | NVFP4 bf16 AR vs AR | "
             "NVFP4 RS vs bf16 RS |",
             "|---|---|---|" + "---:|" * 9]
    for n, k in SHAPES:
        keys = jax.random.split(jax.random.key(n + k), 2)
        w16 = (jax.random.normal(keys[0], (n, k), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
        weights = {"nvfp4": shard_nvfp4(nv.quantize(w16), mesh, P(None, "tp")),
                   "bf16": jax.device_put(w16, NamedSharding(mesh, P(None, "tp")))}
        for m in MS:
            x = jax.device_put(jax.random.normal(keys[1], (m, k), jnp.bfloat16),
                               NamedSharding(mesh, P(None, "tp")))
            # Decode reads its weights from HBM, so it rotates copies; prefill takes one operand
            # set: its GEMMs are compute-bound, and x alone (M x K/n bf16) outgrows the L2 at
            # M = 8192.
            decode = m <= DECODE_MAX_M
            timers = {op: LoopTimer(fn, (x, weights[model]), rotate=decode)
                      for op, (model, fn) in _ops(mesh, m).items()}
            us = {op: t * 1e6 for op, t in interleaved_times(timers, rounds).items()}
            lines.append(
                f"| {m} | {n} x {k} | {'columns' if decode else 'rows'} | "
                f"{us['nvfp4, all-reduce']:.1f} | {us['nvfp4, reduce-scatter']:.1f} | "
                f"{us['nvfp4, all-reduce bf16']:.1f} | {us['bf16, all-reduce']:.1f} | "
                f"{us['bf16, reduce-scatter']:.1f} | {us['bf16, all-reduce bf16']:.1f} | "
                f"{us['nvfp4, all-reduce'] / us['nvfp4, reduce-scatter']:.2f}x | "
                f"{us['nvfp4, all-reduce'] / us['nvfp4, all-reduce bf16']:.2f}x | "
                f"{us['bf16, reduce-scatter'] / us['nvfp4, reduce-scatter']:.2f}x |")
            print(lines[-1], flush=True)
    floor = ["", "Collective floor per device, MB of float32 partial sums moved over the links "
             "(both ops): all-reduce 2 (n-1)/n, reduce-scatter (n-1)/n of y; the bfloat16 "
             "all-reduce columns move half the all-reduce's."]
    for m in (m for m in MS if m > DECODE_MAX_M):
        y32 = m * SHAPES[0][0] * 4 / 1e6
        floor.append(f"- M = {m}, N = {SHAPES[0][0]}: all-reduce "
                     f"{2 * (n_dev - 1) / n_dev * y32:.1f} MB, reduce-scatter "
                     f"{(n_dev - 1) / n_dev * y32:.1f} MB.")
    write_table(lines + floor, out_dir, "sharded_matmul", name)


def main():
    args = table_parser(__doc__).parse_args()
    if len(jax.devices()) < 2:
        raise SystemExit(f"needs 2 or more devices, found {len(jax.devices())}")
    run(args.out, args.rounds)


if __name__ == "__main__":
    main()
