"""Which kernels cuDNN runs for the ResNet-50 3x3 stages at batch 32: PyTorch's conv2d as
bench_conv.py times it (channels_last bf16, 'SAME' padding, benchmark mode), under the PyTorch
profiler. Prints, per stage, each kernel's name, grid, block and median duration over 10 calls
(the tile size and the K split are in cuDNN's kernel names).

    python bench/cudnn_conv_kernels.py [--out DIR]   (writes DIR/cudnn_conv_kernels_<device>.md)

Needs PyTorch with CUDA (the GPU machine has it). Durations are the profiler's per-kernel ones,
not back-to-back timings: compare kernels with them, not with bench_conv.py's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import write_table  # noqa: E402

# (batch, H = W, C = K) of the 3x3 stages
STAGES = [(32, 56, 64), (32, 28, 128), (32, 14, 256), (32, 7, 512)]


def kernels_of(b, h, c, calls=10):
    """{(name, grid, block): [durations in us]} of `calls` conv2d calls after a warm-up."""
    x = torch.randn(b, c, h, h, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.randn(c, c, 3, 3, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    for _ in range(20):  # benchmark mode picks its algorithm on the first calls
        torch.nn.functional.conv2d(x, w, padding=1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.nn.functional.conv2d(x, w, padding=1)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    found: dict[tuple[str, str, str], list[float]] = {}
    for e in events:
        if e.get("cat") == "kernel":
            key = (e["name"], str(e["args"].get("grid")), str(e["args"].get("block")))
            found.setdefault(key, []).append(e["dur"])
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    lines = [f"# cuDNN's kernels for the ResNet-50 3x3 stages, {torch.cuda.get_device_name()}", "",
             "| stage | kernel | grid | block | median µs |", "|---|---|---|---|---|"]
    for b, h, c in STAGES:
        for (name, grid, block), durs in kernels_of(b, h, c).items():
            median = sorted(durs)[len(durs) // 2]  # the upper one of an even count
            lines.append(f"| {h}x{h}x{c} b{b} | `{name}` | {grid} | {block} | {median:.1f} |")
    if args.out:
        write_table(lines, args.out, "cudnn_conv_kernels", torch.cuda.get_device_name())
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
