"""The matmul's epilogue activation against the same activation applied by XLA after the call,
in one run on one GPU.

    python bench/bench_activation.py [--activation silu|swiglu] --out DIR

Layer shapes of Llama-3-8B's MLP at decode and prefill M. With `silu` (default): the up
projection 14336 x 4096 and, with K = 14336, the down projection 4096 x 14336. With `swiglu`: the
fused gate/up projection 28672 x 4096 (rows interleaved, jax_nvfp4.interleave_gate_up), whose
output is silu(gate) * up, 14336 columns.
- W4A16, bf16 output: `matmul(x, w, activation=A)` against A applied by XLA to `matmul(x, w)`
  (XLA's elementwise kernel reads and writes y again), beside the bf16 `jnp.dot` + XLA's A;
- W4A4 chain, NVFP4 output for the next layer: `matmul(xq, w, activation=A, out_s_enc=s)`
  against `quantize(A(matmul(xq, w, out_dtype=float32)), s_enc=s)` (a float32 y, XLA's A, the
  quantize kernel).
Decode calls rotate through weight copies larger than the L2 (jax_nvfp4/timing.py); prefill uses
one operand set. Times are medians of LoopTimer readings taken round-robin, us per call.
Results: DIR/activation_<device>.md (silu) or DIR/activation_swiglu_<device>.md.
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
from report import table_parser, write_table  # noqa: E402

SHAPES = {"silu": [(14336, 4096), (4096, 14336)], "swiglu": [(2 * 14336, 4096)]}
MS = [1, 16, 64, 256, 4096]
DECODE_MAX_M = 16
S_ENC = np.float32(64.0)


def xla_activation(y, activation):
    """The activation as XLA computes it after the call (swiglu: y's interleaved gate/up pairs)."""
    if activation == "swiglu":
        return (jax.nn.silu(y[..., 0::2].astype(jnp.float32)) * y[..., 1::2]).astype(y.dtype)
    return jax.nn.silu(y)


def _ops(activation):
    """name -> (operand kind, fn): "x" takes bf16 x, "xq" the NVFP4 x; w NVFP4, w16 bf16."""
    def fused_w4a16(x, w):
        return nv.matmul(x, w, activation=activation)

    def xla_w4a16(x, w):
        return xla_activation(nv.matmul(x, w), activation)

    def bf16_dot(x, w16):
        return xla_activation(jnp.dot(x, w16.T), activation)

    # The codes stand for the NVFP4 result (LoopTimer keeps array outputs): codes, scales and
    # s_dec come out of one kernel, so none of them can be skipped.
    def fused_chain(xq, w):
        return nv.matmul(xq, w, activation=activation, out_s_enc=S_ENC).codes

    def xla_chain(xq, w):
        y = nv.matmul(xq, w, out_dtype=jnp.float32)
        return nv.quantize(xla_activation(y, activation), s_enc=S_ENC).codes

    return {"W4A16 fused": ("x", "w", fused_w4a16),
            f"W4A16 + XLA {activation}": ("x", "w", xla_w4a16),
            f"bf16 dot + XLA {activation}": ("x", "w16", bf16_dot),
            "W4A4 -> NVFP4 fused": ("xq", "w", fused_chain),
            f"W4A4 -> f32, XLA {activation}, quantize": ("xq", "w", xla_chain)}


def run(out_dir: Path, rounds: int, activation: str):
    name = jax.devices()[0].device_kind
    ops = _ops(activation)
    names = list(ops)
    lines = [f"# matmul epilogue activation ({activation}) vs XLA's after the call ({name})", "",
             f"{datetime.date.today()} · jax {jax.__version__} · us per call (median of "
             "round-robin LoopTimer readings)", "",
             "| M | N x K | " + " | ".join(ops) + " | W4A16 fused vs + XLA | "
             "W4A4 chain fused vs unfused |",
             "|---|---|" + "---:|" * (len(ops) + 2)]
    for n, k in SHAPES[activation]:
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
                f" | {us[names[1]] / us[names[0]]:.2f}x | {us[names[4]] / us[names[3]]:.2f}x |")
            print(lines[-1], flush=True)
    write_table(lines, out_dir, "activation" if activation == "silu" else f"activation_{activation}", name)


def main():
    parser = table_parser(__doc__)
    parser.add_argument("--activation", choices=sorted(SHAPES), default="silu")
    args = parser.parse_args()
    run(args.out, args.rounds, args.activation)


if __name__ == "__main__":
    main()
