"""Host cost of executing a jitted program of many small jax_nvfp4 GEMM calls.

    python bench/bench_dispatch.py [--label NAME] [--calls 64] [--rounds 9] [--out DIR]

A chain of `--calls` dependent 1 x 256 x 256 W4A16 GEMMs (each a few microseconds of GPU work)
and a program of one such GEMM, each executed back to back from Python; prints the median and the
best time per execution over the rounds. With XLA's command buffers off
(XLA_FLAGS=--xla_gpu_enable_command_buffer=) every call's FFI handlers run on the host in every
execution, so the chain is bound by that host work: comparing builds of the extension in
alternating processes (PYTHONPATH to each build) measures what a change to the handlers costs on
the host. On an H200's host whole processes read bimodal (about 500 or 850 us for the chain,
whatever the build, pinned to cores or not): alternate builds over many processes and compare
each process's best (bench/results/initialize_state_h200_2026-11-29.md). With --out DIR the
printed line is also appended to DIR/dispatch_<device>.md, so alternating processes collect their
lines in one file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

import jax_nvfp4 as nv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import host_loop_times, table_path  # noqa: E402


def per_execution_us(fn, args, executions: int, rounds: int) -> tuple[float, float]:
    """Median and best microseconds per execution of `fn(*args)`, `executions` a round."""
    times = [t * 1e6 for t in host_loop_times(fn, args, executions, rounds)]
    return statistics.median(times), min(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", help="names the build in the printed line (default: the "
                        "folder jax_nvfp4 was imported from)")
    parser.add_argument("--calls", type=int, default=64, help="GEMM calls in the chain")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, help="also append the line to DIR/dispatch_<device>.md")
    args = parser.parse_args(argv)
    label = args.label or str(Path(nv.__file__).parent)

    w = nv.quantize(jax.random.normal(jax.random.key(0), (256, 256), jnp.float32))
    x = jax.random.normal(jax.random.key(1), (1, 256), jnp.bfloat16)

    @jax.jit
    def chain(x, w):
        for _ in range(args.calls):
            x = nv.matmul(x, w) * 0.05  # keeps the values in range over the chain
        return x

    chain_med, chain_best = per_execution_us(chain, (x, w), 400, args.rounds)
    one_med, one_best = per_execution_us(jax.jit(nv.matmul), (x, w), 2000, args.rounds)
    device = jax.devices()[0].device_kind
    line = (f"{label}: chain of {args.calls} GEMMs {chain_med:.1f} us/exec (best "
            f"{chain_best:.1f}); one GEMM {one_med:.2f} us/exec (best {one_best:.2f}) on {device}")
    if args.out is not None:
        path = table_path(args.out, "dispatch", device)
        with path.open("a") as f:
            f.write(f"- {line}\n")
        print(f"appended to {path}")
    print(line)  # last, for callers that read the output's last line
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
