"""The matmul's epilogue activation against the same activation applied by XLA after the call,
in one run on one GPU.

    python bench/bench_activation.py --out DIR

Two layer shapes of Llama-3-8B's MLP (the up projection 14336 x 4096 and, with K = 14336, the
down projection 4096 x 14336) at decode and prefill M, with `silu`:
- W4A16, bf16 output: `matmul(x, w, activation="silu")` against `jax.nn.silu(matmul(x, w))`
  (XLA's elementwise kernel reads and writes y again), beside the bf16 `jnp.dot` + silu;
- W4A4 chain, NVFP4 output for the next layer: `matmul(xq, w, activation="silu", out_s_enc=s)`
  against `quantize(silu(matmul(xq, w, out_dtype=float32)), s_enc=s)` (a float32 y, XLA's silu,
  the quantize kernel).
Decode calls rotate through weight copies larger than the L2 (jax_nvfp4/timing.py); prefill uses
one operand set. Times are medians of LoopTimer readings taken round-robin, us per call.
Results: DIR/activation_<device>.md.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jax_nvfp4 as nv
from jax_nvfp4.timing import LoopTimer, interleaved_times

SHAPES = [(14336, 4096), (4096, 14336)]
MS = [1, 16, 256, 4096]
DECODE_MAX_M = 16
S_ENC = np.float32(64.0)


def _ops():
    """name -> (operand kind, fn): "x" takes bf16 x, "xq" the NVFP4 x; w NVFP4, w16 bf16."""
    def fused_w4a16(x, w):
        return nv.matmul(x, w, activation="silu")

    def xla_w4a16(x, w):
        return jax.nn.silu(nv.matmul(x, w))

    def bf16_dot(x, w16):
        return jax.nn.silu(jnp.dot(x, w16.T))

    # The codes stand for the NVFP4 result (LoopTimer keeps array outputs): codes, scales and
    # s_dec come out of one kernel, so none of them can be skipped.
    def fused_chain(xq, w):
        return nv.matmul(xq, w, activation="silu", out_s_enc=S_ENC).codes

    def xla_chain(xq, w):
        y = nv.matmul(xq, w, out_dtype=jnp.float32)
        return nv.quantize(jax.nn.silu(y), s_enc=S_ENC).codes

    return {"W4A16 fused": ("x", "w", fused_w4a16), "W4A16 + XLA silu": ("x", "w", xla_w4a16),
            "bf16 dot + XLA silu": ("x", "w16", bf16_dot),
            "W4A4 -> NVFP4 fused": ("xq", "w", fused_chain),
            "W4A4 -> f32, XLA silu, quantize": ("xq", "w", xla_chain)}


def run(out_dir: Path, rounds: int):
    name = jax.devices()[0].device_kind
    ops = _ops()
    lines = [f"# matmul epilogue activation (silu) vs XLA's after the call ({name})", "",
             f"{datetime.date.today()} · jax {jax.__version__} · us per call (median of "
             "round-robin LoopTimer readings)", "",
             "| M | N x K | " + " | ".join(ops) + " | W4A16 fused vs + XLA | "
             "W4A4 chain fused vs unfused |",
             "|---|---|" + "---:|" * (len(ops) + 2)]
    for n, k in SHAPES:
        keys = jax.random.split(jax.random.key(n + k), 2)
        w16 = (jax.random.normal(keys[0], (n, k), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
        weights = {"w": nv.quantize(w16), "w16": w16}
        for m in MS:
            x = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
            xs = {"x": x, "xq": nv.quantize(x)}
            timers = {op: LoopTimer(fn, (xs[a], weights[b]), rotate=m <= DECODE_MAX_M)
                      for op, (a, b, fn) in ops.items()}
            us = {op: t * 1e6 for op, t in interleaved_times(timers, rounds).items()}
            lines.append(
                f"| {m} | {n} x {k} | " + " | ".join(f"{us[op]:.1f}" for op in ops) +
                f" | {us['W4A16 + XLA silu'] / us['W4A16 fused']:.2f}x | "
                f"{us['W4A4 -> f32, XLA silu, quantize'] / us['W4A4 -> NVFP4 fused']:.2f}x |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"activation_{name.replace(' ', '_')}.md"
    path.write_text(text)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    run(args.out, args.rounds)


if __name__ == "__main__":
    main()
