"""Tensor-parallel NVFP4 inference of Llama-style decoder blocks over every local device.

    python examples/sharded_llama.py [--small] [--layers 4] [--out FILE|DIR] [--profile DIR]
                                     [--reduce-dtype bfloat16]

A stack of decoder blocks with the dimensions of an 8B-class Llama (hidden 4096, MLP 14336, 32
query heads, 8 KV heads of 128) and random weights: RMSNorm, q/k/v/o projections with plain
grouped-query softmax attention (no rotary embedding: it changes no matmul), SwiGLU MLP. The
weights are NVFP4 (jax_nvfp4.quantize of each [out, in] matrix) placed Megatron-style on a 1-D mesh
"tp": the fused q/k/v and gate/up projections column-parallel (output features split: no
communication), o/down row-parallel (input features split: local GEMM, then one all-reduce), so
each block does four GEMMs and two all-reduces and never gathers a weight. The fused q/k/v
projection stacks its parts device by device ([q_0 k_0 v_0 q_1 k_1 v_1 ...] for tp devices), so
each device's slice of the output holds its own heads of q, k and v (split_fused); the bf16 gate/up
projection likewise ([gate_0 up_0 gate_1 up_1 ...]), paired after the GEMM. The NVFP4 model holds
the same gate/up rows interleaved (gate j, up j: jax_nvfp4.interleave_gate_up's layout, which any
split keeps in pairs) and applies SwiGLU in the GEMM (activation="swiglu"). The same model in
bfloat16, sharded the same way, is the baseline. The script checks that the sharded NVFP4 model
matches a one-device run of itself, then times a decode step (batch 1 and 16, against a KV cache)
and a prefill, and writes a markdown table. A decode step's time is the steady cost of one more
step: programs of `--steps` and twice as many steps are timed, and their difference divided by
`--steps` (what a program costs once, its launch and the wait for its result, drops out, as in
jax_nvfp4.timing); the table also gives the older reading, one program's time per step. The
prefill is timed twice: as above, and sequence-parallel (Megatron's: between blocks the tokens
are split over the devices, the norms run on each device's tokens, the column-parallel GEMMs take
the all-gathered tokens, and the row-parallel ones reduce-scatter their sums instead of
all-reducing them). --profile adds where the GPU time of a batch-1 decode step goes, kernel by
kernel (jax.profiler). --reduce-dtype bfloat16 makes both models add their row-parallel partial
products across devices in bfloat16 (half the bytes). --small shrinks the model so it runs on
forced CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import gzip
import json
import math
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

import jax_nvfp4 as nv
from jax_nvfp4.sharding import nvfp4_sharding


@dataclasses.dataclass(frozen=True)
class Config:
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    layers: int = 4
    context: int = 1024  # KV-cache length a decode step attends to
    prefill: int = 2048  # tokens of the prefill
    decode_batches: tuple[int, ...] = (1, 16)
    eps: float = 1e-5


SMALL = Config(hidden=1024, intermediate=1024, heads=8, kv_heads=8, head_dim=128, layers=1,
               context=64, prefill=64, decode_batches=(1, 16))

COLUMN = ("wqkv", "wgu")  # output features split
ROW = ("wo", "wd")  # input features split


def qkv_parts(cfg: Config) -> tuple[int, int, int]:
    """Output features of q, k and v in the fused projection."""
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    return q, kv, kv


def weight_shapes(cfg: Config) -> dict[str, tuple[int, int]]:
    """[out, in] of each projection of one block (wgu: the gate and up projections)."""
    h, f = cfg.hidden, cfg.intermediate
    parts = qkv_parts(cfg)
    return {"wqkv": (sum(parts), h), "wo": (h, parts[0]), "wgu": (2 * f, h), "wd": (h, f)}


def weight_spec(name: str) -> P:
    return P("tp", None) if name in COLUMN else P(None, "tp")


# ------------------------------------------------------------------------------ the model


def rms_norm(x, gain, eps):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * gain).astype(x.dtype)


def attention(q, chunks, cfg: Config):
    """Grouped-query softmax attention of q [B, S, Hq, D] over key/value chunks [B, T_i, Hkv, D]:
    earlier tokens (a KV cache, all visible), then the S current tokens (causal). The cache is
    read in place, as a decode step does, not copied into a longer array."""
    b, s, hq, d = q.shape
    q = q.reshape(b, s, cfg.kv_heads, hq // cfg.kv_heads, d)
    scores = [jnp.einsum("bsngd,btnd->bngst", q, k, preferred_element_type=jnp.float32)
              for k, _ in chunks]
    causal = jnp.arange(s)[None, :] <= jnp.arange(s)[:, None]
    scores[-1] = jnp.where(causal, scores[-1], -jnp.inf)
    probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1) / math.sqrt(d), axis=-1)
    probs = probs.astype(chunks[0][1].dtype)
    out, start = 0.0, 0
    for _, v in chunks:
        part = probs[..., start:start + v.shape[1]]
        out = out + jnp.einsum("bngst,btnd->bsngd", part, v, preferred_element_type=jnp.float32)
        start += v.shape[1]
    return out.astype(v.dtype).reshape(b, s, hq * d)


def split_fused(y, sizes, tp):
    """The parts of a fused projection's output y [..., sum(sizes)] whose rows were stacked
    device by device for `tp` devices: each reshape keeps every device's features on it."""
    lead = y.shape[:-1]
    y = y.reshape(*lead, tp, sum(sizes) // tp)
    parts, start = [], 0
    for size in sizes:
        parts.append(y[..., start:start + size // tp].reshape(*lead, size))
        start += size // tp
    return parts


@dataclasses.dataclass(frozen=True)
class SequenceParallel:
    """Sharding constraints of sequence parallelism on a 1-D mesh "tp": activations [B, S, H]
    between the blocks' GEMMs split by tokens (`shard`) or whole on every device (`gather`)."""

    mesh: Mesh

    def shard(self, a):
        return jax.lax.with_sharding_constraint(a, NamedSharding(self.mesh, P(None, "tp", None)))

    def gather(self, a):
        return jax.lax.with_sharding_constraint(a, NamedSharding(self.mesh, P()))


def block(x, layer, cache, cfg: Config, linear, tp, sp: SequenceParallel | None = None):
    """One decoder block. cache: (k, v) [B, T, Hkv, D] of earlier tokens, or None (prefill).
    With `sp`, x and the block's output are split by tokens: each norm runs on its device's
    tokens, the column-parallel GEMMs take them gathered, the row-parallel outputs are asked
    split by tokens (so the matmul reduce-scatters instead of all-reducing)."""
    b, s, _ = x.shape
    gather = sp.gather if sp else (lambda a: a)
    shard = sp.shard if sp else (lambda a: a)
    h = gather(rms_norm(x, layer["attn_norm"], cfg.eps))
    q, k, v = split_fused(linear(h, layer["wqkv"]), qkv_parts(cfg), tp)
    q = q.reshape(b, s, cfg.heads, cfg.head_dim)
    k = k.reshape(b, s, cfg.kv_heads, cfg.head_dim)
    v = v.reshape(b, s, cfg.kv_heads, cfg.head_dim)
    chunks = [(k, v)] if cache is None else [cache, (k, v)]
    x = x + shard(linear(attention(q, chunks, cfg), layer["wo"]))
    h = gather(rms_norm(x, layer["mlp_norm"], cfg.eps))
    act = swiglu(h, layer["wgu"], linear, tp)
    return x + shard(linear(act, layer["wd"]))


def swiglu(h, w, linear, tp):
    """silu(gate) * up of the gate/up projection: an NVFP4 weight's rows are interleaved pairs and
    its GEMM applies it; the bf16 weight stacks [gate_d up_d] device by device and XLA pairs them
    after its GEMM."""
    if isinstance(w, nv.NVFP4Array):
        return linear(h, w, activation="swiglu")
    gate, up = split_fused(linear(h, w), (w.shape[0] // 2,) * 2, tp)
    return (jax.nn.silu(gate.astype(jnp.float32)) * up).astype(h.dtype)


def forward(x, params, caches, cfg: Config, linear, tp, sp: SequenceParallel | None = None):
    for i, layer in enumerate(params):
        x = block(x, layer, None if caches is None else caches[i], cfg, linear, tp, sp)
    return x


def nvfp4_linear(x, w, reduce_dtype=None, activation=None):
    return nv.matmul(x, w, activation=activation, out_dtype=x.dtype, reduce_dtype=reduce_dtype)


def bf16_linear(x, w, reduce_dtype=None):
    """The bf16 model's GEMM. A row-parallel one's partial products are summed across devices
    in the dot's result type: float32, or with reduce_dtype=bfloat16 bfloat16 (as
    jax_nvfp4.matmul's reduce_dtype, and Megatron's row-parallel layers)."""
    result = jnp.float32 if reduce_dtype is None else reduce_dtype
    return jnp.einsum("...k,nk->...n", x, w, preferred_element_type=result).astype(x.dtype)


# ------------------------------------------------------------------------------ weights


def make_params(cfg: Config, mesh: Mesh, key):
    """Random bf16 weights placed on the mesh, and their NVFP4 quantization (quantized where
    they lie: the sharded quantize all-reduces each weight's amax)."""
    shapes = weight_shapes(cfg)
    quantize = jax.jit(nv.quantize)
    init = {name: jax.jit(functools.partial(_random_weight, shape=shape),
                          out_shardings=NamedSharding(mesh, weight_spec(name)))
            for name, shape in shapes.items()}
    norms = jax.device_put({"attn_norm": jnp.ones((cfg.hidden,), jnp.float32),
                            "mlp_norm": jnp.ones((cfg.hidden,), jnp.float32)},
                           NamedSharding(mesh, P()))
    tp = mesh.shape["tp"]
    gate_up_pairs = jax.jit(functools.partial(interleaved_gate_up, tp=tp))
    bf16, nvfp4 = [], []
    for layer_key in jax.random.split(key, cfg.layers):
        wkeys = dict(zip(shapes, jax.random.split(layer_key, len(shapes))))
        layer_bf16 = {name: init[name](wkeys[name]) for name in shapes}
        layer_nvfp4 = {name: jax.device_put(quantize(gate_up_pairs(w) if name == "wgu" else w),
                                            nvfp4_sharding(mesh, weight_spec(name), w.shape))
                       for name, w in layer_bf16.items()}
        bf16.append({**norms, **layer_bf16})
        nvfp4.append({**norms, **layer_nvfp4})
    return bf16, nvfp4


def interleaved_gate_up(w, tp):
    """The bf16 gate/up weight's rows ([gate_d up_d] stacked device by device for tp devices)
    regrouped into interleaved pairs (jax_nvfp4.interleave_gate_up): the same projection, in the
    layout activation="swiglu" reads."""
    f = w.shape[0] // 2
    stacked = w.reshape(tp, 2, f // tp, w.shape[1])
    return nv.interleave_gate_up(stacked[:, 0].reshape(f, -1), stacked[:, 1].reshape(f, -1))


def _random_weight(key, shape):
    return (jax.random.normal(key, shape, jnp.float32) / math.sqrt(shape[1])).astype(jnp.bfloat16)


def bytes_on(tree, device) -> int:
    """Bytes of `tree`'s arrays held on `device` (float4 codes count half a byte)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        bits = 4 if leaf.dtype == nv.format.CODE_DTYPE else 8 * leaf.dtype.itemsize
        total += sum(s.data.size for s in leaf.addressable_shards if s.device == device) * bits // 8
    return total


def weight_bytes(params, device) -> int:
    return bytes_on([{k: v for k, v in layer.items() if k.startswith("w")} for layer in params],
                    device)


# ------------------------------------------------------------------------------ runs


def decode_steps(cfg: Config, linear, tp: int, steps: int):
    """`steps` decode steps in one program, each step's output feeding the next (so no step
    can be hoisted or skipped)."""

    def run(x, params, caches):
        return jax.lax.fori_loop(0, steps,
                                 lambda _, y: forward(y, params, caches, cfg, linear, tp), x)

    return jax.jit(run)


def time_ms(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def kv_caches(cfg: Config, mesh: Mesh, batch: int, key):
    shape = (batch, cfg.context, cfg.kv_heads, cfg.head_dim)
    spec = NamedSharding(mesh, P(None, None, "tp", None))  # heads split like k/v's outputs
    make = jax.jit(lambda k: jax.random.normal(k, shape, jnp.bfloat16), out_shardings=spec)
    return [(make(k1), make(k2)) for k1, k2 in jax.random.split(key, (cfg.layers, 2))]


def relative_error(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def check_against_one_device(cfg, mesh, params, key, linear=nvfp4_linear) -> float:
    """Relative difference of the sharded NVFP4 prefill from the same model on one device."""
    x = jax.random.normal(key, (2, min(cfg.prefill, 128), cfg.hidden), jnp.bfloat16)
    # The same fused layout (stacked for the mesh's tp devices) computed on one device.
    tp = mesh.shape["tp"]
    fwd = jax.jit(lambda x, p: forward(x, p, None, cfg, linear, tp))
    sharded = fwd(jax.device_put(x, NamedSharding(mesh, P())), params)
    one = SingleDeviceSharding(mesh.devices.flat[0])
    single = fwd(jax.device_put(x, one), jax.device_put(params, one))
    return relative_error(sharded, single)


def measure(cfg: Config, mesh: Mesh, models, steps: int, repeats: int):
    """[(label, {model: ms})]: per batch size a decode step (steady: the difference of programs of
    `steps` and 2 * `steps` steps, per step) and one `steps`-step program's time per step; then
    the prefill, without and with sequence parallelism; and [(label, {model: bytes})]: each
    prefill's temporary memory per device, as compiled (XLA's buffer assignment: the activations
    live at its peak)."""
    replicated = NamedSharding(mesh, P())
    key = jax.random.key(3)
    tp = mesh.shape["tp"]
    rows = []
    for batch in cfg.decode_batches:
        x = jax.device_put(jax.random.normal(key, (batch, 1, cfg.hidden), jnp.bfloat16),
                           replicated)
        caches = kv_caches(cfg, mesh, batch, jax.random.key(2))
        programs = {name: [time_ms(decode_steps(cfg, lin, tp, n), x, params, caches,
                                   repeats=repeats) for n in (steps, 2 * steps)]
                    for name, lin, params in models}
        # NaN where the longer program did not take longer: the step is below the timer's noise
        rows.append((f"decode step, batch {batch}, context {cfg.context}",
                     {name: (t2 - t1) / steps if t2 > t1 else math.nan
                      for name, (t1, t2) in programs.items()}))
        rows.append((f"decode, batch {batch}: one {steps}-step program, per step",
                     {name: t1 / steps for name, (t1, _) in programs.items()}))
    x = jax.random.normal(key, (1, cfg.prefill, cfg.hidden), jnp.bfloat16)
    memory = []
    for label, sp, spec in ((f"prefill, {cfg.prefill} tokens", None, P()),
                            (f"prefill, {cfg.prefill} tokens, sequence-parallel",
                             SequenceParallel(mesh), P(None, "tp", None))):
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        runs = {name: (prefill(cfg, lin, tp, sp), params) for name, lin, params in models}
        rows.append((label, {name: time_ms(run, xs, params, repeats=repeats)
                             for name, (run, params) in runs.items()}))
        memory.append((f"{label}: temporaries per device (MiB)",
                       {name: run.lower(xs, params).compile().memory_analysis().temp_size_in_bytes
                        for name, (run, params) in runs.items()}))
    return rows, memory


def prefill(cfg: Config, linear, tp: int, sp: SequenceParallel | None = None):
    return jax.jit(functools.partial(forward, caches=None, cfg=cfg, linear=linear, tp=tp, sp=sp))


def kernel_times(trace_dir) -> tuple[dict[str, tuple[float, int]], float]:
    """From the Perfetto trace that jax.profiler wrote under trace_dir: per kernel name on the
    first GPU's streams, its summed time (us) and launch count; and the span (us) from the
    first kernel's start to the last one's end."""
    path = next(pathlib.Path(trace_dir).rglob("perfetto_trace.json.gz"))
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {(e["name"], e["pid"], e.get("tid")): e["args"]["name"]
             for e in events if e.get("ph") == "M" and "name" in e.get("args", {})}
    gpu = [pid for (kind, pid, _), name in names.items()
           if kind == "process_name" and "GPU" in name]
    kernels = [e for e in events if gpu and e.get("ph") == "X" and e["pid"] == min(gpu)
               and names.get(("thread_name", e["pid"], e.get("tid")), "").startswith("Stream")]
    if not kernels:
        raise RuntimeError(f"no GPU kernels in the trace {path}; processes and threads: "
                           f"{sorted(set(names.values()))}")
    times: dict[str, tuple[float, int]] = {}
    for e in kernels:
        total, count = times.get(e["name"], (0.0, 0))
        times[e["name"]] = (total + e["dur"], count + 1)
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    return times, span


def profile_decode(cfg: Config, mesh: Mesh, models, steps: int, log_dir) -> str:
    """Markdown: where the GPU time of a batch-1 decode step goes on one device, per block and
    kernel, for each model (one traced run of the timed program)."""
    tp = mesh.shape["tp"]
    x = jax.device_put(jnp.ones((1, 1, cfg.hidden), jnp.bfloat16), NamedSharding(mesh, P()))
    caches = kv_caches(cfg, mesh, 1, jax.random.key(2))
    blocks = steps * cfg.layers
    lines = [f"Batch-1 decode step on {mesh.devices.flat[0]}, us per block (one traced program "
             f"of {steps} steps; launches per block):", ""]
    for name, linear, params in models:
        run = decode_steps(cfg, linear, tp, steps)
        jax.block_until_ready(run(x, params, caches))
        trace_dir = pathlib.Path(log_dir) / name
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            jax.block_until_ready(run(x, params, caches))
        times, span = kernel_times(trace_dir)
        busy = sum(t for t, _ in times.values())
        lines += [f"| {name} kernel | us | launches |", "|---|---:|---:|"]
        for kernel, (t, n) in sorted(times.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"| `{kernel[:80]}` | {t / blocks:.1f} | {n / blocks:g} |")
        lines += [f"| **all kernels** | **{busy / blocks:.1f}** | |",
                  f"| first kernel start to last kernel end | {span / blocks:.1f} | |", ""]
    return "\n".join(lines)


def render(cfg: Config, devices, rows, memory, err, reduce_dtype) -> str:
    """The markdown table: times (rows) and memory ((label, {model: bytes}) pairs)."""
    kinds = ", ".join(sorted({d.device_kind for d in devices}))
    gemm = ("CUDA kernel" if nv._extension.kernel_available("jax_nvfp4_gemm")
            else "XLA reference path (no GEMM kernel for this device)")
    lines = [
        f"# Tensor-parallel Llama blocks: NVFP4 vs bf16 ({len(devices)} x {kinds})",
        "",
        f"{datetime.date.today()} · jax {jax.__version__} · NVFP4 GEMM: {gemm} · "
        f"hidden {cfg.hidden}, MLP {cfg.intermediate}, heads {cfg.heads}/{cfg.kv_heads} KV, "
        f"{cfg.layers} layers · mesh tp={len(devices)} (fused q/k/v and gate/up column-, "
        f"o/down row-parallel, partial sums added across devices in {reduce_dtype.name}) · "
        f"sharded NVFP4 vs one device: relative difference {err:.1e}",
        "",
        "| | NVFP4 ms | bf16 ms | speedup |",
        "|---|---:|---:|---:|",
    ]
    for label, ms in rows:
        if math.isnan(ms["nvfp4"]) or math.isnan(ms["bf16"]):
            cells = [f"{ms[m]:.3f}" if not math.isnan(ms[m]) else "noise" for m in ("nvfp4", "bf16")]
            lines.append(f"| {label} | {cells[0]} | {cells[1]} | below the timer's noise: "
                         "raise --steps or --repeats |")
            continue
        lines.append(f"| {label} | {ms['nvfp4']:.3f} | {ms['bf16']:.3f} | "
                     f"{ms['bf16'] / ms['nvfp4']:.2f}x |")
    for label, size in memory:
        lines.append(f"| {label} | {size['nvfp4'] / 2**20:.1f} | {size['bf16'] / 2**20:.1f} | "
                     f"{size['nvfp4'] / size['bf16']:.3f} of bf16 |")
    return "\n".join(lines) + "\n"


def out_file(out: str, devices) -> pathlib.Path:
    """--out: the table's file, or an existing directory, which gets
    sharded_llama_<device kind>x<device count>_<date>.md (bench/'s scripts take a directory too).
    Checked before the run, so a bad path fails at once rather than after the timing."""
    path = pathlib.Path(out)
    if path.is_dir():
        kind = devices[0].device_kind.replace(" ", "_")
        path = path / f"sharded_llama_{kind}x{len(devices)}_{datetime.date.today()}.md"
    if not path.parent.is_dir():
        raise SystemExit(f"--out {out}: the directory {path.parent} does not exist")
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="small model (CPU smoke test)")
    parser.add_argument("--layers", type=int, default=None, help="decoder blocks")
    parser.add_argument("--steps", type=int, default=8, help="decode steps per timed program")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (median)")
    parser.add_argument("--out", default=None,
                        help="write the markdown table to this file, or into this directory")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="trace a batch-1 decode program per model into DIR and add its "
                             "GPU time per kernel to the table")
    parser.add_argument("--reduce-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="dtype both models sum their row-parallel partial products in "
                             "across devices")
    args = parser.parse_args(argv)
    reduce_dtype = jnp.dtype(args.reduce_dtype)
    cfg = SMALL if args.small else Config()
    if args.layers:
        cfg = dataclasses.replace(cfg, layers=args.layers)

    devices = jax.devices()
    out = out_file(args.out, devices) if args.out else None
    mesh = Mesh(np.array(devices), ("tp",))
    key = jax.random.key(0)
    bf16, nvfp4 = make_params(cfg, mesh, key)
    linear = {"nvfp4": functools.partial(nvfp4_linear, reduce_dtype=reduce_dtype),
              "bf16": functools.partial(bf16_linear, reduce_dtype=reduce_dtype)}
    err = check_against_one_device(cfg, mesh, nvfp4, jax.random.key(1), linear["nvfp4"])
    matches = err < 2e-2  # bf16 activations; row-parallel sums add in another order
    print(f"sharded NVFP4 vs one device: relative difference {err:.2e}; "
          f"matches one device: {'yes' if matches else 'NO'}")

    models = (("nvfp4", linear["nvfp4"], nvfp4), ("bf16", linear["bf16"], bf16))
    rows, prefill_memory = measure(cfg, mesh, models, args.steps, args.repeats)
    weights = {"nvfp4": weight_bytes(nvfp4, devices[0]), "bf16": weight_bytes(bf16, devices[0])}
    table = render(cfg, devices, rows, [("weight memory per device (MiB)", weights)]
                   + prefill_memory, err, reduce_dtype)
    print(table)
    if args.profile:
        profile = profile_decode(cfg, mesh, models, args.steps, args.profile)
        print(profile)
        table += "\n" + profile
    if out:
        out.write_text(table)
        print(f"wrote {out}")
    return 0 if matches else 1


if __name__ == "__main__":
    raise SystemExit(main())
