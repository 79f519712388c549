"""Where a matmul's time in the benchmark loop goes: for each op, the steady time of a call in its
LoopTimer (as bench_matmul.py reads it) beside the GPU's SM clock, power draw and clock-event
reasons sampled while that loop runs, and the op's kernel times from two profiler traces: the
loop (calls back to back, the GPU under sustained load) and a burst of a few single calls (an
idle GPU, as a short profile sees it).

    python bench/bench_clocks.py --shapes 2048x6144x4096,2048x4096x4096 --out DIR

The ops are bench_matmul.py's (default: ours W4A16, ours W4A4, bf16 dot), timed round-robin.
Needs nvidia-smi on PATH (it reads the first GPU of CUDA_VISIBLE_DEVICES, else GPU 0: the one
JAX uses first) and a jax with its CUDA profiler (CUPTI). Writes DIR/clocks_<device>.md."""

from __future__ import annotations

import datetime
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

from jax_nvfp4.timing import LoopTimer, interleaved_times

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_matmul import variants  # noqa: E402
from report import table_parser, write_table  # noqa: E402

SMI_FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
SMI_PERIOD_MS = 20
# nvidia-smi's clocks_event_reasons bits (nvmlClocksEventReasons); idle and the
# application-clock setting are not slowdowns and are left out.
EVENT_REASONS = {0x4: "sw power cap", 0x8: "hw slowdown", 0x10: "sync boost",
                 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "hw power brake"}
# nvidia-smi's name for the GPU JAX uses first (an index or a UUID, as -i takes either)
SMI_GPU = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip() or "0"
BURST_CALLS = 20
BURST_IDLE_S = 1.0  # pause before a burst, so the GPU starts it idle


class SmiSampler:
    """Samples SMI_GPU's SM clock (MHz), power (W), temperature (C) and clock-event reasons
    every SMI_PERIOD_MS while the `with` block runs."""

    def __enter__(self):
        self._proc = subprocess.Popen(
            ["nvidia-smi", "-i", SMI_GPU, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
             "-lms", str(SMI_PERIOD_MS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.05)  # nvidia-smi's first sample comes after its start-up
        return self

    def __exit__(self, *exc):
        self._proc.terminate()
        out, err = self._proc.communicate()
        self.samples = []
        for line in out.splitlines():
            try:
                clock, power, temp, reasons = (v.strip() for v in line.split(","))
                self.samples.append((float(clock), float(power), float(temp), int(reasons, 16)))
            except ValueError:  # a field this GPU or driver does not report ("[N/A]"), a cut line
                continue
        if not self.samples:
            raise RuntimeError(f"nvidia-smi gave no samples: {err.strip() or out[:200]}")

    def summary(self) -> dict:
        clocks, powers, temps, reasons = zip(*self.samples)
        seen = 0
        for r in reasons:
            seen |= r
        return {"clock": statistics.median(clocks), "clock_min": min(clocks),
                "power": statistics.median(powers), "temp": max(temps),
                "reasons": ", ".join(n for bit, n in EVENT_REASONS.items() if seen & bit) or "none"}


def gpu_kernels(run) -> list[tuple[str, float]]:
    """(name, microseconds) of every GPU kernel that run() launched, from a profiler trace."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            run()
        path = next(Path(d).rglob("*.trace.json.gz"))
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    gpu = {e["pid"] for e in meta if e.get("name") == "process_name"
           and "/device:GPU" in e.get("args", {}).get("name", "")}
    # A GPU's trace holds its streams' kernels and lines derived from them (XLA ops, modules),
    # which would count each kernel again: only the streams' lines are kept.
    lines = {(e["pid"], e["tid"]): e.get("args", {}).get("name", "") for e in meta
             if e.get("name") == "thread_name" and e["pid"] in gpu}
    streams = {line for line, name in lines.items() if name.startswith("Stream")}
    if not streams:
        raise RuntimeError(f"no stream in the trace's GPU lines {sorted(set(lines.values()))}")
    return [(e["name"], float(e["dur"])) for e in events
            if e.get("ph") == "X" and (e["pid"], e["tid"]) in streams]


def base_name(kernel: str) -> str:
    """A kernel's name without XLA's numbering: a fusion is gemm_fusion_dot_general_1 in one
    program and _3 in another."""
    return re.sub(r"[_.]\d+$", "", kernel)


def per_call(kernels, names) -> tuple[float, dict]:
    """The op's kernels (`names`, base names) in a trace: their summed time per call (us) and each
    one's time per call (None where the trace has none of it: XLA may drop a memset in a loop).
    A call launches each kernel at least once (fused_ws launches its whole waves and its last
    partial wave apart): the calls are the fewest launches of a kernel the trace holds."""
    durs = {n: [d for k, d in kernels if base_name(k) == n] for n in names}
    counts = [len(v) for v in durs.values() if v]
    if not counts:
        raise RuntimeError(f"the trace holds none of the op's kernels {sorted(names)}")
    calls = min(counts)
    return (sum(sum(v) for v in durs.values()) / calls,
            {n: sum(v) / calls if v else None for n, v in durs.items()})


def measure(name, fn, args, timer) -> dict:
    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*args))

    def burst():
        for _ in range(BURST_CALLS):
            jax.block_until_ready(jitted(*args))

    time.sleep(BURST_IDLE_S)
    burst_kernels = gpu_kernels(burst)
    names = {base_name(k) for k, _ in burst_kernels}
    if not names:
        raise RuntimeError(f"{name}: no GPU kernel in the burst's trace (no CUDA profiler?)")
    burst_sum, burst_each = per_call(burst_kernels, names)
    loop_sum, loop_each = per_call(gpu_kernels(timer), names)
    return {"burst_sum": burst_sum, "loop_sum": loop_sum,
            "each": {n: (burst_each[n], loop_each[n]) for n in names}}


def main():
    parser = table_parser(__doc__)
    parser.add_argument("--shapes", default="2048x6144x4096,2048x4096x4096",
                        help="comma-separated MxNxK")
    parser.add_argument("--ops", default="ours_w4a16,ours_w4a4,bf16_dot",
                        help="comma-separated op names of bench_matmul.variants")
    args = parser.parse_args()
    wanted = args.ops.split(",")
    if unknown := set(wanted) - set(variants(1, 16, 16, jax.random.key(0))):
        parser.error(f"--ops: no op named {', '.join(sorted(unknown))}")
    device = jax.devices()[0].device_kind
    smi = subprocess.run(["nvidia-smi", "-i", SMI_GPU, "--query-gpu=name,driver_version,power.limit,"
                          "clocks.max.sm", "--format=csv,noheader"], capture_output=True, text=True)
    date = datetime.date.today().isoformat()
    lines = [f"# Loop time, clocks and kernel times of matmul ops on {device} ({date}, "
             f"jax {jax.__version__})", "",
             f"nvidia-smi: {smi.stdout.strip()} (name, driver, power limit, max SM clock).", "",
             f"Loop: the LoopTimer reading (us per call, median of {args.rounds} rounds, ops in "
             "turn); clock, power (median) and temperature (max) sampled by nvidia-smi every "
             f"{SMI_PERIOD_MS} ms during the readings, with every slowdown reason seen. Kernels "
             "per call: the op's kernels summed, from a profiler trace of one loop reading "
             f"(loop) and of {BURST_CALLS} single jitted calls after {BURST_IDLE_S:.0f} s idle (burst).",
             "", "| M x N x K | op | loop us | kernels in loop | kernels in burst | SM MHz (min) "
             "| power W | temp C | slowdown reasons |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    details = []
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        ops = {name: v for name, v in variants(m, n, k, jax.random.key(m + n + k)).items()
               if name in wanted}
        timers = {name: LoopTimer(fn, a) for name, (fn, a) in ops.items()}
        samples = {name: [] for name in ops}

        def sampled(name, timer):
            """The timer's reading, with nvidia-smi's samples during it kept under its name."""
            def read():
                with SmiSampler() as s:
                    seconds = timer()
                samples[name] += s.samples
                return seconds
            return read

        loop = interleaved_times({name: sampled(name, t) for name, t in timers.items()}, args.rounds)
        for name, (fn, a) in ops.items():
            got = measure(name, fn, a, timers[name])
            s = SmiSampler()
            s.samples = samples[name]
            clk = s.summary()
            lines.append(f"| {shape} | {name} | {loop[name] * 1e6:.1f} | "
                         f"{got['loop_sum']:.1f} | {got['burst_sum']:.1f} | {clk['clock']:.0f} "
                         f"({clk['clock_min']:.0f}) | {clk['power']:.0f} | {clk['temp']:.0f} | "
                         f"{clk['reasons']} |")
            details += [f"| {shape} | {name} | `{kn[:90]}` | {b:.1f} | "
                        f"{'-' if lp is None else f'{lp:.1f}'} |"
                        for kn, (b, lp) in sorted(got["each"].items(), key=lambda kv: -kv[1][0])]
            print(lines[-1], flush=True)
    lines += ["", "Each kernel's time per call (us; a kernel launched twice a call counts both):", "",
              "| M x N x K | op | kernel | burst | loop |", "|---|---|---|---:|---:|"] + details
    write_table(lines, args.out, "clocks", device)


if __name__ == "__main__":
    main()
