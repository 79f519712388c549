"""jax_nvfp4.matmul on a CUDA GPU (skips without one) against the float64 NumPy oracle.

Each case runs through every sm_90a kernel family where they exist: JAX_NVFP4_GEMM_SM90_PATH
forces the decode, fused, fused_ws (on 128- or 256-row tiles: fused_ws_wide) or prefill path, the last
with cuBLASLt's GEMM where the build has it and with CUTLASS's (prefill_cutlass); the variable is read when the call is lowered, so the cache is cleared. Before each call the
allocator is handed a NaN-filled buffer of the output's size and gets it back, so an output
element the kernel fails to write shows up as NaN or garbage instead of a lucky zero."""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_nvfp4 as jn
from jax_nvfp4 import _extension
from jax_nvfp4.format import output_columns
from jax_nvfp4.primitives._base import empty_f32, ffi_kernel_call
from jax_nvfp4.primitives.matmul import (GEMM_NVFP4_OUT_STACKED_TARGET, GEMM_NVFP4_OUT_TARGET,
                                         GEMM_STACKED_TARGET, GEMM_TARGET, PATH_ENV)

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("matmul_cases", HERE / "matmul_cases.py")
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)

PATHS = ["auto", "decode", "fused", "fused_ws", "fused_ws_wide", "prefill", "prefill_cutlass"]


@pytest.fixture
def kernels(gpu_kernels):
    return gpu_kernels(GEMM_TARGET, GEMM_NVFP4_OUT_TARGET)


def forced_path(path):
    return mc.lowering_env(PATH_ENV, None if path == "auto" else path)


def w4a16_oracle(device, x, w, bias=None, activation=None):
    """The float64 oracle of a W4A16 call on `device`. Blackwell's kernel quantizes the activations
    first (NVFP4 x NVFP4 MMA, DESIGN.md §4), so there the oracle takes quantize(x); the quantizer
    gives the same bytes on every path, so the CPU reference stands in for the kernel's."""
    if _extension.device_arch(device) == "sm_100a":
        cpu = jax.devices("cpu")[0]
        x = jax.jit(jn.quantize)(jax.device_put(x, cpu))
    return mc.oracle(x, w, bias, activation)


def poison(nbytes):
    jnp.full((max(nbytes // 4, 1),), jnp.nan, jnp.float32).block_until_ready().delete()


def run(path, x, w, **kw):
    m = int(np.prod(x.shape[:-1]))
    poison(m * output_columns(w.shape[0], kw.get("activation") or "none") * 4)
    with forced_path(path):
        y = jn.matmul(x, w, **kw)
        jax.block_until_ready(y)
    return y


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m", [1, 3, 8, 12, 17, 32, 255, 300])
@pytest.mark.parametrize("n,k", [(200, 272), (64, 4096), (1000, 1040)])
def test_w4a16_bf16(kernels, path, m, n, k):
    x = mc.random_float((m, k), jnp.bfloat16, seed=m * 7 + k)
    w = mc.random_weight(n, k, seed=n)
    want = w4a16_oracle(kernels, x, w)
    mc.assert_close(run(path, x, w, out_dtype=jnp.float32), want, 1e-5)
    mc.assert_close(run(path, x, w, out_dtype=jnp.bfloat16), want, 1e-2)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.float16])
@pytest.mark.parametrize("m", [2, 20, 130])
@pytest.mark.parametrize("k", [336, 2048])
def test_w4a16_f32_and_f16_x(kernels, path, x_dtype, m, k):
    """f16 and f32 x, which the fused kernels stage as a bf16 hi and lo row each (two staged rows
    per x row, summed in the epilogue); with K = 2048 they split K over a cluster, plain and gated
    (the element-wise stores after the split's sum)."""
    n = 136
    x = mc.random_float((m, k), x_dtype, seed=m)
    w = mc.random_weight(n, k, seed=3)
    want = w4a16_oracle(kernels, x, w)
    mc.assert_close(run(path, x, w, out_dtype=jnp.float32), want, 1e-5)
    mc.assert_close(run(path, x, w, out_dtype=jnp.float16), want, 2e-3)
    if k == 2048:
        y = run(path, x, w, activation="swiglu", out_dtype=jnp.float32)
        mc.assert_close(y, mc.activation_f64(want, "swiglu"), 1e-5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m", [1, 16, 129])
@pytest.mark.parametrize("k", [528, 544])
def test_w4a4(kernels, path, m, k):
    """K % 32 == 16 (8-byte code rows) and 0 (16-byte), each with a last chunk of K in part: the
    fused paths' staging reads x 32 elements a thread, a half or all of them past K."""
    n = 264
    xq = jn.quantize(mc.random_float((m, k), jnp.float32, seed=m))
    w = mc.random_weight(n, k, seed=4)
    mc.assert_close(run(path, xq, w, out_dtype=jnp.float32), mc.oracle(xq, w), 1e-5)


@pytest.mark.parametrize("m", [1, 3, 4, 5])
def test_w4a4_decode_stages_x_on_large_weights(kernels, m):
    """W4A4 at M <= 4 on more than 32M weights: the decode path dequantizes x to bf16 in the
    workspace first, then runs its bf16-x kernel with x's s_dec in alpha (M = 5 keeps the NVFP4-x
    kernel). N and K tails (K % 32 == 16: 8-byte code loads), a bias, a gated activation."""
    n, k = 8200, 4112
    xq = jn.quantize(mc.random_float((m, k), jnp.float32, seed=m, scale=3.0))
    w = mc.random_weight(n, k, seed=9)
    bias = mc.random_float((n,), jnp.float32, 10)
    mc.assert_close(run("auto", xq, w, bias=bias, out_dtype=jnp.float32), mc.oracle(xq, w, bias), 1e-5)
    y = run("auto", xq, w, activation="swiglu", out_dtype=jnp.float32)
    mc.assert_close(y, mc.activation_f64(mc.oracle(xq, w), "swiglu"), 1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_bias_and_batched_x(kernels, path):
    x = mc.random_float((3, 7, 256), jnp.bfloat16, 5)
    w = mc.random_weight(100, 256, 6)
    bias = mc.random_float((100,), jnp.bfloat16, 7)
    y = run(path, x, w, bias=bias, out_dtype=jnp.float32)
    assert y.shape == (3, 7, 100)
    mc.assert_close(y.reshape(21, 100), w4a16_oracle(kernels, x.reshape(21, 256), w, bias), 1e-5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m", [4, 200])
def test_nvfp4_output(kernels, path, m):
    n, k = 96, 320
    x = mc.random_float((m, k), jnp.bfloat16, 8)
    w = mc.random_weight(n, k, 9)
    y = run(path, x, w, out_dtype=jnp.float32)
    q = run(path, x, w, out_s_enc=np.float32(900.0))
    codes, scales, s_dec = mc.quantize_reference_bytes(np.asarray(y), 900.0)
    got = np.asarray(jax.lax.bitcast_convert_type(q.codes, jnp.uint4)).astype(np.uint8)
    np.testing.assert_array_equal(got, codes)
    np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint8), scales)
    np.testing.assert_array_equal(np.asarray(q.s_dec), s_dec)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("activation", ["relu", "gelu", "silu", "swiglu", "geglu"])
def test_activation_epilogue(kernels, path, activation):
    """act(alpha * acc + bias) in every path's epilogue (the prefill path's separate pass), for
    float outputs against float64, and an NVFP4 output equal to the quantization of the same
    path's float32 result."""
    # Output columns a multiple of 16 (NVFP4 output), N of no tile.
    n, k = (224 if activation in ("swiglu", "geglu") else 208), 272
    w = mc.random_weight(n, k, 10)
    bias = mc.random_float((n,), jnp.float32, 11, 0.5)
    for m in (3, 200):
        x = mc.random_float((m, k), jnp.bfloat16, 12 + m)
        want = mc.activation_f64(w4a16_oracle(kernels, x, w, bias), activation)
        y = run(path, x, w, bias=bias, activation=activation, out_dtype=jnp.float32)
        mc.assert_close(y, want, 1e-5)
        mc.assert_close(run(path, x, w, bias=bias, activation=activation), want, 1e-2)
    q = run(path, x, w, bias=bias, activation=activation, out_s_enc=np.float32(900.0))
    codes, scales, s_dec = mc.quantize_reference_bytes(np.asarray(y), 900.0)
    np.testing.assert_array_equal(
        np.asarray(jax.lax.bitcast_convert_type(q.codes, jnp.uint4)).astype(np.uint8), codes)
    np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint8), scales)


@pytest.mark.parametrize("path", PATHS)
def test_gated_activation_tails_and_w4a4(kernels, path):
    """swiglu over N = 114 weight rows (57 output columns: the last 16-row tile of pairs is
    partial) at M = 1, 16 and 33 (the decode kernel's three tile heights), W4A16 and W4A4."""
    n, k = 114, 272
    w = mc.random_weight(n, k, 30)
    bias = mc.random_float((n,), jnp.float32, 31, 0.5)
    for m in (1, 16, 33):
        x = mc.random_float((m, k), jnp.bfloat16, 32 + m)
        y = run(path, x, w, bias=bias, activation="swiglu", out_dtype=jnp.float32)
        assert y.shape == (m, n // 2)
        want = mc.activation_f64(w4a16_oracle(kernels, x, w, bias), "swiglu")
        mc.assert_close(y, want, 1e-5)
        xq = jn.quantize(x)
        y = run(path, xq, w, bias=bias, activation="swiglu", out_dtype=jnp.float32)
        mc.assert_close(y, mc.oracle(xq, w, bias, "swiglu"), 1e-5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float16])
def test_gated_two_byte_outputs(kernels, path, out_dtype):
    """geglu to 2-byte outputs with N / 2 = 80 columns (a multiple of 8, so fused_ws pairs into
    its shared-memory tile and stores 16-byte rows; 80 is no multiple of a warpgroup's 32) at
    M = 150 (a partial second tile of 128 rows), with a bf16 bias."""
    n, k, m = 160, 256, 150
    w = mc.random_weight(n, k, 40)
    bias = mc.random_float((n,), jnp.bfloat16, 41, 0.5)
    x = mc.random_float((m, k), jnp.bfloat16, 42)
    y = run(path, x, w, bias=bias, activation="geglu", out_dtype=out_dtype)
    assert y.dtype == out_dtype and y.shape == (m, n // 2)
    mc.assert_close(y, mc.activation_f64(w4a16_oracle(kernels, x, w, bias), "geglu"), 1e-2)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("out_dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 1e-2), (jnp.float16, 2e-3)])
@pytest.mark.parametrize("k", [256, 2048])
def test_output_row_widths(kernels, path, out_dtype, tol, k):
    """Every output dtype, plain and gated, with output rows of whole 16-byte pieces (the fused
    kernels' shared-memory tile) and without (N = 196 and 200 gated give 2-byte rows of 4 pieces
    and a half: element-wise stores), W4A16 and W4A4, at M = 150 (a partial tile of rows); with
    K = 2048 the fused kernels split K over 2-4 ranks, which share the tile's rows."""
    m = 150
    x = mc.random_float((m, k), jnp.bfloat16, 50)
    xq = jn.quantize(x)
    for n, activation in ((200, "silu"), (196, None), (208, "swiglu"), (200, "swiglu")):
        w = mc.random_weight(n, k, 51 + n)
        bias = mc.random_float((n,), jnp.float32, 52 + n, 0.5)
        want = mc.activation_f64(w4a16_oracle(kernels, x, w, bias), activation)
        mc.assert_close(run(path, x, w, bias=bias, activation=activation, out_dtype=out_dtype), want, tol)
        mc.assert_close(run(path, xq, w, bias=bias, activation=activation, out_dtype=out_dtype),
                        mc.oracle(xq, w, bias, activation), tol)


@pytest.mark.parametrize("path", PATHS)
def test_nan_propagation(kernels, path):
    m, n, k = 40, 64, 256
    x = np.array(mc.random_float((m, k), jnp.float32, 10))
    x[3, 17] = np.nan
    wf = np.array(mc.random_float((n, k), jnp.float32, 11))
    wf[9, 200] = np.inf  # its block gets the NaN scale
    y = np.asarray(run(path, jnp.asarray(x, jnp.bfloat16), jn.quantize(jnp.asarray(wf)),
                       out_dtype=jnp.float32))
    nan = np.isnan(y)
    assert nan[3].all() and nan[:, 9].all()
    assert not np.delete(np.delete(nan, 3, axis=0), 9, axis=1).any()


@pytest.mark.parametrize("operand,bad,message", [
    ("b_scales", jnp.zeros((10,), jnp.float8_e4m3fn), r"b_scales must be the tiled e4m3 scales of b \[48, 128\]"),
    ("b_s_dec", jnp.ones((2,), jnp.float32), "b_s_dec must be a float32 scalar"),
    ("a_scales", jnp.zeros((10,), jnp.float8_e4m3fn), r"a_scales must be the tiled e4m3 scales of a \[4, 128\]"),
    ("a_s_dec", jnp.ones((), jnp.bfloat16), "a_s_dec must be a float32 scalar"),
])
def test_the_ffi_handler_names_a_malformed_operand(kernels, operand, bad, message):
    """The FFI target checks its operands itself (a caller of jax.ffi may skip the primitive's
    trace-time checks): a malformed one fails the call with its name, and launches nothing."""
    x = jn.quantize(mc.random_float((4, 128), jnp.float32, 14))
    w = mc.random_weight(48, 128, 15)
    ops = {"a": x.codes, "a_scales": x.scales, "a_s_dec": x.s_dec,
           "b_codes": w.codes, "b_scales": w.scales, "b_s_dec": w.s_dec}
    ops[operand] = bad
    call = jax.jit(lambda *o: ffi_kernel_call(
        GEMM_TARGET, [jax.ShapeDtypeStruct((4, 48), jnp.bfloat16)], *o, empty_f32(), empty_f32(),
        path=np.int64(0), activation=np.int64(0)))
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(call(*ops.values()))


def test_the_ffi_handler_sets_s_dec_of_an_nvfp4_output_without_rows(kernels):
    """The library lowers an empty call to the reference; a direct caller of the FFI target still
    gets 1 / out_s_enc (XLA passes the empty codes and scales without an address)."""
    w = mc.random_weight(48, 128, 17)
    scales = jn.quantize(jnp.zeros((0, 48), jnp.float32)).scales
    results = [jax.ShapeDtypeStruct((0, 48), jn.format.CODE_DTYPE),
               jax.ShapeDtypeStruct(scales.shape, scales.dtype), jax.ShapeDtypeStruct((), jnp.float32)]
    call = jax.jit(lambda x, s: ffi_kernel_call(
        GEMM_NVFP4_OUT_TARGET, results, x, jnp.zeros((0,), jnp.float8_e4m3fn), jnp.ones((), jnp.float32),
        w.codes, w.scales, w.s_dec, empty_f32(), s, path=np.int64(0), activation=np.int64(0)))
    for s_enc in (4.0, 8.0):
        poison(1 << 20)
        s_dec = call(jnp.zeros((0, 128), jnp.bfloat16), jnp.float32(s_enc))[2]
        assert float(s_dec) == 1 / s_enc


@pytest.mark.parametrize("lead", [(0,), (2, 0)])
def test_empty_x(kernels, lead):
    """No rows: an empty product, and an NVFP4 output still gets its s_dec (1 / out_s_enc)."""
    w = mc.random_weight(48, 128, 16)
    x = jnp.zeros(lead + (128,), jnp.bfloat16)
    assert run("auto", x, w).shape == lead + (48,)
    assert run("auto", jn.quantize(x), w).shape == lead + (48,)
    y = run("auto", x, w, out_s_enc=4.0)
    assert y.shape == lead + (48,) and float(y.s_dec) == 0.25


def test_jit_and_vmap(kernels):
    xs = mc.random_float((4, 6, 128), jnp.bfloat16, 12)
    w = mc.random_weight(48, 128, 13)
    f = jax.jit(jax.vmap(lambda a: jn.matmul(a, w, out_dtype=jnp.float32)))
    mc.assert_close(f(xs).reshape(24, 48), w4a16_oracle(kernels, xs.reshape(24, 128), w), 1e-5)


@pytest.mark.parametrize("m,n,k", [(1, 208, 272), (40, 2048, 4096), (700, 256, 4096)])
def test_vmap_over_stacked_weights(gpu_kernels, m, n, k):
    """vmap over 3 stacked weights (each its own s_dec; x stacked, x shared, W4A4, stacked bias,
    NVFP4 output, a gated activation) runs one stacked FFI call whose every element equals the
    unstacked call of that element, bit for bit, and the float64 oracle. The shapes take the
    decode, fused and prefill paths (the decode shape's K is too short to split, so the stack's
    one launch sums as each call alone does)."""
    device = gpu_kernels(GEMM_STACKED_TARGET, GEMM_NVFP4_OUT_STACKED_TARGET)
    xs = mc.random_float((3, m, k), jnp.bfloat16, 40)
    ws = jax.vmap(jn.quantize)(mc.random_float((3, n, k), jnp.float32, 41, 0.05))
    bs = mc.random_float((3, n), jnp.float32, 42)
    element = lambda tree, e: jax.tree.map(lambda a: a[e], tree)  # noqa: E731
    cases = [(xs, 0, {}), (xs[0], None, {}), (jax.vmap(jn.quantize)(xs), 0, {}),
             (xs, 0, {"out_s_enc": 8.0}), (xs, 0, {"activation": "swiglu"})]
    for a, axis, kw in cases:
        one = lambda a_, w_, b_: jn.matmul(a_, w_, bias=b_, **kw)  # noqa: E731
        poison(3 * m * n * 4)
        got = jax.jit(jax.vmap(one, in_axes=(axis, 0, 0)))(a, ws, bs)
        for e in range(3):
            a_e = a if axis is None else element(a, e)
            want = jax.jit(one)(a_e, element(ws, e), bs[e])
            for g, w_ in zip(jax.tree.leaves(element(got, e)), jax.tree.leaves(want)):
                assert np.asarray(g).tobytes() == np.asarray(w_).tobytes(), (axis, kw, e)
            if not kw and not isinstance(a, jn.NVFP4Array):
                mc.assert_close(got[e], w4a16_oracle(device, a_e, element(ws, e), bs[e]), 1e-2)
    text = jax.jit(jax.vmap(jn.matmul)).lower(xs, ws).compile().as_text()
    assert "jax_nvfp4_gemm_stacked" in text and "while" not in text  # no loop copying slices


@pytest.mark.parametrize("activation, n, out_dtype", [
    ("relu", 99, jnp.bfloat16), ("gelu", 99, jnp.float32), ("swiglu", 98, jnp.bfloat16),
    ("geglu", 98, jnp.float16)])
def test_stacked_prefill_activation_on_unaligned_elements(gpu_kernels, activation, n, out_dtype):
    """A stack the decode kernel cannot run at once (M = 17) takes small weights' prefill path
    element by element, with the activation as a separate pass over each element's output. With
    M * columns * bytes not a multiple of 16 (8 for the gated outputs), element 1's output starts
    off the boundary the pass's vector loads and stores need: it must run element-wise there.
    Every element equals its unstacked call, bit for bit, and the float64 oracle."""
    device = gpu_kernels(GEMM_STACKED_TARGET)
    m, k = 17, 512
    xs = mc.random_float((3, m, k), jnp.bfloat16, 43)
    ws = jax.vmap(jn.quantize)(mc.random_float((3, n, k), jnp.float32, 44, 0.05))
    one = lambda a, w: jn.matmul(a, w, activation=activation, out_dtype=out_dtype)  # noqa: E731
    poison(3 * m * n * 4)
    got = jax.jit(jax.vmap(one))(xs, ws)
    for e in range(3):
        w_e = jax.tree.map(lambda a: a[e], ws)
        want = jax.jit(one)(xs[e], w_e)
        assert np.asarray(got[e]).tobytes() == np.asarray(want).tobytes(), e
        mc.assert_close(got[e], w4a16_oracle(device, xs[e], w_e, activation=activation),
                        1e-5 if out_dtype == jnp.float32 else 1e-2)


def _experts(e, n, k, seed):
    """e NVFP4 weights [n, k] stacked, expert i scaled by 4^(i % 7 - 3): neighbouring experts have
    their own s_dec, orders of magnitude apart, so an element that read another's weights, scales
    or s_dec would be far off."""
    mags = 4.0 ** (np.arange(e) % 7 - 3)
    w = mc.random_float((e, n, k), jnp.float32, seed, 0.05) * mags[:, None, None]
    return jax.vmap(jn.quantize)(w.astype(jnp.float32))


@pytest.mark.parametrize("m", [1, 5, 12, 20])
def test_stacked_decode_runs_the_stack_at_once(gpu_kernels, m):
    """On the decode path the sm_90a kernel runs a stack of M <= 8 in one launch (the elements'
    tiles share one wave, so K is split over fewer parts than an element alone takes; larger M
    run element by element): every element matches the float64 oracle (float32 output) and the
    unstacked call within the float32 sums' reordering, with x stacked (bf16, float32, NVFP4) or
    shared, a stacked bias, a gated activation; N and K have tails (K % 32 == 16: the 8-byte code
    loads)."""
    device = gpu_kernels(GEMM_STACKED_TARGET)
    e, n, k = 6, 2056, 4144
    ws = _experts(e, n, k, 60)
    xs = mc.random_float((e, m, k), jnp.bfloat16, 61)
    bs = mc.random_float((e, n), jnp.float32, 62)
    element = lambda tree, i: jax.tree.map(lambda a: a[i], tree)  # noqa: E731
    cases = [(xs, 0, {}), (xs.astype(jnp.float32), 0, {}), (xs[0], None, {}),
             (jax.vmap(jn.quantize)(xs), 0, {}), (xs, 0, {"activation": "swiglu"})]
    for a, axis, kw in cases:
        one = lambda a_, w_, b_: jn.matmul(a_, w_, bias=b_, out_dtype=jnp.float32, **kw)  # noqa: E731
        poison(e * m * n * 4)
        got = np.asarray(jax.jit(jax.vmap(one, in_axes=(axis, 0, 0)))(a, ws, bs))
        for i in range(e):
            a_i = a if axis is None else element(a, i)
            w_i, act = element(ws, i), kw.get("activation")
            want = (mc.oracle(a_i, w_i, bs[i], act) if isinstance(a_i, jn.NVFP4Array)
                    else w4a16_oracle(device, a_i, w_i, bs[i], act))
            mc.assert_close(got[i], want, 1e-5)
            mc.assert_close(got[i], np.asarray(jax.jit(one)(a_i, w_i, bs[i]), np.float64), 1e-5)


def test_stacked_decode_past_the_grid_runs_elements_in_turn(gpu_kernels):
    """A stack whose activation tiles overflow the grid's y dimension (65535) runs element by
    element: still right."""
    device = gpu_kernels(GEMM_STACKED_TARGET)
    e, k = 65536 + 7, 32
    ws = _experts(e, 16, k, 63)
    xs = mc.random_float((e, 1, k), jnp.bfloat16, 64)
    got = np.asarray(jax.jit(jax.vmap(lambda a, w: jn.matmul(a, w, out_dtype=jnp.float32)))(xs, ws))
    if _extension.device_arch(device) == "sm_100a":  # its kernel quantizes x (see w4a16_oracle)
        x64 = mc.nvfp4_to_f64(jax.jit(jax.vmap(jn.quantize))(jax.device_put(xs, jax.devices("cpu")[0])))
    else:
        x64 = np.asarray(xs).astype(np.float64)
    want = np.einsum("emk,enk->emn", x64, mc.nvfp4_to_f64(ws))
    mc.assert_close(got, want, 1e-5)


@pytest.mark.parametrize("path,m", [("decode", 8), ("fused", 64), ("fused_ws", 200), ("fused_ws_wide", 300)])
def test_deterministic(kernels, path, m):
    """Few output tiles (8 on the fused_ws paths) and a long K: the split-K cluster reduction
    runs, in a fixed order."""
    x = mc.random_float((m, 4096), jnp.bfloat16, 14)
    w = mc.random_weight(512, 4096, 15)
    a = np.asarray(run(path, x, w, out_dtype=jnp.float32))
    b = np.asarray(run(path, x, w, out_dtype=jnp.float32))
    np.testing.assert_array_equal(a, b)
    mc.assert_close(a, w4a16_oracle(kernels, x, w), 1e-5)


@pytest.mark.parametrize("path,m", [("fused_ws", 1100), ("fused_ws_wide", 2100)])
@pytest.mark.parametrize("n,out_dtype", [(2200, jnp.bfloat16), (2204, jnp.bfloat16), (2200, jnp.float32)])
@pytest.mark.parametrize("k", [384, 2048])
def test_fused_ws_persistent_tiles(kernels, path, m, n, out_dtype, k):
    """More output tiles (9 x 18 of 128 or 256 staged rows, the last partial) than SMs, and a last
    raster group of 2 weight tiles: CTAs run several tiles and their stage ring wraps across tiles
    (on the wide tiles, through the stage each tile's epilogue borrows). N % 8 == 4 takes the
    element-wise store instead of the staged 16-byte one. With K = 2048 (16 chunks) the tiles past
    the whole waves (30 of 162 on 132 SMs) take a launch of their own, split over clusters."""
    x = mc.random_float((m, k), jnp.bfloat16, 16)
    w = mc.random_weight(n, k, 17)
    bias = mc.random_float((n,), jnp.float32, 18)
    tol = 1e-5 if out_dtype == jnp.float32 else 1e-2
    mc.assert_close(run(path, x, w, bias=bias, out_dtype=out_dtype), w4a16_oracle(kernels, x, w, bias), tol)


@pytest.mark.parametrize("n,out_dtype,bias_dtype,cublaslt", [
    (1000, jnp.bfloat16, None, True),
    (1000, jnp.bfloat16, jnp.bfloat16, True),
    (1000, jnp.float16, jnp.float16, False),   # cuBLASLt has no bf16 x bf16 -> f16 GEMM
    (1000, jnp.float32, jnp.bfloat16, True),   # the workspace's float32 bias
    (1000, jnp.bfloat16, jnp.float32, False),  # cuBLASLt would read the bias as bf16
    (1001, jnp.bfloat16, None, False),         # output rows not 16-byte aligned
    (1002, jnp.float32, None, False),
])
def test_prefill_gemm_backend(kernels, n, out_dtype, bias_dtype, cublaslt):
    """The prefill path runs cuBLASLt's GEMM where the build has its header, unless the output
    is f16, its rows are not 16-byte aligned or the bias is of another type than a bf16 output;
    prefill_cutlass never does. Both match the oracle (M, N, K not multiples of the tiles)."""
    if _extension.device_arch(kernels) != "sm_90a":
        pytest.skip("the prefill path is sm_90a's")
    if _extension.cublaslt_gemm_calls() is None:
        pytest.skip("built without cuBLASLt's header: the prefill GEMM is CUTLASS's only")
    m, k = 300, 1040
    x = mc.random_float((m, k), jnp.bfloat16, 19)
    w = mc.random_weight(n, k, 20)
    bias = None if bias_dtype is None else mc.random_float((n,), bias_dtype, 21)
    want = w4a16_oracle(kernels, x, w, bias)
    tol = 1e-5 if out_dtype == jnp.float32 else 1e-2 if out_dtype == jnp.bfloat16 else 2e-3
    for path, expect in (("prefill", int(cublaslt)), ("prefill_cutlass", 0)):
        before = _extension.cublaslt_gemm_calls()
        y = run(path, x, w, bias=bias, out_dtype=out_dtype)
        assert _extension.cublaslt_gemm_calls() - before == expect, path
        mc.assert_close(y, want, tol)


MEMCHECK_SCRIPT = textwrap.dedent("""
    import os
    import jax, jax.numpy as jnp, numpy as np
    import jax_nvfp4 as jn
    rng = np.random.default_rng(0)
    for path in ("decode", "fused", "fused_ws", "fused_ws_wide", "prefill", "prefill_cutlass"):
        os.environ["JAX_NVFP4_GEMM_SM90_PATH"] = path
        jax.clear_caches()
        for m, n, k, xd in ((3, 37, 208, jnp.bfloat16), (150, 48, 256, jnp.bfloat16), (150, 208, 2048, jnp.bfloat16),
                            (37, 70, 48, jnp.float32),
                            (130, 13, 16, jnp.float16)):  # the last x (K = 16) meets the 32 x 16 weight below
            x = jnp.asarray(rng.standard_normal((m, k)), xd)
            w = jn.quantize(jnp.asarray(rng.standard_normal((n, k)), jnp.float32))
            jn.matmul(x, w, bias=jnp.ones((n,)), out_dtype=jnp.bfloat16).block_until_ready()
            jn.matmul(x, w, bias=jnp.ones((n,), jnp.bfloat16), out_dtype=jnp.bfloat16).block_until_ready()
            jn.matmul(jn.quantize(x.astype(jnp.float32)), w, out_dtype=jnp.float32).block_until_ready()
            jn.matmul(x, w, activation="silu", out_dtype=jnp.bfloat16).block_until_ready()
            jn.matmul(x, w, activation="relu", out_dtype=jnp.float32).block_until_ready()
            if n % 2 == 0:
                jn.matmul(x, w, activation="swiglu", out_dtype=jnp.bfloat16).block_until_ready()
        jn.matmul(x, jn.quantize(jnp.ones((32, 16))), out_s_enc=1.0).codes.block_until_ready()
        jn.matmul(x, jn.quantize(jnp.ones((32, 16))), activation="gelu", out_s_enc=1.0).codes.block_until_ready()
        jn.matmul(x, jn.quantize(jnp.ones((32, 16))), activation="geglu", out_s_enc=1.0).codes.block_until_ready()
    # W4A4 on more than 32M weights at M <= 4: the decode path stages x as bf16 first.
    os.environ["JAX_NVFP4_GEMM_SM90_PATH"] = "decode"
    jax.clear_caches()
    big = jn.quantize(jnp.asarray(rng.standard_normal((8200, 4112)), jnp.float32))
    xq = jn.quantize(jnp.asarray(rng.standard_normal((3, 4112)), jnp.float32))
    jn.matmul(xq, big, out_dtype=jnp.float32).block_until_ready()
    # The ragged kernels: tails, empty groups, rows before (none here), between and after groups,
    # groups that begin and end inside fused_ws's tiles of every width.
    wg = jax.vmap(jn.quantize)(jnp.asarray(rng.standard_normal((5, 70, 208)), jnp.float32))
    bias = jnp.ones((5, 70), jnp.bfloat16)
    for path in ("decode", "fused_ws_64", "fused_ws", "fused_ws_256"):
        os.environ["JAX_NVFP4_RAGGED_PATH"] = path
        jax.clear_caches()
        for m, sizes in ((1, [0, 1, 0, 0, 0]), (13, [3, 0, 4, 1, 2]), (21, [-2, 9, 0, 30, 1]),
                         (300, [0, 130, 7, 120, 40]), (600, [1, 255, 257, 0, 87])):
            for x in (jnp.asarray(rng.standard_normal((m, 208)), jnp.bfloat16),
                      jnp.asarray(rng.standard_normal((m, 208)), jnp.float32),
                      jn.quantize(jnp.asarray(rng.standard_normal((m, 208)), jnp.float32))):
                jn.ragged_matmul(x, wg, jnp.asarray(sizes), bias=bias).block_until_ready()
                jn.ragged_matmul(x, wg, jnp.asarray(sizes), activation="swiglu").block_until_ready()
    print("memcheck-done")
""")


def test_compute_sanitizer_memcheck_tail_shapes(kernels, tmp_path):
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        pytest.skip("compute-sanitizer not installed")
    script = tmp_path / "memcheck_matmul.py"
    script.write_text(MEMCHECK_SCRIPT)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable,
                           str(script)], capture_output=True, text=True, env=env, timeout=420)
    report = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0 and "memcheck-done" in proc.stdout, report
    assert "ERROR SUMMARY: 0 errors" in proc.stdout + proc.stderr, report
