"""bf16 -> NVFP4 quantize (and dequantize) throughput: the CUDA kernel vs the XLA-compiled
reference vs a measured HBM copy, on the current GPU.

    python bench/bench_quantize.py --out DIR

Each variant is one jitted call, enqueued `--iters` times back to back and timed from the host
around the whole batch (every output is returned, so XLA drops no work). Throughput counts the
bytes an op must move: its input read once plus its outputs written once (the amax variants
read x twice: a floor of (2 * read + write) / copy bandwidth). The copy is an elementwise
negation of the same tensor (one read, one write). Results: DIR/quantize_<device>.md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

import jax_nvfp4
from jax_nvfp4 import reference

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import DEFAULT_OUT, NVFP4_BYTES_PER_ELEMENT, host_loop_times, write_table  # noqa: E402

SHAPES = [(16384, 16384), (8192, 32768)]


def _timed(op, x, iters):
    """Median seconds per call of jit(op)(x): `iters` calls enqueued back to back (host dispatch,
    ~30 us, overlaps the device work of these >= 100 us ops), 5 repeats."""
    return statistics.median(host_loop_times(jax.jit(op), (x,), iters, rounds=5))


def _variants(s_enc):
    kernel_amax = jax_nvfp4.quantize
    kernel_given = functools.partial(jax_nvfp4.quantize, s_enc=s_enc)
    return {
        "HBM copy (negate)": (lambda x: -x, "copy"),
        "kernel, amax + quantize": (kernel_amax, "q"),
        "kernel, given S_enc": (kernel_given, "q"),
        "XLA reference, amax + quantize": (reference.quantize, "q"),
        "XLA reference, given S_enc": (lambda x: reference.quantize(x, s_enc), "q"),
    }


def _bytes(kind, m, k, itemsize):
    read = m * k * itemsize
    nvfp4 = m * k * NVFP4_BYTES_PER_ELEMENT + 4  # codes, block scales and s_dec
    if kind == "copy":
        return 2 * read
    if kind == "q":
        return read + nvfp4
    return nvfp4 + read  # "dq": codes + scales in, x out


def run(out_dir: Path, iters: int):
    device = jax.devices()[0]
    rows = []
    for m, k in SHAPES:
        x = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
        s_enc = jnp.float32(6 * 448) / jnp.max(jnp.abs(x)).astype(jnp.float32)
        results = {}
        for name, (op, kind) in _variants(s_enc).items():
            t = _timed(op, x, iters)
            results[name] = (t, _bytes(kind, m, k, 2) / t / 1e9)
        q = jax_nvfp4.quantize(x)
        for name, op in {"kernel dequantize -> bf16": jax_nvfp4.dequantize,
                         "XLA reference dequantize -> bf16":
                         lambda q: reference.dequantize(q.codes, q.scales, q.s_dec)}.items():
            t = _timed(op, q, iters)
            results[name] = (t, _bytes("dq", m, k, 2) / t / 1e9)
        copy_bw = results["HBM copy (negate)"][1]
        for name, (t, bw) in results.items():
            ref = {"kernel, amax + quantize": "XLA reference, amax + quantize",
                   "kernel, given S_enc": "XLA reference, given S_enc",
                   "kernel dequantize -> bf16": "XLA reference dequantize -> bf16"}.get(name)
            speedup = f"{results[ref][0] / t:.2f}x" if ref else ""
            rows.append(f"| {m}x{k} | {name} | {t * 1e6:.1f} | {bw:.0f} | "
                        f"{100 * bw / copy_bw:.0f}% | {speedup} |")
            print(rows[-1], flush=True)
    header = [
        f"# NVFP4 quantize on {device.device_kind}",
        "",
        f"Date {datetime.date.today().isoformat()}, jax {jax.__version__}, "
        f"bf16 input, {iters} back-to-back calls, median of 5 batches. GB/s counts the "
        "bytes each op must move (input once + outputs once); the amax variants also re-read x.",
        "",
        "| shape | variant | us | GB/s | of copy | vs XLA |",
        "|---|---|---|---|---|---|",
    ]
    write_table(header + rows, out_dir, "quantize", device.device_kind)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    run(args.out, args.iters)


if __name__ == "__main__":
    main()
