"""`jax_nvfp4.selftest()`: every CUDA kernel path built for this machine's GPU, run on small
random problems and compared with the pure-JAX reference computed on the CPU.

On a GPU whose kernels were never run before (sm_100a here), this is the first check that they
compute what the reference computes. Each op registers one check:

    from jax_nvfp4.selftest import register_check
    register_check("matmul", "jax_nvfp4_gemm", my_check)

where my_check(device) runs the op on `device`, raises AssertionError on a mismatch and returns
a one-line summary of what it compared.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_nvfp4 import _extension, reference
from jax_nvfp4.format import FIELDS, NVFP4Array


@dataclasses.dataclass(frozen=True)
class Check:
    """One kernel path: its name, the FFI target it needs, and the function that checks it."""

    name: str
    ffi_target: str
    run: Callable[[jax.Device], str]


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    ffi_target: str
    status: str  # "passed", "failed", "not built" (no kernel for this GPU) or "no GPU"
    detail: str

    @property
    def ok(self) -> bool:
        return self.status != "failed"


CHECKS: list[Check] = []


def register_check(name: str, ffi_target: str, run: Callable[[jax.Device], str]) -> None:
    """Adds a kernel check (see the module docstring) to every later selftest()."""
    CHECKS.append(Check(name, ffi_target, run))


def _cpu():
    return jax.devices("cpu")[0]


def _on(device, tree):
    return jax.device_put(tree, device)


def _random_problem(shape, dtype, seed):
    """Gaussian data with the cases that tell encoders apart: exact E2M1 ties (under a block
    amax of 6 and S_enc = 1), signed zeros, an all-zero block and a NaN block."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(rng.uniform(0.01, 100))
    flat = x.reshape(-1, shape[-1])
    if flat.shape[1] >= 32:
        flat[0, :16] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0,
                        -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, -6.0]
        flat[0, 16:32] = [-0.0, -1e-3, 6.0] + [0.0] * 13
    if flat.shape[0] >= 3:
        flat[1, :16] = 0.0
        flat[2, 5] = np.nan
    return x.astype(dtype)


_QUANTIZE_PROBLEMS = [((1, 16), jnp.bfloat16), ((3, 48), jnp.float32), ((129, 80), jnp.bfloat16),
                      ((2, 130, 208), jnp.float16), ((257, 64), jnp.float32)]


def _same_bits(a, b) -> bool:
    a, b = np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b))
    if a.dtype == jnp.float4_e2m1fn:  # 4-bit values: compare as float (sign of zero included)
        a, b = a.astype(np.float32), b.astype(np.float32)
        return np.array_equal(a, b) and np.array_equal(np.signbit(a), np.signbit(b))
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def check_quantize(device) -> str:
    """jax_nvfp4.quantize on `device` == the reference on the CPU, byte for byte."""
    from jax_nvfp4.quantization import quantize

    ref = jax.jit(reference.quantize)
    for i, (shape, dtype) in enumerate(_QUANTIZE_PROBLEMS):
        x = _random_problem(shape, dtype, seed=i)
        for s_enc in (None, np.float32(1.0)):
            got = quantize(_on(device, x), s_enc=s_enc)
            want = ref(*_on(_cpu(), (x,) if s_enc is None else (x, s_enc)))
            for field, g, w in zip(FIELDS,
                                   (got.codes, got.scales, got.s_dec), want):
                assert _same_bits(g, w), (
                    f"quantize {shape} {jnp.dtype(dtype).name} s_enc={s_enc}: {field} differ")
    return f"{2 * len(_QUANTIZE_PROBLEMS)} problems, bytes equal"


def check_dequantize(device) -> str:
    """jax_nvfp4.dequantize on `device` == the reference on the CPU (NaN blocks included)."""
    from jax_nvfp4.quantization import dequantize

    for i, (shape, _) in enumerate(_QUANTIZE_PROBLEMS):
        x = _random_problem(shape, np.float32, seed=100 + i)
        codes, scales, s_dec = jax.jit(reference.quantize)(_on(_cpu(), x))
        for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
            got = dequantize(NVFP4Array(*_on(device, (codes, scales, s_dec))), dtype)
            want = jax.jit(functools.partial(reference.dequantize, dtype=dtype))(
                codes, scales, s_dec)
            got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
            assert np.array_equal(got, want, equal_nan=True), (
                f"dequantize {shape} -> {jnp.dtype(dtype).name}: values differ")
    return f"{3 * len(_QUANTIZE_PROBLEMS)} problems, values equal"


register_check("quantize", "jax_nvfp4_quantize", check_quantize)
register_check("dequantize", "jax_nvfp4_dequantize", check_dequantize)


# (M, N, K): decode-, fused- and prefill-sized M on Hopper, N and K off the tile sizes.
_MATMUL_PROBLEMS = [(1, 48, 64), (5, 130, 208), (70, 64, 96), (300, 40, 160), (600, 24, 80)]


def _matmul_operands(m, n, k, seed):
    from jax_nvfp4.quantization import quantize

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = quantize(_on(_cpu(), (rng.standard_normal((n, k)) * 0.05).astype(np.float32)))
    bias = rng.standard_normal(n).astype(np.float32)
    return x, w, bias


def _matmul_error(device, a, w, bias, activation=None) -> float:
    """Relative Frobenius error of matmul(a, w, bias, activation) on `device` (float32 out)
    against the reference on the CPU. Blackwell runs W4A16 on quantize(x)
    (docs/gemm_blackwell.md), so there the reference takes quantize(x) too."""
    from jax_nvfp4.gemm import matmul
    from jax_nvfp4.quantization import quantize

    got = matmul(_on(device, a), _on(device, w), bias=_on(device, bias), activation=activation,
                 out_dtype=jnp.float32)
    ref_a = _on(_cpu(), a)
    if _extension.device_arch(device) == "sm_100a" and not isinstance(a, NVFP4Array):
        ref_a = quantize(ref_a)
    want = matmul(ref_a, w, bias=_on(_cpu(), bias), activation=activation, out_dtype=jnp.float32)
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def check_matmul(device) -> str:
    """jax_nvfp4.matmul on `device` (W4A16 bf16, W4A4, bias, float32 out) against the reference
    on the CPU: relative Frobenius error <= 1e-5 (only the accumulation order differs)."""
    from jax_nvfp4.quantization import quantize

    worst = 0.0
    for i, (m, n, k) in enumerate(_MATMUL_PROBLEMS):
        x, w, bias = _matmul_operands(m, n, k, seed=200 + i)
        for a in (x.astype(jnp.bfloat16), quantize(_on(_cpu(), x))):
            err = _matmul_error(device, a, w, bias)
            kind = "W4A4" if isinstance(a, NVFP4Array) else "W4A16"
            assert np.isfinite(err) and err <= 1e-5, (
                f"matmul {kind} M={m} N={n} K={k}: relative error {err:.3g}")
            worst = max(worst, err)
    return f"{2 * len(_MATMUL_PROBLEMS)} problems, worst relative error {worst:.1e}"


def check_matmul_activation(device) -> str:
    """matmul's epilogue activations on `device` (silu, and the gated swiglu over interleaved
    rows; W4A16 bf16, bias, float32 out) against the reference on the CPU, as check_matmul."""
    worst = 0.0
    for i, (m, n, k) in enumerate(_MATMUL_PROBLEMS):
        x, w, bias = _matmul_operands(m, n, k, seed=400 + i)
        for activation in ("silu", "swiglu"):
            err = _matmul_error(device, x.astype(jnp.bfloat16), w, bias, activation)
            assert np.isfinite(err) and err <= 1e-5, (
                f"matmul activation={activation} M={m} N={n} K={k}: relative error {err:.3g}")
            worst = max(worst, err)
    return f"{2 * len(_MATMUL_PROBLEMS)} problems, worst relative error {worst:.1e}"


def check_matmul_nvfp4_out(device) -> str:
    """matmul with NVFP4 output on `device` == the reference quantization of the same device's
    float32 result, byte for byte."""
    from jax_nvfp4.gemm import matmul

    for i, (m, n, k) in enumerate(_MATMUL_PROBLEMS):
        n = n // 16 * 16 or 16
        x, w, _ = _matmul_operands(m, n, k, seed=300 + i)
        a, wd = _on(device, x.astype(jnp.bfloat16)), _on(device, w)
        y = np.asarray(matmul(a, wd, out_dtype=jnp.float32))
        q = matmul(a, wd, out_s_enc=np.float32(500.0))
        want = jax.jit(reference.quantize)(*_on(_cpu(), (y, np.float32(500.0))))
        for field, g, ref in zip(FIELDS, (q.codes, q.scales, q.s_dec), want):
            assert _same_bits(g, ref), f"matmul NVFP4 output M={m} N={n} K={k}: {field} differ"
    return f"{len(_MATMUL_PROBLEMS)} problems, bytes equal"


def check_matmul_stacked(device) -> str:
    """vmap of matmul over 3 stacked weights on `device` (one stacked FFI call; W4A16 with x
    stacked and with x shared, W4A4, stacked bias, float32 out) against the same device's matmul
    of each element alone (checked against the reference by check_matmul): relative Frobenius
    error <= 1e-6. The kernels give 0: sm_90a runs the decode-path stacks in one launch, but
    these K are too short to split, so each element sums as its unstacked call does; the
    reference, batched by vmap, may sum in another order."""
    from jax_nvfp4.gemm import matmul
    from jax_nvfp4.quantization import quantize

    def one(a, w, b):
        return matmul(a, w, bias=b, out_dtype=jnp.float32)

    def element(tree, e):
        return jax.tree.map(lambda leaf: leaf[e], tree)

    worst = 0.0
    for i, (m, n, k) in enumerate(_MATMUL_PROBLEMS):
        parts = [_matmul_operands(m, n, k, seed=500 + 10 * i + e) for e in range(3)]
        xs, ws, bs = (jax.tree.map(lambda *leaves: jnp.stack(leaves), *group)
                      for group in zip(*parts))
        xs = xs.astype(jnp.bfloat16)
        cases = {"x stacked": (xs, 0), "x shared": (xs[0], None),
                 "W4A4": (jax.vmap(quantize)(xs), 0)}
        for kind, (a, axis) in cases.items():
            stacked = jax.jit(jax.vmap(one, in_axes=(axis, 0, 0)))
            got = np.asarray(stacked(*_on(device, (a, ws, bs))))
            for e in range(3):
                a_e = a if axis is None else element(a, e)
                want = np.asarray(jax.jit(one)(*_on(device, (a_e, element(ws, e), bs[e]))))
                err = float(np.linalg.norm(got[e] - want) / np.linalg.norm(want))
                assert np.isfinite(err) and err <= 1e-6, (
                    f"stacked matmul ({kind}) M={m} N={n} K={k}: element {e} is {err:.3g} off "
                    f"its unstacked call")
                worst = max(worst, err)
    return (f"{3 * len(_MATMUL_PROBLEMS)} stacks of 3, worst relative error {worst:.1e} against "
            f"unstacked calls")


register_check("matmul", "jax_nvfp4_gemm", check_matmul)
register_check("matmul stacked", "jax_nvfp4_gemm_stacked", check_matmul_stacked)
register_check("matmul->nvfp4", "jax_nvfp4_gemm_nvfp4_out", check_matmul_nvfp4_out)
register_check("matmul+activation", "jax_nvfp4_gemm", check_matmul_activation)


# (M, G, N, K, group sizes): empty groups, rows of no group, a negative size; N and K off the
# tile sizes. On sm_90a the decode kernel (few rows a group) and fused_ws; on sm_100a the grouped
# GEMM where K % 32 == 0 and N % 4 == 0 (all but the last), XLA's path on the last.
_RAGGED_PROBLEMS = [(1, 4, 48, 64, [0, 0, 1, 0]), (40, 3, 40, 96, [13, 0, 20]),
                    (300, 5, 72, 160, [100, -3, 0, 130, 60]), (90, 2, 34, 48, [45, 45])]


def check_ragged_matmul(device) -> str:
    """jax_nvfp4.ragged_matmul on `device` (W4A16 bf16 and W4A4, bias per group, silu, float32
    out) against the reference on the CPU: relative Frobenius error <= 1e-5. Blackwell runs W4A16
    on quantize(x), as matmul does there, so the reference takes quantize(x) too."""
    from jax_nvfp4.quantization import quantize
    from jax_nvfp4.ragged_gemm import ragged_matmul

    worst = 0.0
    for i, (m, g, n, k, sizes) in enumerate(_RAGGED_PROBLEMS):
        rng = np.random.default_rng(600 + i)
        x = rng.standard_normal((m, k)).astype(np.float32).astype(jnp.bfloat16)
        w = jax.vmap(quantize)(_on(_cpu(), (rng.standard_normal((g, n, k)) * 0.05).astype(np.float32)))
        bias = rng.standard_normal((g, n)).astype(np.float32)
        sizes = np.asarray(sizes, np.int32)
        for a in (x, quantize(_on(_cpu(), x))):
            got = ragged_matmul(*_on(device, (a, w, sizes)), bias=_on(device, bias),
                                activation="silu", out_dtype=jnp.float32)
            ref_a = _on(_cpu(), a)
            if _extension.device_arch(device) == "sm_100a" and not isinstance(a, NVFP4Array):
                ref_a = quantize(ref_a)
            want = ragged_matmul(ref_a, w, _on(_cpu(), sizes), bias=_on(_cpu(), bias),
                                 activation="silu", out_dtype=jnp.float32)
            got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            kind = "W4A4" if isinstance(a, NVFP4Array) else "W4A16"
            assert np.isfinite(err) and err <= 1e-5, (
                f"ragged_matmul {kind} M={m} G={g} N={n} K={k}: relative error {err:.3g}")
            worst = max(worst, err)
    return f"{2 * len(_RAGGED_PROBLEMS)} problems, worst relative error {worst:.1e}"


register_check("ragged_matmul", "jax_nvfp4_gemm_ragged", check_ragged_matmul)


# (N, H, W, C, K, R, S, stride, dilation, padding): taps, padding, stride and dilation cases,
# C and K off the tile sizes, several images in one tile, and two 1x1 convs of 256 channels: one
# that sm_90a runs as the NVFP4 GEMM (primitives/conv.py, pointwise_as_gemm), one with stride 2
# that its conv kernels load with strided TMA copies.
_CONV_PROBLEMS = [(2, 9, 11, 32, 24, 3, 3, 1, 1, "SAME"), (3, 12, 10, 48, 72, 5, 5, 2, 1, "SAME"),
                  (1, 14, 16, 16, 40, 3, 7, 1, 2, "VALID"), (4, 7, 7, 64, 136, 1, 1, 1, 1, "SAME"),
                  (2, 28, 29, 256, 40, 1, 1, 1, 1, "VALID"), (2, 55, 57, 256, 24, 1, 1, 2, 1, "VALID")]


def check_conv(device) -> str:
    """jax_nvfp4.conv on `device` (bf16 activations, bias, float32 out) against the reference on
    the CPU: relative Frobenius error <= 1e-5 (the products are exact; only the order of the
    float32 sums differs)."""
    from jax_nvfp4.convolution import conv, quantize_conv_weight

    worst = 0.0
    for i, (n, h, w, c, k, r, s, stride, dil, pad) in enumerate(_CONV_PROBLEMS):
        rng = np.random.default_rng(400 + i)
        x = rng.standard_normal((n, h, w, c)).astype(np.float32).astype(jnp.bfloat16)
        wq = quantize_conv_weight(_on(_cpu(), rng.standard_normal((r, s, c, k)).astype(np.float32)))
        bias = rng.standard_normal(k).astype(np.float32)
        kw = dict(window_strides=(stride, stride), padding=pad, rhs_dilation=(dil, dil),
                  out_dtype=jnp.float32)
        got = conv(_on(device, x), _on(device, wq), bias=_on(device, bias), **kw)
        want = conv(_on(_cpu(), x), wq, bias=_on(_cpu(), bias), **kw)
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert np.isfinite(err) and err <= 1e-5, (
            f"conv x{(n, h, w, c)} w{(r, s, c, k)} stride {stride} dilation {dil} {pad}: "
            f"relative error {err:.3g}")
        worst = max(worst, err)
    return f"{len(_CONV_PROBLEMS)} problems, worst relative error {worst:.1e}"


register_check("conv", "jax_nvfp4_conv", check_conv)


def _gpu():
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return None
    return devices[0] if devices else None


def selftest(verbose: bool = True) -> list[CheckResult]:
    """Runs every registered kernel check on the first CUDA GPU and prints a report.

    Returns one CheckResult per check. Without a GPU, or for a check whose kernel was not built
    for this GPU, the result says so ("no GPU", "not built"): only the pure-JAX reference path
    exists there, and it is the oracle itself."""
    gpu = _gpu()
    results = []
    for check in CHECKS:
        if gpu is None:
            result = CheckResult(check.name, check.ffi_target, "no GPU",
                                 "no CUDA GPU: only the pure-JAX reference path exists")
        elif not _extension.kernel_available(check.ffi_target):
            result = CheckResult(check.name, check.ffi_target, "not built",
                                 f"no kernel for {gpu.device_kind}: the XLA reference runs")
        else:
            try:
                result = CheckResult(check.name, check.ffi_target, "passed", check.run(gpu))
            except AssertionError as e:
                result = CheckResult(check.name, check.ffi_target, "failed", str(e))
            except Exception as e:  # a kernel that errors out: report it, then the other checks
                result = CheckResult(check.name, check.ffi_target, "failed",
                                     f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        results.append(result)
    if verbose:
        where = (f"{gpu.device_kind} ({_extension.device_arch(gpu) or 'no compiled arch'})"
                 if gpu is not None else "CPU")
        print(f"jax_nvfp4 selftest on {where}; built for: "
              f"{', '.join(_extension.cuda_archs()) or 'no GPU arch'}")
        for r in results:
            print(f"  {r.name:<18} {r.ffi_target:<28} {r.status:<10} {r.detail}")
    return results
