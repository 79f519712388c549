"""Decode through a stack of layers: `lax.scan` over stacked weights (Flax's nn.scan pattern)
against a Python loop over separate weight arrays, NVFP4 and bf16, in one run.

    python bench/bench_layer_stack.py --out DIR

L layers of [N, N] weights, one token (M = 1), each layer's output the next one's input. In the
scan the weights are one stacked array [L, N, N] and the loop body receives layer l's slice; the
unrolled loop takes L separate arrays. Calls rotate through weight copies larger than the L2 (as in
bench_matmul.py); times are medians of LoopTimer readings taken round-robin (jax_nvfp4/timing.py),
us per call of the whole stack. The roofline is the stack's NVFP4 (or bf16) weight bytes over the
HBM read + write rate measured in the same run. Results: DIR/layer_stack_<device>.md.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jax_nvfp4 as nv
from jax_nvfp4.timing import LoopTimer, interleaved_times

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_matmul import hbm_bandwidth  # noqa: E402
from report import NVFP4_BYTES_PER_ELEMENT, table_parser, write_table  # noqa: E402

LAYERS = 8
SIZES = [4096, 8192]  # square layers [N, N]: each output feeds the next layer


def _bf16_dot(h, w):
    return jnp.dot(h, w.T, preferred_element_type=jnp.float32).astype(h.dtype)


def _scanned(layer):
    return lambda x, stack: jax.lax.scan(lambda h, w: (layer(h, w), None), x, stack)[0]


def _unrolled(layer):
    def run(x, weights):
        for w in weights:
            x = layer(x, w)
        return x
    return run


def run(out_dir: Path, rounds: int):
    device = jax.devices()[0]
    bw = hbm_bandwidth()
    lines = [f"# {LAYERS} layers at decode (M = 1): lax.scan over stacked weights vs a loop over "
             f"separate arrays, {device.device_kind}", "",
             f"{datetime.date.today()} · jax {jax.__version__} · bf16 activations · us per call "
             f"of the whole stack (median of round-robin LoopTimer readings, weights rotated past "
             f"the L2) · HBM read + write {bw / 1e12:.2f} TB/s", "",
             "| N x N | NVFP4 scan | NVFP4 loop | scan / loop | bf16 scan | bf16 loop | "
             "scan / loop | NVFP4 loop % of roofline | bf16 loop % of roofline |",
             "|---|" + "---:|" * 8]
    for n in SIZES:
        k = n
        key = jax.random.key(n)
        w16 = (jax.random.normal(key, (LAYERS, n, k), jnp.float32) / np.sqrt(k)).astype(
            jnp.bfloat16)
        wq = jax.vmap(nv.quantize)(w16)
        x = jax.random.normal(key, (1, k), jnp.bfloat16)
        nvfp4, bf16 = nv.matmul, _bf16_dot
        timers = {
            "nvfp4 scan": LoopTimer(_scanned(nvfp4), (x, wq)),
            "nvfp4 loop": LoopTimer(_unrolled(nvfp4),
                                    (x, [jax.tree.map(lambda a, l=l: a[l], wq)
                                         for l in range(LAYERS)])),
            "bf16 scan": LoopTimer(_scanned(bf16), (x, w16)),
            "bf16 loop": LoopTimer(_unrolled(bf16), (x, [w16[l] for l in range(LAYERS)])),
        }
        us = {name: t * 1e6 for name, t in interleaved_times(timers, rounds).items()}
        floor_q = LAYERS * n * k * NVFP4_BYTES_PER_ELEMENT / bw * 1e6
        floor_16 = LAYERS * n * k * 2 / bw * 1e6
        lines.append(f"| {n} x {n} | {us['nvfp4 scan']:.1f} | {us['nvfp4 loop']:.1f} | "
                     f"{us['nvfp4 scan'] / us['nvfp4 loop']:.2f}x | {us['bf16 scan']:.1f} | "
                     f"{us['bf16 loop']:.1f} | {us['bf16 scan'] / us['bf16 loop']:.2f}x | "
                     f"{100 * floor_q / us['nvfp4 loop']:.0f}% | "
                     f"{100 * floor_16 / us['bf16 loop']:.0f}% |")
        print(lines[-1], flush=True)
    write_table(lines, out_dir, "layer_stack", device.device_kind)


def main():
    args = table_parser(__doc__).parse_args()
    run(args.out, args.rounds)


if __name__ == "__main__":
    main()
