"""`python -m jax_nvfp4 demo`: what NVFP4 does to a real model's weights, and how fast.

The demo is a list of sections run in order; each op adds its own with the `section` decorator:

    from jax_nvfp4.demo import section

    @section("NVFP4 matmul: decode and prefill")
    def _matmul(ctx): ...

A section receives a DemoContext (device, whether kernels run, a size scale for CPU runs) and
prints its results.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_nvfp4 import _extension, reference
from jax_nvfp4.quantization import dequantize, quantize
from jax_nvfp4.selftest import selftest
from jax_nvfp4.timing import LoopTimer, interleaved_times


@dataclasses.dataclass(frozen=True)
class DemoContext:
    device: jax.Device
    on_gpu: bool
    shrink: int  # problem dimensions are divided by this (1 on a GPU, > 1 on the CPU)

    def shape(self, *dims: int) -> tuple[int, ...]:
        """A model shape scaled down by `shrink` (same aspect; multiples of 16 kept)."""
        return tuple(max(16, d // self.shrink // 16 * 16) for d in dims)


SECTIONS: list[tuple[str, Callable[[DemoContext], None]]] = []


def section(title: str):
    """Registers a demo section (a function of a DemoContext) under `title`."""

    def register(fn):
        SECTIONS.append((title, fn))
        return fn

    return register


def device_time(fn, *args, calls: int = 20) -> float:
    """Median seconds per call of the jitted `fn(*args)`, calls enqueued back to back (for ops
    that take longer than their host dispatch, ~30-50 us a call)."""
    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*args))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            out = jitted(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


# Llama-3-8B MLP: hidden 4096, intermediate 14336; weights [out, in] with K (in) last.
LLAMA3_8B_MLP = {"gate_proj": (14336, 4096), "up_proj": (14336, 4096),
                 "down_proj": (4096, 14336)}


def error_stats(w, q) -> dict:
    """Relative Frobenius error, max abs error and SNR (dB) of NVFP4 `q` against `w`."""
    w = np.asarray(w, np.float64)
    err = np.asarray(dequantize(q, jnp.float32), np.float64) - w
    rel = np.linalg.norm(err) / np.linalg.norm(w)
    return {"rel_fro": rel, "max_abs": float(np.abs(err).max()), "snr_db": -20 * np.log10(rel)}


@section("selftest")
def _selftest(ctx: DemoContext) -> None:
    selftest()


@section("NVFP4 quantization of Llama-3-8B MLP weights")
def _llama_weights(ctx: DemoContext) -> None:
    if ctx.shrink > 1:
        print(f"(CPU: shapes divided by {ctx.shrink}, same aspect ratio)")
    key = jax.random.key(0)
    print(f"{'weight':<10} {'shape':>12} {'rel Frobenius':>14} {'max |err|':>10} {'SNR dB':>7} "
          f"{'bf16 MiB':>8} {'NVFP4 MiB':>9}")
    total_bf16 = total_fp4 = 0
    for name, dims in LLAMA3_8B_MLP.items():
        key, sub = jax.random.split(key)
        shape = ctx.shape(*dims)
        w = jax.device_put(jax.random.normal(sub, shape, jnp.bfloat16) * 0.02, ctx.device)
        q = quantize(w)
        s = error_stats(w, q)
        bf16_mb, fp4_mb = w.size * 2 / 2**20, q.nbytes / 2**20
        total_bf16, total_fp4 = total_bf16 + bf16_mb, total_fp4 + fp4_mb
        print(f"{name:<10} {str(shape):>12} {s['rel_fro']:>14.4f} {s['max_abs']:>10.2e} "
              f"{s['snr_db']:>7.2f} {bf16_mb:>8.1f} {fp4_mb:>9.1f}")
    print(f"memory: {total_bf16:.1f} MiB bf16 -> {total_fp4:.1f} MiB NVFP4 "
          f"({total_bf16 / total_fp4:.2f}x smaller)")


@section("quantize / dequantize speed: CUDA kernel vs XLA-compiled reference")
def _speed(ctx: DemoContext) -> None:
    if not ctx.on_gpu:
        print("(no CUDA GPU: only the reference path exists; see bench/bench_quantize.py)")
        return
    shape = ctx.shape(*LLAMA3_8B_MLP["gate_proj"])
    w = jax.device_put(jax.random.normal(jax.random.key(1), shape, jnp.bfloat16), ctx.device)
    q = quantize(w)
    rows = [("quantize (amax + quantize)", quantize, reference.quantize, (w,)),
            ("dequantize -> bf16", lambda q: dequantize(q),
             lambda q: reference.dequantize(q.codes, q.scales, q.s_dec), (q,))]
    print(f"{shape} bf16 weight on {ctx.device.device_kind}")
    for name, kernel, ref, args in rows:
        tk, tr = device_time(kernel, *args), device_time(ref, *args)
        print(f"  {name:<28} kernel {tk * 1e6:8.1f} us   XLA reference {tr * 1e6:8.1f} us   "
              f"({tr / tk:.2f}x)")


@section("NVFP4 matmul: decode and prefill")
def _matmul(ctx: DemoContext) -> None:
    from jax_nvfp4.gemm import matmul

    n, k = ctx.shape(*LLAMA3_8B_MLP["gate_proj"])
    key_w, key_x = jax.random.split(jax.random.key(2))
    w = jax.device_put(jax.random.normal(key_w, (n, k), jnp.bfloat16) * 0.02, ctx.device)
    wq = quantize(w)
    dims = (((1,), (1,)), ((), ()))
    print(f"gate_proj W [{n}, {k}]: y = x @ W.T, bf16 activations, NVFP4 weights")
    for m in (1, 16, 4096 // ctx.shrink):
        x = jax.device_put(jax.random.normal(key_x, (m, k), jnp.bfloat16), ctx.device)
        y = matmul(x, wq, out_dtype=jnp.float32)
        exact = jax.lax.dot_general(x, wq.dequantize(jnp.float32), dims,
                                    precision=jax.lax.Precision.HIGHEST)
        full = jax.lax.dot_general(x, w, dims, preferred_element_type=jnp.float32)
        rel = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
        line = (f"  M={m:<5} error vs dequantized weights {rel(y, exact):.1e}, "
                f"vs bf16 weights {rel(y, full):.3f}")
        if ctx.on_gpu:
            # Many calls inside one jitted loop, weights rotated through copies larger than the
            # L2: a decode GEMV takes less GPU time than the host's dispatch of one call.
            t = interleaved_times({
                "nvfp4": LoopTimer(lambda a, b: matmul(a, b), (x, wq)),
                "bf16": LoopTimer(lambda a, b: jax.lax.dot_general(a, b, dims), (x, w)),
            }, rounds=3)
            line += (f"; {t['nvfp4'] * 1e6:.1f} us vs bf16 jnp.dot {t['bf16'] * 1e6:.1f} us "
                     f"({t['bf16'] / t['nvfp4']:.2f}x)")
        print(line)
    if ctx.on_gpu:
        print("  (GPU time per call; bench/bench_matmul.py has every shape and its peers)")


@section("Flax: a float nnx MLP converted to NVFP4 layers")
def _flax(ctx: DemoContext) -> None:
    try:
        from jax_nvfp4.flax import demo as flax_demo
    except ImportError:
        print("(flax is not installed: pip install 'jax_nvfp4[flax]')")
        return
    d_model, d_ff = ctx.shape(4096, 14336)
    with jax.default_device(ctx.device):
        flax_demo.run(d_model=d_model, d_ff=d_ff, timing=ctx.on_gpu)


def run(device: jax.Device | None = None) -> None:
    """Runs every demo section on `device` (default: the first CUDA GPU, else the CPU)."""
    if device is None:
        try:
            device = jax.devices("cuda")[0]
        except RuntimeError:
            device = jax.devices("cpu")[0]
    on_gpu = device.platform == "gpu" and _extension.device_arch(device) in _extension.cuda_archs()
    ctx = DemoContext(device, on_gpu, shrink=1 if device.platform == "gpu" else 4)
    for title, fn in SECTIONS:
        print(f"\n== {title}")
        fn(ctx)
