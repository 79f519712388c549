"""NVFP4 matmul on one GPU beside its peers: bf16 jnp.dot, fp8 e4m3 dot, jax.nn.scaled_matmul
(nvfp4), XLA dequantize + dot, and this library's dequantize kernel + XLA's dot, on the
Llama-3-8B projection shapes.

"XLA dequantize + dot" is what XLA makes of the pure-JAX dequantization (jax_nvfp4.reference)
followed by the dot, all in one jitted function: XLA fuses and schedules it as it likes.
"kernel dequantize + dot" calls `jax_nvfp4.dequantize` (on the GPU our CUDA kernel, a custom call
XLA cannot fuse) and then XLA's dot: the same plan as our prefill path, so it sets the bar there.

    python bench/bench_matmul.py --out DIR [--quick]

Each op runs many times inside one jitted lax.fori_loop (its operands pass through an
optimization barrier every iteration, so XLA can neither hoist nor merge the calls), rotating
through copies of its operands larger than the L2 cache; the time per call is the loop's time
divided by its call count, free of host dispatch. The ops of one shape are timed round-robin
(each loop once per round, 7 rounds, median), so they all see the same GPU clock; each reading
follows 0.1 s of an idle GPU (jax_nvfp4.timing.interleaved_times says why).
Writes DIR/matmul_<device>.md (table), DIR/matmul_<device>.csv and DIR/matmul_speedup_<device>.png,
rewritten after every shape."""

from __future__ import annotations

import argparse
import csv
import datetime
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_nvfp4 as jn
from jax_nvfp4 import reference
from jax_nvfp4.timing import LoopTimer, interleaved_times, loop_time

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import DEFAULT_OUT, NVFP4_BYTES_PER_ELEMENT, table_path, timer_forcing  # noqa: E402

SHAPES_NK = [(14336, 4096), (4096, 4096), (6144, 4096), (4096, 14336)]
MS = [1, 4, 16, 64, 256, 1024, 4096, 8192]
QUICK_NK = [(14336, 4096), (4096, 4096)]
QUICK_MS = [1, 16, 256, 4096]
PATH_MS = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]  # --paths: default M of the forced timings
DECODE_MAX_FORCED_M = 64  # the decode kernel is not timed beyond this M (far off its range)
# --paths: JAX_NVFP4_GEMM_SM90_PATH values (prefill takes cuBLASLt's GEMM where built, prefill_cutlass CUTLASS's)
FORCED_PATHS = ("decode", "fused", "fused_ws", "fused_ws_wide", "prefill", "prefill_cutlass")
MMA_CEILING_MIN_M = 1024  # bf16 dots from this M on are compute-bound: the %MMA reference


def hbm_bandwidth() -> float:
    """Bytes/s of a large read + write (x + 1 on 1 GiB of float32)."""
    x = jnp.ones((256 * 1024 * 1024,), jnp.float32)
    t = loop_time(lambda a: a + 1.0, (x,))
    return 2 * x.nbytes / t


def variants(m, n, k, key):
    kx, kw = jax.random.split(key)
    x32 = jax.random.normal(kx, (m, k), jnp.float32)
    w32 = jax.random.normal(kw, (n, k), jnp.float32) * 0.05
    x = x32.astype(jnp.bfloat16)
    wq, xq = jn.quantize(w32), jn.quantize(x32)
    wb = w32.astype(jnp.bfloat16)
    x8, w8 = x32.astype(jnp.float8_e4m3fn), w32.astype(jnp.float8_e4m3fn)
    dims = (((1,), (1,)), ((), ()))

    def scaled(xc, xs, wc, ws):
        return jax.nn.scaled_matmul(xc[None], wc[None], xs[None], ws[None],
                                    preferred_element_type=jnp.bfloat16)[0]

    return {
        "ours_w4a16": (lambda a, w: jn.matmul(a, w), (x, wq)),
        "ours_w4a4": (lambda a, w: jn.matmul(a, w), (xq, wq)),
        "bf16_dot": (lambda a, w: lax.dot_general(a, w, dims), (x, wb)),
        "fp8_dot": (lambda a, w: lax.dot_general(a, w, dims, preferred_element_type=jnp.bfloat16),
                    (x8, w8)),
        "scaled_matmul_nvfp4": (scaled, (xq.codes, xq.plain_scales(), wq.codes, wq.plain_scales())),
        "xla_dequant_dot": (lambda a, w: lax.dot_general(
            a, reference.dequantize(w.codes, w.scales, w.s_dec, jnp.bfloat16), dims), (x, wq)),
        "kernel_dequant_dot": (lambda a, w: lax.dot_general(a, jn.dequantize(w, jnp.bfloat16), dims),
                               (x, wq)),
    }


def plot(rows, path, device):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (n, k) in sorted({(r["N"], r["K"]) for r in rows}):
        pts = [(r["M"], r["bf16_dot"] / r["ours_w4a16"]) for r in rows
               if (r["N"], r["K"]) == (n, k) and np.isfinite(r["ours_w4a16"])]
        ax.plot(*zip(*pts), marker="o", label=f"N={n}, K={k}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speedup over bf16 jnp.dot")
    ax.set_title("jax_nvfp4.matmul W4A16 on " + device)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(rows, out, device, bw):
    """Table (markdown + CSV) of the rows measured so far."""
    # The MMA ceiling is the fastest bf16 dot of a compute-bound shape (M >= 1024); a run of
    # decode shapes only has none (their dots are memory-bound), and leaves %MMA empty.
    mma_peak = max((2.0 * r["M"] * r["N"] * r["K"] / (r["bf16_dot"] * 1e-6) for r in rows
                    if r["M"] >= MMA_CEILING_MIN_M and np.isfinite(r["bf16_dot"])), default=None)
    for r in rows:
        r["ours_mma_pct"] = 100 * r["ours_tflops"] * 1e12 / mma_peak if mma_peak else float("nan")
    ceiling = (f"MMA ceiling = fastest bf16 jnp.dot at M >= {MMA_CEILING_MIN_M} here, "
               f"{mma_peak / 1e12:.0f} TFLOP/s" if mma_peak else
               f"no MMA ceiling (no M >= {MMA_CEILING_MIN_M} in this run)")

    with open(table_path(out, "matmul", device, ".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(max(rows, key=len)), restval="")
        w.writeheader()
        w.writerows(rows)
    date = datetime.date.today().isoformat()
    lines = [f"# jax_nvfp4.matmul on {device} ({date}, jax {jax.__version__})", "",
             "Times in us per call (median of 7 rounds, every op of a shape timed once per round, in turn, "
             "each reading after 0.1 s idle; "
             f"jitted fori_loop, the steady time of a call: runs of n and 2n iterations, their difference). HBM read+write {bw / 1e12:.2f} TB/s; "
             f"{ceiling}. "
             "%HBM: (NVFP4 weight + bf16 x/out bytes) / time / HBM; %MMA: flops / time / MMA ceiling.",
             "", "| M | N | K | ours W4A16 | ours W4A4 | bf16 dot | fp8 dot | scaled_matmul nvfp4 | "
             "XLA dequant+dot | kernel dequant+dot | vs bf16 | vs fp8 | vs scaled_mm | "
             "vs XLA dequant+dot | vs kernel dequant+dot | TFLOP/s | %HBM | %MMA |",
             "|" + "---|" * 18]
    for r in rows:
        o = r["ours_w4a16"]
        mma_pct = f"{r['ours_mma_pct']:.0f}" if np.isfinite(r["ours_mma_pct"]) else "-"
        lines.append(
            f"| {r['M']} | {r['N']} | {r['K']} | {o:.1f} | {r['ours_w4a4']:.1f} | {r['bf16_dot']:.1f} | "
            f"{r['fp8_dot']:.1f} | {r['scaled_matmul_nvfp4']:.1f} | {r['xla_dequant_dot']:.1f} | "
            f"{r['kernel_dequant_dot']:.1f} | "
            f"{r['bf16_dot'] / o:.2f}x | {r['fp8_dot'] / o:.2f}x | {r['scaled_matmul_nvfp4'] / o:.2f}x | "
            f"{r['xla_dequant_dot'] / o:.2f}x | {r['kernel_dequant_dot'] / o:.2f}x | "
            f"{r['ours_tflops']:.0f} | {r['ours_hbm_pct']:.0f} | {mma_pct} |")
    forced = [r for r in rows if any(name.startswith("forced_") for name in r)]
    if forced:
        lines += ["", "Each sm_90a kernel family forced (JAX_NVFP4_GEMM_SM90_PATH), W4A16, us per call:", "",
                  "| M | N | K | " + " | ".join(FORCED_PATHS) + " | auto |",
                  "|---|---|---|" + "---|" * (len(FORCED_PATHS) + 1)]
        for r in forced:
            cells = [f"{r[f'forced_{p}']:.1f}" if f"forced_{p}" in r else "-" for p in FORCED_PATHS]
            lines.append(f"| {r['M']} | {r['N']} | {r['K']} | " + " | ".join(cells) +
                         f" | {r['ours_w4a16']:.1f} |")
    table_path(out, "matmul", device).write_text("\n".join(lines) + "\n")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--nk", type=lambda v: [tuple(int(d) for d in s.split("x")) for s in v.split(",")],
                    default=None, help="the (N, K) shapes, e.g. 6144x4096,4096x4096 (default: the Llama ones)")
    ap.add_argument("--ms", type=lambda v: [int(m) for m in v.split(",")], default=None,
                    help="comma-separated M values (default: all)")
    ap.add_argument("--paths", action="store_true",
                    help="also time sm90 kernel families forced (--forced), at a few M")
    ap.add_argument("--path-ms", type=lambda v: [int(m) for m in v.split(",")], default=PATH_MS,
                    help="with --paths: the M values of the forced timings (every shape measured)")
    ap.add_argument("--forced", type=lambda v: tuple(v.split(",")), default=FORCED_PATHS,
                    help="with --paths: the paths forced (default: all of " + ",".join(FORCED_PATHS) + ")")
    args = ap.parse_args()
    device = jax.devices()[0].device_kind
    bw = hbm_bandwidth()
    print(f"{device}: HBM read+write {bw / 1e12:.2f} TB/s", flush=True)
    names = list(variants(1, 16, 16, jax.random.key(0)))
    rows = []
    for n, k in args.nk or (QUICK_NK if args.quick else SHAPES_NK):
        for m in args.ms or (QUICK_MS if args.quick else MS):
            row = {"M": m, "N": n, "K": k}
            timers = {}
            for name, (fn, ops) in variants(m, n, k, jax.random.key(m + n + k)).items():
                try:
                    timers[name] = LoopTimer(fn, ops)
                except Exception as e:  # a peer XLA cannot run at this size is reported, not fatal
                    print(f"  {name} M={m} N={n} K={k}: {type(e).__name__}: {str(e)[:200]}")
                    row[name] = float("nan")
            if args.paths and m in args.path_ms:
                fn, ops = variants(m, n, k, jax.random.key(1))["ours_w4a16"]
                for path in args.forced:
                    if path == "decode" and m > DECODE_MAX_FORCED_M:
                        continue
                    timer = timer_forcing("JAX_NVFP4_GEMM_SM90_PATH", path, fn, ops)
                    if timer is not None:  # a path that does not take this shape reads "-"
                        timers[f"forced_{path}"] = timer
            row.update({name: t * 1e6 for name, t in interleaved_times(timers).items()})
            del timers
            if args.paths and m in args.path_ms:
                print(f"  forced paths M={m}: " + ", ".join(
                    f"{path} {row[f'forced_{path}']:.1f}us" for path in args.forced
                    if f"forced_{path}" in row), flush=True)
            flops = 2.0 * m * n * k
            weight_bytes = n * k * NVFP4_BYTES_PER_ELEMENT + m * k * 2 + m * n * 2
            t = row["ours_w4a16"] * 1e-6
            row["ours_tflops"] = flops / t / 1e12
            row["ours_hbm_pct"] = 100 * weight_bytes / t / bw
            rows.append(row)
            print(f"M={m:5d} N={n:5d} K={k:5d} " + " ".join(f"{nm}={row[nm]:.1f}us" for nm in names),
                  flush=True)
            write_report(rows, args.out, device, bw)
            plot(rows, table_path(args.out, "matmul_speedup", device, ".png"), device)
    lines = write_report(rows, args.out, device, bw)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
