"""Ragged (grouped) NVFP4 matmul for MoE layers: jax_nvfp4.ragged_matmul beside bf16
lax.ragged_dot and XLA's dequantize + ragged_dot, in one run on one GPU.

    python bench/bench_ragged.py --out DIR

T tokens, each routed to top_k distinct experts drawn at random (fixed seed), give M = T * top_k
rows sorted by expert. Weights [G, N, K] of MoE models: Mixtral-8x7B's gate/up projections fused
(swiglu, 8 x 28672 x 4096) and down projection (8 x 4096 x 14336), DeepSeek-V2-Lite's routed
experts' gate/up (64 x 2816 x 2048, top 6). Ours is timed on the path it picks ("auto"), and on
each path forced (JAX_NVFP4_RAGGED_PATH; --paths picks them, --layers the layers): the decode
kernel (8-row tiles), the fused_ws kernel (64-, 128- and 256-row tiles on wgmma) and XLA's path,
which is the dequantize + ragged_dot peer (the weights' e2m1 x e4m3 values in bf16, then
lax.ragged_dot). A path the GPU or shape refuses (the sm_90a kernels on sm_100a) reads nan.
bf16 lax.ragged_dot holds its weights as [G, K, N]. Calls rotate through weight copies larger
than the L2; times are medians of LoopTimer readings taken round-robin (jax_nvfp4/timing.py), us
per call. The roofline of a shape is the
longer of two times: the NVFP4 bytes of the experts that hold rows (4.5 bits an element) over the
HBM read + write rate, and its 2 M N K flops over the MMA ceiling (a bf16 jnp.dot of 8192 x 4096
by 4096 x 14336); both measured in the same run. Results: DIR/ragged_<device>.md.
"""

from __future__ import annotations

import datetime
import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_nvfp4 as nv
from jax_nvfp4.primitives.ragged import RAGGED_PATH_ENV
from jax_nvfp4.timing import LoopTimer, interleaved_times

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_matmul import hbm_bandwidth  # noqa: E402
from report import NVFP4_BYTES_PER_ELEMENT, table_parser, timer_forcing, write_table  # noqa: E402

# (name, G, N, K, activation, top_k)
LAYERS = [("Mixtral-8x7B w1+w3", 8, 28672, 4096, "swiglu", 2),
          ("Mixtral-8x7B w2", 8, 4096, 14336, None, 2),
          ("DeepSeek-V2-Lite w1+w3", 64, 2816, 2048, "swiglu", 6)]
TOKENS = [1, 4, 16, 64]
PATHS = ("decode", "fused_ws_64", "fused_ws", "fused_ws_256", "xla")
PATH_COLUMNS = {"decode": "decode", "fused_ws_64": "fused_ws 64",
                "fused_ws": "fused_ws 128", "fused_ws_256": "fused_ws 256", "xla": "XLA path"}


def routing(tokens: int, groups: int, top_k: int, seed: int) -> np.ndarray:
    """Rows per expert of `tokens` tokens each sent to top_k distinct random experts."""
    rng = np.random.default_rng(seed)
    picks = np.concatenate([rng.choice(groups, top_k, replace=False) for _ in range(tokens)])
    return np.bincount(picks, minlength=groups).astype(np.int32)


def expert_weights(key, groups: int, n: int, k: int):
    """A layer's random experts: NVFP4 [G, N, K], and bf16 [G, K, N] (lax.ragged_dot's layout)."""
    w16 = (jax.random.normal(key, (groups, n, k), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    return jax.vmap(nv.quantize)(w16), jnp.swapaxes(w16, 1, 2)


def bf16_ragged_dot(x, w_kn, sizes, activation=None):
    """The bf16 peer: lax.ragged_dot with float32 sums, then the activation, in bfloat16."""
    y = lax.ragged_dot(x, w_kn, sizes, preferred_element_type=jnp.float32)
    if activation == "swiglu":
        y = jax.nn.silu(y[:, 0::2]) * y[:, 1::2]
    return y.astype(jnp.bfloat16)


def mma_ceiling(rounds: int) -> float:
    """FLOP/s of a compute-bound bf16 jnp.dot (8192 x 4096 by 4096 x 14336) on this GPU."""
    m, k, n = 8192, 4096, 14336
    keys = jax.random.split(jax.random.key(1), 2)
    a = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    b = jax.random.normal(keys[1], (k, n), jnp.bfloat16)
    seconds = interleaved_times({"dot": LoopTimer(jnp.dot, (a, b))}, rounds)["dot"]
    return 2.0 * m * n * k / seconds


def run(out_dir: Path, rounds: int, tokens: list[int], paths: list[str], layers: list[str]):
    device = jax.devices()[0]
    name = device.device_kind
    bw = hbm_bandwidth()
    peak = mma_ceiling(rounds)
    lines = [f"# Ragged NVFP4 matmul (MoE layers) on {name}", "",
             f"{datetime.date.today()} · jax {jax.__version__} · bf16 x and output · us per call "
             f"(median of round-robin LoopTimer readings, weights rotated past the L2) · HBM read "
             f"+ write {bw / 1e12:.2f} TB/s · MMA ceiling (bf16 jnp.dot) {peak / 1e12:.0f} TFLOP/s "
             f"· roofline: the longer of the NVFP4 bytes of the experts holding rows / HBM and "
             f"2 M N K / MMA ceiling",
             "",
             "| layer | tokens | M | experts used | NVFP4 auto | "
             + "".join(f"{PATH_COLUMNS[p]} | " for p in paths)
             + "bf16 ragged_dot | auto vs bf16 | "
             + ("auto vs XLA path | " if "xla" in paths else "") + "TFLOP/s | % of roofline |",
             "|---|" + "---:|" * (8 + len(paths) + ("xla" in paths))]
    keys = jax.random.split(jax.random.key(0), 2)
    for layer, groups, n, k, activation, top_k in LAYERS:
        if layer not in layers:
            continue
        wq, w_kn = expert_weights(keys[0], groups, n, k)
        ours = functools.partial(nv.ragged_matmul, activation=activation)
        bf16 = functools.partial(bf16_ragged_dot, activation=activation)

        for t in tokens:
            sizes = routing(t, groups, top_k, seed=t)
            m = int(sizes.sum())
            used = int((sizes > 0).sum())
            x = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
            s = jnp.asarray(sizes)
            timers = {p: timer_forcing(RAGGED_PATH_ENV, p, ours, (x, wq, s)) for p in ("auto", *paths)}
            timers["bf16"] = LoopTimer(bf16, (x, w_kn, s))
            refused = {p: float("nan") for p, timer in timers.items() if timer is None}
            timed = {p: timer for p, timer in timers.items() if timer is not None}
            us = {key: v * 1e6 for key, v in interleaved_times(timed, rounds).items()} | refused
            flops = 2.0 * m * n * k
            roofline_us = max(used * n * k * NVFP4_BYTES_PER_ELEMENT / bw, flops / peak) * 1e6
            vs_xla = f"{us['xla'] / us['auto']:.2f}x | " if "xla" in paths else ""
            lines.append(f"| {layer} | {t} | {m} | {used} of {groups} | {us['auto']:.1f} | "
                         + "".join(f"{us[p]:.1f} | " for p in paths)
                         + f"{us['bf16']:.1f} | {us['bf16'] / us['auto']:.2f}x | {vs_xla}"
                         f"{flops / us['auto'] / 1e6:.0f} | {100 * roofline_us / us['auto']:.0f}% |")
            print(lines[-1], flush=True)
            del timers
        del wq, w_kn
    write_table(lines, out_dir, "ragged", name)


def main():
    parser = table_parser(__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    parser.add_argument("--paths", nargs="*", choices=PATHS, default=list(PATHS),
                        help="the paths timed forced, beside the launcher's choice")
    parser.add_argument("--layers", nargs="+", choices=[layer[0] for layer in LAYERS],
                        default=[layer[0] for layer in LAYERS])
    args = parser.parse_args()
    run(args.out, args.rounds, args.tokens, args.paths, args.layers)


if __name__ == "__main__":
    main()
