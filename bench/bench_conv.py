"""Benchmark of jax_nvfp4.conv (NVFP4 weights, bf16 activations) against XLA's bf16
lax.conv_general_dilated (on bf16 weights, and on the NVFP4 weights dequantized in the same jit)
and PyTorch's cuDNN conv2d (channels_last, bf16, benchmark mode).

    python bench/bench_conv.py --out DIR [--chain N] [--also-chain 8] [--forced register_a,...] [--only wide]

Ours and XLA are timed on the device: many calls inside one jitted lax.fori_loop
(jax_nvfp4.timing.LoopTimer, without rotating operand copies: all of them keep one input set warm in L2;
the steady time of a call, what a run costs once taken out),
CHAIN (or --chain) calls back to back per iteration, so the loop's own work per iteration (its
small kernels and gaps, ~7 us on an H100, and a first call that runs slower after them) is spread
over them as PyTorch's graph replays have none;
PyTorch with CUDA events around back-to-back eager calls, and around replays of a CUDA graph
holding CHAIN such calls (cuDNN's kernels without host work between them), twice: with each
output dropped at once (the graph's pool then gives every call the same buffer, warm in L2) and
with every output kept ("fresh outputs": a buffer each, as every call of our chain writes; XLA
keeps them all live to the end of the iteration). --also-chain N also
times ours with N calls an iteration, in the same rounds: what the loop adds to a call. All are
timed round-robin (each once per round after 0.1 s idle, 7 rounds, median), so they see the same
GPU clock, and each reading, cuDNN's too, follows WARM_S of its own work run untimed. Also
reports the activation bytes the sm_90a kernel loads from global memory into shared memory with
and without the shifted-operand reuse, counted from its schedule (cuda/conv/sm90/conv_sm90_schedule.h).
--forced also times ours with each named sm_90a kernel forced (JAX_NVFP4_CONV_SM90_KERNEL), in
the same rounds (nan where the kernel does not take a shape); --only keeps the shapes whose name
contains one of the given words. Writes DIR/conv_<device>.md."""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax

import jax_nvfp4 as jn
from jax_nvfp4._extension import _ext, cublaslt_gemm_calls, visible_cuda_arch
from jax_nvfp4.primitives import conv as conv_primitive
from jax_nvfp4.primitives.conv import pointwise_as_gemm
from jax_nvfp4.timing import TARGET_S, WARM_S, LoopTimer, interleaved_times

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import DEFAULT_OUT, timer_forcing, write_table  # noqa: E402

# name: (N, H, W, C, K, R, S, stride, padding)
SHAPES = [
    ("resnet56x56x64 b1", (1, 56, 56, 64, 64, 3, 3, 1, "SAME")),
    ("resnet28x28x128 b1", (1, 28, 28, 128, 128, 3, 3, 1, "SAME")),
    ("resnet14x14x256 b1", (1, 14, 14, 256, 256, 3, 3, 1, "SAME")),
    ("resnet7x7x512 b1", (1, 7, 7, 512, 512, 3, 3, 1, "SAME")),
    ("resnet56x56x64 b32", (32, 56, 56, 64, 64, 3, 3, 1, "SAME")),
    ("resnet28x28x128 b32", (32, 28, 28, 128, 128, 3, 3, 1, "SAME")),
    ("resnet14x14x256 b32", (32, 14, 14, 256, 256, 3, 3, 1, "SAME")),
    ("resnet7x7x512 b32", (32, 7, 7, 512, 512, 3, 3, 1, "SAME")),
    # Batch 128: grids of more tiles than SMs (persistent CTAs; choose_kernel's multi-wave estimate).
    ("resnet56x56x64 b128", (128, 56, 56, 64, 64, 3, 3, 1, "SAME")),
    ("resnet28x28x128 b128", (128, 28, 28, 128, 128, 3, 3, 1, "SAME")),
    ("resnet14x14x256 b128", (128, 14, 14, 256, 256, 3, 3, 1, "SAME")),
    ("resnet7x7x512 b128", (128, 7, 7, 512, 512, 3, 3, 1, "SAME")),
    ("resnet 3x3/2 28x28x256 b128", (128, 28, 28, 256, 256, 3, 3, 2, "SAME")),
    ("wide 1x7 17x17x192 b32", (32, 17, 17, 192, 192, 1, 7, 1, "SAME")),
    ("wide 7x7 28x28x128 b32", (32, 28, 28, 128, 128, 7, 7, 1, "SAME")),
    ("wide 7x1 17x17x192 b32", (32, 17, 17, 192, 192, 7, 1, 1, "SAME")),
    # A wide filter with stride 3: three phase arrays a stage, so only tiles up to 128 pixels fit
    # twice in shared memory (choose_kernel's ws_tma_stages_fit).
    ("wide 7x7/3 168x168x32->128 b8", (8, 168, 168, 32, 128, 7, 7, 3, "SAME")),
    ("wide 1x7 17x17x192 b1", (1, 17, 17, 192, 192, 1, 7, 1, "SAME")),
    ("wide 7x7 28x28x128 b1", (1, 28, 28, 128, 128, 7, 7, 1, "SAME")),
    ("wide 5x5 28x28x128 b1", (1, 28, 28, 128, 128, 5, 5, 1, "SAME")),
    ("1x1 56x56x256->64 b32", (32, 56, 56, 256, 64, 1, 1, 1, "SAME")),
    # The other ResNet-50 pointwise convs of the stages where the library runs them as the GEMM.
    ("1x1 28x28x512->128 b32", (32, 28, 28, 512, 128, 1, 1, 1, "SAME")),
    ("1x1 14x14x1024->256 b32", (32, 14, 14, 1024, 256, 1, 1, 1, "SAME")),
    ("1x1 14x14x256->1024 b32", (32, 14, 14, 256, 1024, 1, 1, 1, "SAME")),
    ("1x1 7x7x2048->512 b32", (32, 7, 7, 2048, 512, 1, 1, 1, "SAME")),
    ("1x1 7x7x512->2048 b32", (32, 7, 7, 512, 2048, 1, 1, 1, "SAME")),
    ("1x1 56x56x256->64 b1", (1, 56, 56, 256, 64, 1, 1, 1, "SAME")),
    # Batch-1 ones the rule leaves to the conv kernels (784, 196 and 49 pixels).
    ("1x1 28x28x512->128 b1", (1, 28, 28, 512, 128, 1, 1, 1, "SAME")),
    ("1x1 14x14x1024->256 b1", (1, 14, 14, 1024, 256, 1, 1, 1, "SAME")),
    ("1x1 7x7x2048->512 b1", (1, 7, 7, 2048, 512, 1, 1, 1, "SAME")),
    # ResNet-50 (v1.5)'s strided 3x3 convs, the first of stages 2-4.
    ("resnet 3x3/2 56x56x128 b32", (32, 56, 56, 128, 128, 3, 3, 2, "SAME")),
    ("resnet 3x3/2 28x28x256 b32", (32, 28, 28, 256, 256, 3, 3, 2, "SAME")),
    ("resnet 3x3/2 14x14x512 b32", (32, 14, 14, 512, 512, 3, 3, 2, "SAME")),
    # ResNet-50's projection shortcuts with a stride (1x1, stride 2).
    ("1x1/2 56x56x256->512 b32", (32, 56, 56, 256, 512, 1, 1, 2, "SAME")),
    ("1x1/2 28x28x512->1024 b32", (32, 28, 28, 512, 1024, 1, 1, 2, "SAME")),
    ("1x1/2 14x14x1024->2048 b32", (32, 14, 14, 1024, 2048, 1, 1, 2, "SAME")),
    # The strided ones at batch 1 (small grids: conv_sm90.cu, small_grid_choice).
    ("resnet 3x3/2 56x56x128 b1", (1, 56, 56, 128, 128, 3, 3, 2, "SAME")),
    ("resnet 3x3/2 28x28x256 b1", (1, 28, 28, 256, 256, 3, 3, 2, "SAME")),
    ("resnet 3x3/2 14x14x512 b1", (1, 14, 14, 512, 512, 3, 3, 2, "SAME")),
    ("1x1/2 56x56x256->512 b1", (1, 56, 56, 256, 512, 1, 1, 2, "SAME")),
    ("1x1/2 28x28x512->1024 b1", (1, 28, 28, 512, 1024, 1, 1, 2, "SAME")),
    ("1x1/2 14x14x1024->2048 b1", (1, 14, 14, 1024, 2048, 1, 1, 2, "SAME")),
    # ResNet-50's 3x3 convs at small batches (small grids where the register-A kernel would run
    # more CTAs than SMs).
    ("resnet14x14x256 b4", (4, 14, 14, 256, 256, 3, 3, 1, "SAME")),
    ("resnet7x7x512 b4", (4, 7, 7, 512, 512, 3, 3, 1, "SAME")),
    ("resnet 3x3/2 28x28x256 b4", (4, 28, 28, 256, 256, 3, 3, 2, "SAME")),
    ("resnet 3x3/2 14x14x512 b4", (4, 14, 14, 512, 512, 3, 3, 2, "SAME")),
    ("resnet14x14x256 b8", (8, 14, 14, 256, 256, 3, 3, 1, "SAME")),
    ("resnet7x7x512 b8", (8, 7, 7, 512, 512, 3, 3, 1, "SAME")),
    ("resnet 3x3/2 28x28x256 b8", (8, 28, 28, 256, 256, 3, 3, 2, "SAME")),
    ("resnet 3x3/2 14x14x512 b8", (8, 14, 14, 512, 512, 3, 3, 2, "SAME")),
]

CHUNK_C = 64  # channels per pipeline stage of the sm_90a kernel
# Calls per loop iteration (jax_nvfp4.timing.LoopTimer) and per cuDNN graph; --chain sets it. Traced on an
# H100 (7x7x512, batch 32), the loop's GPU time ran 2.0 us a call above the conv kernels' steady
# back-to-back time with 8 calls an iteration, 0.7 with 32 and 0.3 with 128
# (bench/results/conv_loop_chain_h100_2026-11-26.md).
CHAIN = 128


def activation_bytes(n, h, w, c, k, r, s, stride, sms):
    """Activation bytes global -> shared of the sm_90a kernel (bf16), with the reuse and as an
    implicit GEMM that loads each tap's tile separately, and the kernel and its CTA tile (output
    channels x pixels): the library's choice on a GPU of `sms` SMs (conv_sm90_kernel_choice), for
    the SAME, dilation-1 shapes benchmarked here; a pointwise conv that runs as the NVFP4 GEMM
    loads the activations of its output pixels once."""
    if pointwise_as_gemm((n, h, w, c), jnp.bfloat16, False, (r, s), (stride, stride),
                         ((0, 0), (0, 0)), jnp.bfloat16, arch=visible_cuda_arch(),
                         cublaslt=cublaslt_gemm_calls() is not None, forced=False):
        gemm_bytes = n * -(-h // stride) * -(-w // stride) * c * 2
        return gemm_bytes, gemm_bytes, "GEMM (prefill path)"
    q, p = -(-w // stride), -(-h // stride)  # SAME
    pad_h, pad_w = max((p - 1) * stride + r - h, 0) // 2, max((q - 1) * stride + s - w, 0) // 2
    kernel, splits, bm, bn = _ext.conv_sm90_kernel_choice(n, h, w, c, k, r, s, stride, p, q, pad_h, pad_w, sms)
    name = next(key for key, value in conv_primitive._KERNELS.items() if value == kernel and key)
    halo = (s - 1) // stride
    phases = min(stride, s)  # phase arrays the taps read (dilation 1)
    wv = _ext.conv_sm90_virtual_row_width(q, w, s, stride, pad_w, 1)
    stages = -(-(n * p * wv) // bn) * -(-k // bm) * r * -(-c // CHUNK_C)
    if name.startswith("ws") and "cpasync" not in name and c % 32 == 0:
        # TMA loads: per phase, bn slots and an 8-pixel halo box (none where no tap reads past the
        # tile: 1x1)
        slots = bn + (8 if halo else 0)
    else:  # cp.async loads: the slot table's slots
        slots = (bn + halo) | 1
    split = f"/s{splits}" if splits > 1 else ""
    return (stages * phases * slots * CHUNK_C * 2, stages * s * bn * CHUNK_C * 2,
            f"{name}{split}, {bm}x{bn}")


def xla_dequantized(x, wq, stride, padding):
    """The conv counterpart of bench_matmul's "XLA dequantize + dot": the NVFP4 weights
    [R, S, K, C] dequantized to bf16 (NVFP4Array.dequantize: our dequantize kernel on a GPU) and
    XLA's bf16 conv on them."""
    return lax.conv_general_dilated(x, wq.dequantize(jnp.bfloat16), (stride, stride), padding,
                                    dimension_numbers=("NHWC", "HWOI", "NHWC"))


def torch_timers(n, h, w, c, k, r, s, stride, graph_calls):
    """Timers of PyTorch's cuDNN conv2d (channels_last, bf16, benchmark mode), seconds per call,
    each over about as long as one of our timed loops; {} without a CUDA PyTorch.
    - "cudnn": CUDA events around back-to-back eager calls, what a PyTorch program sees. Its
      host dispatch can rival a 20 us kernel, so its readings move with the host.
    - "cudnn_graph": `graph_calls` calls captured once in a CUDA graph and replayed, so no host
      work runs between them: cuDNN's kernels back to back, the stronger anchor. Each output is
      dropped at once, so all calls write one buffer, which stays in L2.
    - "cudnn_graph_fresh": the same with every output kept, each in a buffer of its own, as the
      outputs of our chained calls in the JAX loop are (and a network's layers' are)."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    torch.backends.cudnn.benchmark = True
    x = torch.randn(n, c, h, w, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    wt = torch.randn(k, c, r, s, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    pad = ((r - 1) // 2, (s - 1) // 2)

    def conv():
        return torch.nn.functional.conv2d(x, wt, stride=stride, padding=pad)

    def per_call(run, iters, calls_per_iter=1, warm_s=0.0):
        """Seconds per call of `iters` runs, after running them untimed for `warm_s` seconds (as a
        LoopTimer's reading does, so the timer read before this one does not bias it)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warm_s:
            for _ in range(iters):
                run()
            torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / (iters * calls_per_iter)

    per_call(conv, 10)  # cuDNN's algorithm search
    eager_iters = int(min(2000, max(50, TARGET_S / per_call(conv, 50))))
    side = torch.cuda.Stream()  # capture needs warm-up on a side stream (torch.cuda.graphs)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            conv()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # each output freed at once: the pool gives every call one buffer
        for _ in range(graph_calls):
            conv()
    fresh = torch.cuda.CUDAGraph()
    with torch.cuda.graph(fresh):  # every output kept: a buffer of its own, as our JAX loop writes
        outputs = [conv() for _ in range(graph_calls)]
    del outputs  # the graph keeps its pool's memory
    graph_iters = int(min(200, max(5, TARGET_S / (per_call(graph.replay, 5, graph_calls) * graph_calls))))
    return {"cudnn": lambda: per_call(conv, eager_iters, warm_s=WARM_S),
            "cudnn_graph": lambda: per_call(graph.replay, graph_iters, graph_calls, WARM_S),
            "cudnn_graph_fresh": lambda: per_call(fresh.replay, graph_iters, graph_calls, WARM_S)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--chain", type=int, default=CHAIN, help="calls back to back per loop iteration")
    ap.add_argument("--also-chain", type=int, default=None,
                    help="also time ours with this many calls per loop iteration, in the same rounds")
    ap.add_argument("--forced", type=lambda v: tuple(dict.fromkeys(v.split(","))), default=(),
                    help="sm_90a kernels to time forced beside the library's choice, e.g. register_a")
    ap.add_argument("--only", type=lambda v: tuple(v.split(",")), default=(),
                    help="shapes whose name contains one of these words (default: all)")
    args = ap.parse_args()
    chain = args.chain
    dev = jax.devices()[0]
    rows = []
    shapes = [(name, shape) for name, shape in SHAPES if not args.only or any(o in name for o in args.only)]
    for name, (n, h, w, c, k, r, s, stride, padding) in shapes:
        kx, kw = jax.random.split(jax.random.key(0))
        x = jax.random.normal(kx, (n, h, w, c), jnp.float32).astype(jnp.bfloat16)
        w_hwio = jax.random.normal(kw, (r, s, c, k), jnp.float32) * 0.05
        wq = jn.quantize_conv_weight(w_hwio)
        w_bf16 = w_hwio.astype(jnp.bfloat16)
        ours = lambda xc, wq, st=stride: jn.conv(xc, wq, window_strides=(st, st), padding=padding)  # noqa: E731
        xla = lambda xc, wb, st=stride: lax.conv_general_dilated(  # noqa: E731
            xc, wb, (st, st), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
        timers = {"ours": LoopTimer(ours, (x, wq), rotate=False, chain=chain),
                  "xla": LoopTimer(xla, (x, w_bf16), rotate=False, chain=chain),
                  "dequant": LoopTimer(lambda xc, wq, st=stride: xla_dequantized(xc, wq, st, padding),
                                       (x, wq), rotate=False, chain=chain)}
        failed = {}
        for kernel in args.forced:
            timer = timer_forcing("JAX_NVFP4_CONV_SM90_KERNEL", kernel, ours, (x, wq),
                                  rotate=False, chain=chain)
            if timer is None:  # a forced kernel that does not take this shape: nan, not the run
                failed[kernel] = float("nan")
            else:
                timers[kernel] = timer
        if args.also_chain:
            timers["also_chain"] = LoopTimer(ours, (x, wq), rotate=False, chain=args.also_chain)
        timers.update(torch_timers(n, h, w, c, k, r, s, stride, chain))
        t = interleaved_times(timers) | failed
        t_ours, t_xla, t_deq, t_torch, t_graph = t["ours"], t["xla"], t["dequant"], t.get("cudnn"), t.get("cudnn_graph")
        t_fresh = t.get("cudnn_graph_fresh")
        out = jn.conv(x, wq, window_strides=(stride, stride), padding=padding)
        flops = 2.0 * out.shape[0] * out.shape[1] * out.shape[2] * k * r * s * c
        reuse, plain, bn = activation_bytes(n, h, w, c, k, r, s, stride, sms=dev.core_count)
        forced = {kernel: t[kernel] for kernel in args.forced + (("also_chain",) if args.also_chain else ())}
        rows.append((name, t_ours, t_xla, t_deq, t_torch, t_graph, t_fresh, flops, reuse, plain, bn, forced))
        print(f"{name:26s} ours {t_ours*1e6:8.1f} us  xla {t_xla*1e6:8.1f} us  dequant+xla {t_deq*1e6:8.1f} us  "
              f"cudnn {t_torch*1e6 if t_torch else float('nan'):8.1f} us  "
              f"cudnn graph {t_graph*1e6 if t_graph else float('nan'):8.1f} us  "
              f"fresh outputs {t_fresh*1e6 if t_fresh else float('nan'):8.1f} us  "
              + "  ".join(f"{kernel} {v*1e6:8.1f} us" for kernel, v in forced.items()), flush=True)

    date = datetime.date.today().isoformat()
    lines = [f"# jax_nvfp4.conv benchmark — {dev.device_kind}, {date}", "",
             "NVFP4 weights, bf16 activations and output; ours and XLA (lax.conv_general_dilated bf16; "
             "dequant + XLA: the NVFP4 weights dequantized to bf16 by jax_nvfp4.dequantize and that conv, "
             "in one jit): "
             f"a jitted fori_loop of {chain} back-to-back calls an iteration, the steady time of a call (runs of n and 2n "
             "iterations, their difference); cuDNN: PyTorch conv2d "
             "channels_last bf16, benchmark=True, eager calls back to back (CUDA events) and "
             f"{chain} of them replayed from a CUDA graph (no host work between them): each output dropped at once "
             "(every call writes one buffer, which stays in L2), and, 'fresh outputs', every output kept "
             "(a buffer each, as each of our chained calls writes). "
             "Timed round-robin, medians of 7 rounds. "
             "Activation MB: global->shared bytes of our kernel with "
             "the shifted-operand reuse / without it (each tap loading its own tile).", "",
             "| shape | ours µs | TFLOP/s | XLA bf16 µs | dequant + XLA µs | cuDNN bf16 µs | cuDNN graph µs | "
             "cuDNN graph, fresh outputs µs | vs XLA | vs dequant + XLA | vs cuDNN | vs cuDNN graph | "
             "vs cuDNN graph, fresh outputs | act. MB reuse / no reuse | kernel, tile |"
             + "".join(f" ours, {kernel} forced µs |" for kernel in args.forced)
             + (f" ours, {args.also_chain} calls an iteration µs |" if args.also_chain else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
             + "---|" * (len(args.forced) + bool(args.also_chain))]
    us = lambda t: f"{t*1e6:.1f}" if t else "n/a"  # noqa: E731
    for name, t_o, t_x, t_d, t_t, t_g, t_f, flops, reuse, plain, bn, forced in rows:
        vs = lambda t, t_o=t_o: f"{t/t_o:.2f}x" if t else "n/a"  # noqa: E731
        lines.append(f"| {name} | {t_o*1e6:.1f} | {flops/t_o/1e12:.0f} | {t_x*1e6:.1f} | {t_d*1e6:.1f} | "
                     f"{us(t_t)} | {us(t_g)} | {us(t_f)} | {t_x/t_o:.2f}x | {t_d/t_o:.2f}x | {vs(t_t)} | {vs(t_g)} | "
                     f"{vs(t_f)} | "
                     f"{reuse/1e6:.2f} / {plain/1e6:.2f} | {bn} |"
                     + "".join(f" {v*1e6:.1f} |" for v in forced.values()))
    write_table(lines, args.out, "conv", dev.device_kind)


if __name__ == "__main__":
    main()
