"""The Flax section of the jax_nvfp4 demo: a float nnx MLP block converted to NVFP4.

Builds a small bfloat16 transformer-style MLP (up, gelu, down, plus an LM head kept float),
converts it with `convert.quantize_model`, runs both under jit and reports the output error,
the cosine similarity, the parameter memory and, on a GPU, the time per forward pass."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jax_nvfp4.flax import convert
from jax_nvfp4.format import CODE_DTYPE


class _MLP(nnx.Module):
    def __init__(self, d_model: int, d_ff: int, vocab: int, rngs: nnx.Rngs):
        kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=rngs)
        self.up = nnx.Linear(d_model, d_ff, **kw)
        self.down = nnx.Linear(d_ff, d_model, **kw)
        self.head = nnx.Linear(d_model, vocab, **kw)

    def block(self, x):
        return x + self.down(nnx.gelu(self.up(x)))

    def __call__(self, x):
        return self.head(self.block(x))


def parameter_bytes(model) -> int:
    """Bytes of a model's state as stored on a device (NVFP4 codes at 4 bits)."""
    total = 0
    for leaf in jax.tree.leaves(nnx.state(model)):
        total += leaf.size // 2 if leaf.dtype == CODE_DTYPE else leaf.nbytes
    return total


def _seconds_per_block(model, x, iters: int) -> float:
    """Device time of one MLP block, from `iters` dependent blocks in one jitted loop (so host
    dispatch, ~30 us a call, is not what is measured)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def loop(state, x):
        m = nnx.merge(graphdef, state)
        return lax.fori_loop(0, iters, lambda _, h: m.block(h).astype(h.dtype), x)

    loop(state, x).block_until_ready()
    start = time.perf_counter()
    loop(state, x).block_until_ready()
    return (time.perf_counter() - start) / iters


def run(log=print, *, d_model: int = 4096, d_ff: int = 14336, vocab: int = 1024,
        tokens: int = 16, timing: bool | None = None, timing_tokens: tuple[int, ...] = (1, 4096),
        iters: int = 50) -> dict:
    """Runs the section on the default device, logging each line with `log`; returns the
    figures. `timing` (default: on a GPU) times one MLP block for each of `timing_tokens`."""
    rngs = nnx.Rngs(0)
    model = _MLP(d_model, d_ff, vocab, rngs)
    quantized = convert.quantize_model(nnx.clone(model), predicate=convert.skip("head"))
    x = jax.random.normal(jax.random.key(1), (tokens, d_model), jnp.bfloat16)

    forward = nnx.jit(lambda m, x: m(x))
    y_float = forward(model, x).astype(jnp.float32)
    y_nvfp4 = forward(quantized, x).astype(jnp.float32)
    err = float(jnp.max(jnp.abs(y_nvfp4 - y_float)))
    scale = float(jnp.max(jnp.abs(y_float)))
    cosine = float(jnp.sum(y_nvfp4 * y_float)
                   / (jnp.linalg.norm(y_nvfp4) * jnp.linalg.norm(y_float)))
    mem_float, mem_nvfp4 = parameter_bytes(model), parameter_bytes(quantized)
    figures = dict(max_abs_error=err, max_abs_output=scale, cosine=cosine,
                   bytes_float=mem_float, bytes_nvfp4=mem_nvfp4)
    log(f"Flax nnx MLP {d_model}->{d_ff}->{d_model} + float head {vocab}, bf16, "
        f"up/down converted to NVFP4 (W4A16)")
    log(f"  outputs vs float model: max |err| {err:.4g} (max |y| {scale:.4g}), "
        f"cosine similarity {cosine:.6f}")
    log(f"  parameter memory: {mem_float / 2**20:.1f} MiB bf16 -> {mem_nvfp4 / 2**20:.1f} MiB "
        f"({mem_float / mem_nvfp4:.2f}x smaller)")
    if timing is None:
        timing = jax.default_backend() == "gpu"
    if not timing:
        log("  speed: measured on a GPU only")
        return figures
    for m in timing_tokens:
        h = jax.random.normal(jax.random.key(2), (m, d_model), jnp.bfloat16)
        t_float = _seconds_per_block(model, h, iters)
        t_nvfp4 = _seconds_per_block(quantized, h, iters)
        figures[f"us_float_m{m}"], figures[f"us_nvfp4_m{m}"] = t_float * 1e6, t_nvfp4 * 1e6
        log(f"  MLP block, {m} tokens: bf16 {t_float * 1e6:.1f} us, NVFP4 {t_nvfp4 * 1e6:.1f} us "
            f"({t_float / t_nvfp4:.2f}x) on {jax.devices()[0].device_kind}")
    return figures
