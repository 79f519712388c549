"""Expert-parallel NVFP4 matmul: `vmap` over a stack of expert weights split over every local
GPU, beside the same bf16 einsum split the same way, in one run.

    python bench/bench_experts.py --out DIR

E experts of shape [N, K] (Mixtral-8x7B's w1: E = 8, 14336 x 4096) and x [E, T, K], T tokens
routed to each expert, both split along E over a 1-D mesh "ep" of all local devices: each device
multiplies its own experts (jax_nvfp4's stacked twin of the partitioned matmul; the bf16 einsum
is XLA's batched dot), with no communication. Also timed on the first device alone with its
E / ep experts: the stacked NVFP4 weight [E / ep, N, K] against the same experts held as
separate NVFP4Arrays (a Python loop of matmul calls, no slicing of a stack), which shows what the
stack costs inside a device.
Calls rotate through weight copies larger than the L2 (as in bench_matmul.py). Times are
medians of LoopTimer readings taken round-robin (jax_nvfp4/timing.py), us per call. The roofline
is a device's NVFP4 weight bytes (4.5 bits an element) over the HBM read + write rate measured in
the same run (bench_matmul.hbm_bandwidth). Results: DIR/experts_<device>.md.
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
from bench_matmul import hbm_bandwidth  # noqa: E402
from report import NVFP4_BYTES_PER_ELEMENT, table_parser, write_table  # noqa: E402

EXPERTS, N, K = 8, 14336, 4096
TOKENS = [1, 4, 16, 64, 256]


def _stacked(x, w):
    return jax.vmap(nv.matmul)(x, w)


def _bf16(x, w):
    return jnp.einsum("etk,enk->etn", x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _separate(x, ws):
    return jnp.stack([nv.matmul(x[e], w) for e, w in enumerate(ws)])


def run(out_dir: Path, rounds: int):
    devices = jax.devices()
    n_dev = len(devices)
    if EXPERTS % n_dev:
        raise SystemExit(f"{EXPERTS} experts do not split over {n_dev} devices")
    local = EXPERTS // n_dev
    mesh = Mesh(np.array(devices), ("ep",))
    split = NamedSharding(mesh, P("ep"))
    name = devices[0].device_kind
    bw = hbm_bandwidth()
    keys = jax.random.split(jax.random.key(0), 2)
    w16 = (jax.random.normal(keys[0], (EXPERTS, N, K), jnp.float32) / np.sqrt(K)).astype(
        jnp.bfloat16)
    wq = jax.vmap(nv.quantize)(w16)
    weights = {"nvfp4": shard_nvfp4(wq, mesh, P("ep", None, None)),
               "bf16": jax.device_put(w16, split)}
    one = jax.tree.map(lambda a: jax.device_put(a[:local], devices[0]), wq)
    one_separate = [jax.tree.map(lambda a, e=e: a[e], one) for e in range(local)]
    roofline_us = local * N * K * NVFP4_BYTES_PER_ELEMENT / bw * 1e6
    lines = [f"# Expert-parallel matmul over {n_dev} x {name}", "",
             f"{datetime.date.today()} · jax {jax.__version__} · {EXPERTS} experts of {N} x {K} "
             f"(Mixtral-8x7B w1), split over mesh ep={n_dev} ({local} a device) · bf16 x and "
             f"output · us per call (median of round-robin LoopTimer readings, weights rotated "
             f"past the L2) · HBM read + write {bw / 1e12:.2f} TB/s · NVFP4 roofline "
             f"{roofline_us:.1f} us (a device's weight bytes / HBM)", "",
             "| tokens an expert | NVFP4 stacked, ep | bf16 einsum, ep | NVFP4 vs bf16 | "
             "% of roofline | one device: NVFP4 stacked | one device: separate arrays | "
             "stacked vs separate |",
             "|---|" + "---:|" * 7]
    for t in TOKENS:
        x = jax.random.normal(keys[1], (EXPERTS, t, K), jnp.bfloat16)
        xs = jax.device_put(x, split)
        x1 = jax.device_put(x[:local], devices[0])
        timers = {"stacked": LoopTimer(_stacked, (xs, weights["nvfp4"])),
                  "bf16": LoopTimer(_bf16, (xs, weights["bf16"])),
                  "one stacked": LoopTimer(_stacked, (x1, one)),
                  "one separate": LoopTimer(_separate, (x1, one_separate))}
        us = {k: v * 1e6 for k, v in interleaved_times(timers, rounds).items()}
        lines.append(f"| {t} | {us['stacked']:.1f} | {us['bf16']:.1f} | "
                     f"{us['bf16'] / us['stacked']:.2f}x | {100 * roofline_us / us['stacked']:.0f}% | "
                     f"{us['one stacked']:.1f} | {us['one separate']:.1f} | "
                     f"{us['one separate'] / us['one stacked']:.2f}x |")
        print(lines[-1], flush=True)
    write_table(lines, out_dir, "experts", name)


def main():
    args = table_parser(__doc__).parse_args()
    run(args.out, args.rounds)


if __name__ == "__main__":
    main()
