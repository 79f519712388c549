"""Sharded quantize / dequantize / matmul against one-device runs (jax_nvfp4.sharding).

The multi-device tests need several devices. With fewer than 2 visible (a CPU run where jax is
already initialized with one device), `test_multidevice_suite` re-runs this file in a child
process on 8 forced CPU devices (--xla_force_host_platform_device_count=8 must be set before jax
starts); with 2 or more (GPUs, or the child) the tests run here directly."""

import functools
import gzip
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_nvfp4 as nv
from jax_nvfp4.primitives.autodiff import qat_conv, qat_matmul
from jax_nvfp4.sharding import nvfp4_sharding, shard_nvfp4
from jax_nvfp4.timing import COPIES, LoopTimer, bytes_a_device

REPO = Path(__file__).resolve().parents[1]
CHILD_FLAG = "JAX_NVFP4_SHARDING_CHILD"
N_DEV = len(jax.devices())

multidevice = pytest.mark.skipif(N_DEV < 2,
                                 reason="needs >= 2 devices (see test_multidevice_suite)")


def test_multidevice_suite():
    """Runs the multi-device tests of this file on 8 forced CPU devices in a child process."""
    if N_DEV >= 2:
        pytest.skip(f"{N_DEV} devices visible: the tests run in this process")
    if os.environ.get(CHILD_FLAG):
        pytest.fail("the child process did not get several devices")
    env = dict(os.environ, JAX_PLATFORMS="cpu", **{CHILD_FLAG: "1"})
    flags = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    env["XLA_FLAGS"] = flags.strip()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-3000:]


@pytest.fixture(scope="module")
def mesh():
    """A ("x", "y") mesh over all devices: 2 x n/2 (2 x 4 on 8 devices, 1 x 2 on 2 GPUs)."""
    n = N_DEV
    shape = (2, n // 2) if n >= 4 and n % 2 == 0 else (1, n)
    return Mesh(np.array(jax.devices()[: shape[0] * shape[1]]).reshape(shape), ("x", "y"))


ALL = ("x", "y")  # both mesh axes on one dimension: every device


def put(x, mesh, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def same_bytes(a, b):
    return all(np.asarray(u).tobytes() == np.asarray(v).tobytes()
               for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def hlo(f, *args):
    return f.lower(*args).compile().as_text()


def row_scaled(key, shape):
    """Random data whose magnitude grows along the rows, so every row shard has its own amax
    (a sharded quantize that skipped the amax all-reduce would give other bytes)."""
    x = jax.random.normal(key, shape, jnp.float32)
    rows = jnp.arange(shape[-2], dtype=jnp.float32)[:, None]
    return x * (1.0 + rows / 8.0)


# ------------------------------------------------------------------------------ quantize


@multidevice
@pytest.mark.parametrize("spec", [P(ALL, None), P(None, "y"), P("x", "y"), P(None, None)],
                         ids=["rows", "k", "rows+k", "replicated"])
def test_quantize_same_bytes(mesh, spec):
    x = row_scaled(jax.random.key(0), (1024, 512))
    ref = jax.jit(nv.quantize)(x)
    f = jax.jit(nv.quantize)
    xs = put(x, mesh, spec)
    assert same_bytes(f(xs), ref)
    if any(spec):  # the amax is all-reduced, the data is not gathered
        text = hlo(f, xs)
        assert "all-reduce" in text and "all-gather" not in text


@multidevice
def test_quantize_keeps_tiles_with_codes(mesh):
    x = row_scaled(jax.random.key(1), (1024, 512))
    q = jax.jit(nv.quantize)(put(x, mesh, P(ALL, None)))
    assert q.codes.sharding.shard_shape(q.codes.shape)[0] == 1024 // mesh.size
    assert q.scales.sharding.shard_shape(q.scales.shape)[0] == 8 // mesh.size


@multidevice
def test_quantize_leading_dims_and_s_enc(mesh):
    x = row_scaled(jax.random.key(2), (4, 256, 256))
    s_enc = jnp.array([1.0, 0.5, 2.0, 448.0], jnp.float32)
    xs = put(x, mesh, P("y", None, None))
    assert same_bytes(jax.jit(nv.quantize)(xs), jax.jit(nv.quantize)(x))
    f = jax.jit(lambda a, s: nv.quantize(a, s_enc=s))
    out = f(xs, put(s_enc, mesh, P("y")))
    assert same_bytes(out, f(x, s_enc))
    assert "all-reduce" not in hlo(f, xs, s_enc)  # a given S_enc needs no amax


@multidevice
def test_quantize_unaligned_split_is_resharded(mesh):
    # 384 rows over every device is not whole 128-row tiles: the op runs replicated instead.
    x = row_scaled(jax.random.key(3), (384, 128))
    assert same_bytes(jax.jit(nv.quantize)(put(x, mesh, P(ALL, None))), jax.jit(nv.quantize)(x))


@multidevice
def test_dequantize_sharded(mesh):
    q = nv.quantize(row_scaled(jax.random.key(4), (1024, 256)))
    f = jax.jit(lambda a: nv.dequantize(a, jnp.float32))
    qs = shard_nvfp4(q, mesh, P(ALL, None))
    out = f(qs)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(f(q)))
    assert out.sharding.shard_shape(out.shape)[0] == 1024 // mesh.size
    assert "all-gather" not in hlo(f, qs)


# ------------------------------------------------------------------------------ matmul

M, N, K = 1024, 512, 512
PATTERNS = {  # name: (x spec, w codes spec)
    "data": (P(ALL, None), P(None, None)),
    "column": (P(None, None), P("y", None)),
    "row": (P(None, "y"), P(None, "y")),
    "row_x_replicated": (P(None, None), P(None, "y")),
    "data+column": (P("x", None), P("y", None)),
    "data+row": (P("x", "y"), P(None, "y")),
}


@pytest.fixture(scope="module")
def operands():
    keys = jax.random.split(jax.random.key(5), 3)
    x = jax.random.normal(keys[0], (M, K), jnp.float32)
    w = nv.quantize(jax.random.normal(keys[1], (N, K), jnp.float32))
    bias = jax.random.normal(keys[2], (N,), jnp.float32)
    return x, w, bias


def _place(mesh, x, w, bias, pattern):
    x_spec, w_spec = PATTERNS[pattern]
    xs = shard_nvfp4(x, mesh, x_spec) if isinstance(x, nv.NVFP4Array) else put(x, mesh, x_spec)
    return xs, shard_nvfp4(w, mesh, w_spec), put(bias, mesh, P(w_spec[0]))


@multidevice
@pytest.mark.parametrize("a_nvfp4", [False, True], ids=["w4a16", "w4a4"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_matmul_patterns(mesh, operands, pattern, a_nvfp4):
    x, w, bias = operands
    if a_nvfp4:
        x = nv.quantize(x)
    f = jax.jit(lambda a, b, c: nv.matmul(a, b, bias=c, out_dtype=jnp.float32))
    ref = np.asarray(f(x, w, bias))
    args = _place(mesh, x, w, bias, pattern)
    np.testing.assert_allclose(np.asarray(f(*args)), ref, rtol=1e-5, atol=1e-4)
    text = hlo(f, *args)
    assert "all-gather" not in text  # neither weights nor activations are gathered
    row_parallel = pattern.startswith("row") or pattern.endswith("row")
    assert ("all-reduce" in text) == (row_parallel and mesh.shape["y"] > 1)


@multidevice
@pytest.mark.parametrize("pattern", ["data+column", "row"])
def test_matmul_nvfp4_output_same_bytes(mesh, operands, pattern):
    x, w, bias = operands
    f = jax.jit(lambda a, b, c: nv.matmul(a, b, bias=c, out_s_enc=jnp.float32(64.0)))
    ref = f(x, w, bias)
    args = _place(mesh, x, w, bias, pattern)
    out = f(*args)
    if pattern == "row":
        # The partial sums add in another order than on one device, which can move a value
        # across an E2M1 rounding boundary; the output must be the float32 result, quantized.
        g = jax.jit(lambda a, b, c: nv.quantize(nv.matmul(a, b, bias=c, out_dtype=jnp.float32),
                                                s_enc=jnp.float32(64.0)))
        assert same_bytes(out, g(*args))
    else:
        assert same_bytes(out, ref)
    assert "all-gather" not in hlo(f, *args)


@multidevice
def test_matmul_bias_added_once_row_parallel(mesh, operands):
    x, w, _ = operands
    bias = jnp.full((N,), 1000.0, jnp.float32)
    f = jax.jit(lambda a, b, c: nv.matmul(a, b, bias=c, out_dtype=jnp.float32))
    out = f(*_place(mesh, x, w, bias, "row"))
    np.testing.assert_allclose(np.asarray(out), np.asarray(f(x, w, bias)), rtol=1e-5, atol=1e-3)


@multidevice
@pytest.mark.parametrize("out", ["float32", "nvfp4", "w4a4-float32"])
@pytest.mark.parametrize("pattern", ["row", "data+row"])
@pytest.mark.parametrize("scattered", ["rows", "columns"])
def test_row_parallel_reduce_scatters_when_asked(mesh, operands, pattern, out, scattered):
    """y's rows (sequence-parallel layers) or columns asked split over the K axes as well: the
    partial sums are reduce-scattered, never all-reduced and then sliced, and equal a one-device
    run (the bias is added once, to each shard's own columns)."""
    if mesh.shape["y"] < 2:
        pytest.skip("needs a K split")
    x, w, bias = operands
    if out == "w4a4-float32":
        x = nv.quantize(x)
    rows = PATTERNS[pattern][0][0]
    if scattered == "rows":
        y_spec = P(("y",) if rows is None else (rows, "y"), None)
    else:
        y_spec = P(rows, "y")

    def float_split(a, b, c):
        y = nv.matmul(a, b, bias=c, out_dtype=jnp.float32)
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, y_spec))

    def nvfp4_split(a, b, c):
        y = nv.matmul(a, b, bias=c, out_s_enc=jnp.float32(64.0))
        return jax.lax.with_sharding_constraint(y, nvfp4_sharding(mesh, y_spec, y.shape))

    f = jax.jit(nvfp4_split if out == "nvfp4" else float_split)
    args = _place(mesh, x, w, bias, pattern)
    got = f(*args)
    text = hlo(f, *args)
    assert "reduce-scatter" in text
    assert "all-reduce" not in text and "all-gather" not in text
    if out != "nvfp4":
        assert got.sharding.is_equivalent_to(NamedSharding(mesh, y_spec), 2)
        np.testing.assert_allclose(np.asarray(got), np.asarray(f(x, w, bias)), rtol=1e-5,
                                   atol=1e-4)
    else:  # as in test_matmul_nvfp4_output_same_bytes: the float32 sums (same order), quantized
        g = jax.jit(lambda a, b, c: nv.quantize(float_split(a, b, c), s_enc=jnp.float32(64.0)))
        assert same_bytes(got, g(*args))
        assert got.codes.sharding.is_equivalent_to(NamedSharding(mesh, y_spec), 2)


@multidevice
@pytest.mark.parametrize("pattern", ["column", "row", "data+row"])
def test_activation_applies_once_after_the_sum(mesh, operands, pattern):
    """An epilogue activation on a row-parallel matmul acts on the summed result (each shard's
    partial product stays linear); the column- and data-parallel shards apply it in place."""
    x, w, bias = operands
    x = x / 16  # pre-activations of order 1: the silu bends here
    f = jax.jit(lambda a, b, c: nv.matmul(a, b, bias=c, activation="silu", out_dtype=jnp.float32))
    got = f(*_place(mesh, x, w, bias, pattern))
    np.testing.assert_allclose(np.asarray(got), np.asarray(f(x, w, bias)), rtol=1e-5, atol=1e-5)


@multidevice
@pytest.mark.parametrize("out", ["float32", "nvfp4"])
@pytest.mark.parametrize("pattern", ["column", "data+column", "row", "data+row"])
def test_gated_activation_keeps_pairs_whole(mesh, operands, pattern, out):
    """swiglu: y's column j is w's rows 2j, 2j + 1 (interleaved). A column-parallel shard holds
    whole pairs and yields its own half-width columns without traffic; a row-parallel one pairs
    them after the sum. Equal to one device (NVFP4 y: the float32 result, quantized)."""
    x, w, bias = operands
    x = x / 16
    s_enc = jnp.float32(64.0)

    def float_y(a, b, c):
        return nv.matmul(a, b, bias=c, activation="swiglu", out_dtype=jnp.float32)

    f = jax.jit(float_y if out == "float32" else
                lambda a, b, c: nv.matmul(a, b, bias=c, activation="swiglu", out_s_enc=s_enc))
    args = _place(mesh, x, w, bias, pattern)
    got = f(*args)
    if out == "float32":
        assert got.shape == (M, N // 2)
        np.testing.assert_allclose(np.asarray(got), np.asarray(f(x, w, bias)), rtol=1e-5,
                                   atol=1e-5)
    else:
        assert same_bytes(got, jax.jit(lambda *a: nv.quantize(float_y(*a), s_enc=s_enc))(*args))
    text = hlo(f, *args)
    assert "all-gather" not in text
    column = pattern.endswith("column")
    assert ("all-reduce" in text) == (not column and mesh.shape["y"] > 1)
    if column:
        y = got if out == "float32" else got.codes
        y_spec = P(PATTERNS[pattern][0][0], "y")  # x's rows, w's rows
        assert y.sharding.is_equivalent_to(NamedSharding(mesh, y_spec), 2)


@multidevice
@pytest.mark.parametrize("scattered", ["rows", "columns"])
def test_gated_activation_after_a_reduce_scatter(mesh, operands, scattered):
    """Row-parallel swiglu with y asked split over the K axes too: the pre-activation partial sums
    are reduce-scattered in whole (gate, up) pairs and each shard pairs its own."""
    if mesh.shape["y"] < 2:
        pytest.skip("needs a K split")
    x, w, bias = operands
    y_spec = P("y", None) if scattered == "rows" else P(None, "y")

    def f(a, b, c):
        y = nv.matmul(a / 16, b, bias=c, activation="swiglu", out_dtype=jnp.float32)
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, y_spec))

    g = jax.jit(f)
    args = _place(mesh, x, w, bias, "row")
    text = hlo(g, *args)
    assert "reduce-scatter" in text and "all-reduce" not in text and "all-gather" not in text
    np.testing.assert_allclose(np.asarray(g(*args)), np.asarray(g(x, w, bias)), rtol=1e-5,
                               atol=1e-5)


def _all_reduce_dtypes(text):
    return set(re.findall(r"(\w+)\[[\d,]*\]\{[\d,]*\} (?:all-reduce|reduce-scatter)", text))


@multidevice
@pytest.mark.parametrize("scattered", [False, True], ids=["all-reduce", "reduce-scatter"])
def test_row_parallel_sums_in_bfloat16_when_asked(mesh, operands, scattered):
    """reduce_dtype=bfloat16: each shard's partial product is rounded to bfloat16 and summed in
    it (on GPUs the collective moves bfloat16; XLA:CPU widens it to float32 inside the
    collective), then the bias once; the default keeps float32."""
    if mesh.shape["y"] < 2:
        pytest.skip("needs a K split")
    x, w, bias = operands
    y_spec = P("y", None) if scattered else P()

    def f(a, b, c, reduce_dtype):
        y = nv.matmul(a, b, bias=c, out_dtype=jnp.float32, reduce_dtype=reduce_dtype)
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, y_spec))

    args = _place(mesh, x, w, bias, "row")
    ref = np.asarray(jax.jit(f, static_argnums=3)(x, w, bias, None))
    errors = {}
    for reduce_dtype in (None, jnp.bfloat16):
        g = jax.jit(f, static_argnums=3)
        got = np.asarray(g(*args, reduce_dtype))
        errors[reduce_dtype] = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        text = hlo(g, *args, reduce_dtype)
        assert ("reduce-scatter" in text) == scattered and "all-gather" not in text
        if jax.devices()[0].platform == "gpu":
            want = "bf16" if reduce_dtype else "f32"
            assert _all_reduce_dtypes(text) == {want}, _all_reduce_dtypes(text)
    assert errors[None] < 1e-6
    assert 1e-4 < errors[jnp.bfloat16] < 1e-2  # bfloat16 rounding of the partial sums (2^-9)


@multidevice
def test_conv_input_channel_sums_in_bfloat16_when_asked(mesh):
    if mesh.shape["y"] < 2:
        pytest.skip("needs a C split")
    keys = jax.random.split(jax.random.key(9), 2)
    x = jax.random.normal(keys[0], (2, 6, 7, 512), jnp.float32)
    w = nv.quantize_conv_weight(jax.random.normal(keys[1], (3, 3, 512, 128), jnp.float32))
    args = (put(x, mesh, P(None, None, None, "y")), shard_nvfp4(w, mesh, P(None, None, None, "y")))
    ref = np.asarray(jax.jit(lambda a, b: nv.conv(a, b, out_dtype=jnp.float32))(x, w))
    g = jax.jit(lambda a, b: nv.conv(a, b, out_dtype=jnp.float32, reduce_dtype=jnp.bfloat16))
    err = np.linalg.norm(np.asarray(g(*args)) - ref) / np.linalg.norm(ref)
    assert 1e-4 < err < 1e-2
    if jax.devices()[0].platform == "gpu":
        assert _all_reduce_dtypes(hlo(g, *args)) == {"bf16"}


def test_reduce_dtype_is_checked():
    x = jnp.ones((4, 64), jnp.float32)
    w = nv.quantize(jnp.ones((32, 64), jnp.float32))
    with pytest.raises(TypeError, match="matmul: reduce_dtype must be float32 or bfloat16, "
                                        "got float16"):
        nv.matmul(x, w, reduce_dtype=jnp.float16)
    wc = nv.quantize_conv_weight(jnp.ones((1, 1, 64, 32), jnp.float32))
    with pytest.raises(TypeError, match="conv: reduce_dtype must be float32 or bfloat16, got int8"):
        nv.conv(jnp.ones((1, 4, 4, 64), jnp.float32), wc, reduce_dtype=jnp.int8)


@multidevice
def test_vmap_and_jit_compose_with_sharding(mesh, operands):
    x, w, bias = operands
    xb = x.reshape(8, M // 8, K)  # batch split over "x", weight columns over "y"
    f = jax.jit(jax.vmap(lambda a, b: nv.matmul(a, b, out_dtype=jnp.float32), (0, None)))
    args = (put(xb, mesh, P("x", None, None)), shard_nvfp4(w, mesh, P("y", None)))
    np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(f(xb, w)), rtol=1e-5, atol=1e-4)
    assert "all-gather" not in hlo(f, *args)
    g = jax.jit(jax.vmap(nv.quantize))  # one S_enc per batch element, batch and K split
    assert same_bytes(g(put(xb, mesh, P("x", None, "y"))), g(xb))


@multidevice
def test_gspmd_callbacks(mesh, operands):
    """The same patterns with the GSPMD partitioner (infer/propagate/partition callbacks)."""
    x, w, bias = operands
    try:
        jax.config.update("jax_use_shardy_partitioner", False)
    except (AttributeError, KeyError, ValueError):
        pytest.skip("this jax has no GSPMD partitioner switch")
    try:
        f = jax.jit(lambda a, b, c: nv.matmul(a, b, bias=c, out_dtype=jnp.float32))
        ref = np.asarray(f(x, w, bias))
        for pattern in ("column", "row", "data+row"):
            args = _place(mesh, x, w, bias, pattern)
            np.testing.assert_allclose(np.asarray(f(*args)), ref, rtol=1e-5, atol=1e-4)
            assert "all-gather" not in hlo(f, *args)
        q = jax.jit(nv.quantize)
        xr = row_scaled(jax.random.key(6), (1024, 256))
        assert same_bytes(q(put(xr, mesh, P(ALL, None))), q(xr))
        # A weight the function closes over reaches the callbacks without a sharding.
        g = jax.jit(jax.vmap(lambda a: nv.matmul(a, w, out_dtype=jnp.float32)))
        xb = x.reshape(8, M // 8, K)
        np.testing.assert_allclose(np.asarray(g(put(xb, mesh, P("x", None, "y")))),
                                   np.asarray(g(xb)), rtol=1e-5, atol=1e-4)
    finally:
        jax.config.update("jax_use_shardy_partitioner", True)


# ------------------------------------------------------------------------------ conv


@multidevice
@pytest.mark.parametrize("x_spec,w_spec", [(P(ALL), P()), (P(), P(None, None, "y")),
                                           (P("x"), P(None, None, "y"))],
                         ids=["batch", "out_channels", "batch+out_channels"])
def test_conv_batch_and_output_channel_parallel(mesh, x_spec, w_spec):
    keys = jax.random.split(jax.random.key(7), 3)
    x = jax.random.normal(keys[0], (8, 8, 8, 64), jnp.float32)
    w = nv.quantize_conv_weight(jax.random.normal(keys[1], (3, 3, 64, 512), jnp.float32))
    bias = jax.random.normal(keys[2], (512,), jnp.float32)
    f = jax.jit(lambda a, b, c: nv.conv(a, b, bias=c, out_dtype=jnp.float32))
    args = (put(x, mesh, x_spec), shard_nvfp4(w, mesh, w_spec),
            put(bias, mesh, P(*w_spec[2:3])))
    out = f(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(f(x, w, bias)), rtol=1e-5, atol=1e-4)
    text = hlo(f, *args)
    assert "all-gather" not in text and "all-reduce" not in text
    images, _, _, channels = out.sharding.shard_shape(out.shape)
    assert images == args[0].sharding.shard_shape(x.shape)[0]
    assert channels == args[1].codes.sharding.shard_shape(w.shape)[2]


@multidevice
@pytest.mark.parametrize("x_nvfp4", [False, True], ids=["float_x", "nvfp4_x"])
@pytest.mark.parametrize("x_spec,w_spec", [(P(None, None, None, "y"), P(None, None, None, "y")),
                                           (P(), P(None, None, None, "y")),
                                           (P("x", None, None, "y"), P(None, None, None, "y")),
                                           (P(), P(None, None, "x", "y"))],
                         ids=["in_channels", "in_channels_x_replicated", "batch+in_channels",
                              "out+in_channels"])
def test_conv_input_channel_parallel(mesh, x_spec, w_spec, x_nvfp4):
    """C (the contracting axis) split: float32 partial convolutions all-reduced, the bias added
    once, equal to one device; no gather of the weight."""
    if mesh.shape["y"] < 2:
        pytest.skip("needs a C split")
    keys = jax.random.split(jax.random.key(8), 3)
    x = jax.random.normal(keys[0], (4, 6, 7, 512), jnp.float32)
    if x_nvfp4:
        x = nv.quantize(x)
    w = nv.quantize_conv_weight(jax.random.normal(keys[1], (3, 3, 512, 256), jnp.float32))
    bias = jnp.full((256,), 1000.0, jnp.float32)  # added twice would show
    f = jax.jit(lambda a, b, c: nv.conv(a, b, bias=c, out_dtype=jnp.float32))
    xs = shard_nvfp4(x, mesh, x_spec) if x_nvfp4 else put(x, mesh, x_spec)
    args = (xs, shard_nvfp4(w, mesh, w_spec), put(bias, mesh, P(*w_spec[2:3])))
    out = f(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(f(x, w, bias)), rtol=1e-5, atol=1e-2)
    text = hlo(f, *args)
    assert "all-reduce" in text and "all-gather" not in text
    assert out.sharding.shard_shape(out.shape)[3] == args[1].codes.sharding.shard_shape(w.shape)[2]


@multidevice
@pytest.mark.parametrize("x_spec,w_spec,y_spec", [
    (P(None, None, None, "y"), P(None, None, None, "y"), P("y", None, None, None)),
    (P(None, None, None, "y"), P(None, None, None, "y"), P(None, None, None, "y")),
    (P("x", None, None, "y"), P(None, None, None, "y"), P(ALL, None, None, None)),
    (P(None, None, None, "y"), P(None, None, "x", "y"), P(None, None, None, ALL))],
    ids=["images", "channels", "batch+images", "out+channels"])
def test_conv_input_channel_parallel_reduce_scatters_when_asked(mesh, x_spec, w_spec, y_spec):
    """C split with y's images or output channels asked split over the C axes as well: the
    partial sums are reduce-scattered, never all-reduced, and equal one device (the bias is
    added once, to each shard's own channels)."""
    if mesh.shape["y"] < 2:
        pytest.skip("needs a C split")
    keys = jax.random.split(jax.random.key(10), 2)
    x = jax.random.normal(keys[0], (8, 5, 6, 512), jnp.float32)
    w = nv.quantize_conv_weight(jax.random.normal(keys[1], (3, 3, 512, 256), jnp.float32))
    bias = jnp.linspace(-1000.0, 1000.0, 256, dtype=jnp.float32)  # added twice would show

    def f(a, b, c):
        y = nv.conv(a, b, bias=c, out_dtype=jnp.float32)
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, y_spec))

    g = jax.jit(f)
    args = (put(x, mesh, x_spec), shard_nvfp4(w, mesh, w_spec), put(bias, mesh, P(w_spec[2])))
    got = g(*args)
    text = hlo(g, *args)
    assert "reduce-scatter" in text
    assert "all-reduce" not in text and "all-gather" not in text
    assert got.sharding.is_equivalent_to(NamedSharding(mesh, y_spec), 4)
    np.testing.assert_allclose(np.asarray(got), np.asarray(g(x, w, bias)), rtol=1e-5, atol=1e-2)


# ------------------------------------------------------------------------------ placement


def test_nvfp4_sharding_splits_scales_with_codes():
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("x", "y"))
    s = nvfp4_sharding(mesh, P("x", "y"), (256, 512))
    assert s.codes.spec == P("x", "y")
    assert s.scales.spec == P("x", "y", None, None, None)
    assert s.s_dec.spec == P()


@multidevice
def test_placement_rejects_what_is_not_a_mesh_spec_or_nvfp4_array(mesh):
    w = nv.quantize(jnp.ones((256, 128), jnp.float32))
    with pytest.raises(ValueError, match=r"names mesh axes \['foo'\]; the mesh has \('x', 'y'\)"):
        shard_nvfp4(w, mesh, P("foo", None))
    with pytest.raises(TypeError, match="spec must be a PartitionSpec, got 'x'"):
        shard_nvfp4(w, mesh, "x")
    with pytest.raises(TypeError, match="spec must be a PartitionSpec, got None"):
        shard_nvfp4(w, mesh, None)
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh, got NoneType"):
        shard_nvfp4(w, None, P("x", None))
    with pytest.raises(TypeError, match="shard_nvfp4 places an NVFP4Array.*got ArrayImpl"):
        shard_nvfp4(jnp.ones((256, 128)), mesh, P("x", None))
    with pytest.raises(ValueError, match="s_dec_ndim=2 must be between 0 and the 0 leading dims"):
        nvfp4_sharding(mesh, P("x", None), (256, 128), s_dec_ndim=2)


@multidevice
def test_nvfp4_sharding_rejects_partial_tiles(mesh):
    with pytest.raises(ValueError, match=r"dim 0 of shape \(128, 512\).*128-element scale tiles"):
        nvfp4_sharding(mesh, P(ALL, None), (128, 512))
    with pytest.raises(ValueError, match=r"dim 1 of shape \(128, 96\).*64-element scale tiles"):
        nvfp4_sharding(mesh, P(None, ALL), (128, 96))
    # a leading (stack) dim splits into equal parts, one layer or expert a shard at least
    odd = mesh.size + 1
    with pytest.raises(ValueError, match=rf"dim 0 of shape \({odd}, 128, 64\).*into equal parts"):
        nvfp4_sharding(mesh, P(ALL, None, None), (odd, 128, 64))


def test_nvfp4_sharding_rejects_a_spec_longer_than_the_shape(mesh):
    with pytest.raises(ValueError, match=r"spec P\(None, None, None\) has more entries "
                                         r"than shape \(128, 64\) has dims"):
        nvfp4_sharding(mesh, P(None, None, None), (128, 64))


# ------------------------------------------------------------------------------ example


@pytest.fixture
def example(monkeypatch):
    """examples/sharded_llama.py as a module."""
    spec = importlib.util.spec_from_file_location("sharded_llama",
                                                  REPO / "examples" / "sharded_llama.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_sharded_llama_profile_reads_kernels_of_the_first_gpu(example, tmp_path):
    """--profile's trace reader: kernels on the first GPU's streams only (not another GPU's,
    nor the host's or a GPU's non-stream lines), summed by name, and their span."""
    meta = lambda kind, pid, name, tid=None: {"ph": "M", "name": kind, "pid": pid, "tid": tid,  # noqa: E731
                                              "args": {"name": name}}
    kernel = lambda pid, tid, name, ts, dur: {"ph": "X", "pid": pid, "tid": tid,  # noqa: E731
                                              "name": name, "ts": ts, "dur": dur}
    events = [meta("process_name", 1, "/host:CPU"), meta("process_name", 7, "/device:GPU:0"),
              meta("process_name", 8, "/device:GPU:1"),
              meta("thread_name", 7, "Stream #20(Compute)", 3),
              meta("thread_name", 7, "XLA Ops", 4), meta("thread_name", 8, "Stream #21(Compute)", 3),
              meta("thread_name", 1, "python", 3),
              kernel(7, 3, "gemm", 100.0, 5.0), kernel(7, 3, "norm", 106.0, 1.5),
              kernel(7, 3, "gemm", 110.0, 4.0), kernel(7, 4, "fusion.1", 100.0, 15.0),
              kernel(8, 3, "gemm", 90.0, 50.0), kernel(1, 3, "host work", 0.0, 500.0)]
    trace = tmp_path / "plugins" / "profile" / "run"
    trace.mkdir(parents=True)
    with gzip.open(trace / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    times, span = example.kernel_times(tmp_path)
    assert times == {"gemm": (9.0, 2), "norm": (1.5, 1)}
    assert span == 14.0

    with gzip.open(trace / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events[:1] + events[6:7]}, f)
    with pytest.raises(RuntimeError, match=r"no GPU kernels.*'/host:CPU', 'python'"):
        example.kernel_times(tmp_path)


def test_sharded_llama_out_names_a_file_or_a_directory_and_fails_early(example, tmp_path):
    """--out: a file as given; an existing directory gets a file named after the devices and the
    date; a path whose directory is missing stops the example before it builds the model."""
    devices = jax.devices()
    assert example.out_file(str(tmp_path / "t.md"), devices) == tmp_path / "t.md"
    named = example.out_file(str(tmp_path), devices)
    assert named.parent == tmp_path
    kind = devices[0].device_kind.replace(" ", "_")
    assert named.name.startswith(f"sharded_llama_{kind}x{len(devices)}_") and named.suffix == ".md"
    missing = tmp_path / "missing" / "t.md"
    with pytest.raises(SystemExit, match=re.escape(f"directory {missing.parent} does not exist")):
        example.main(["--small", "--out", str(missing)])


@multidevice
def test_sharded_llama_example_small(example, tmp_path, capsys):
    """The tensor-parallel Llama example (--small) runs and matches its one-device output."""
    out = tmp_path / "result.md"
    assert example.main(["--small", "--steps", "1", "--repeats", "1", "--out", str(out),
                         "--reduce-dtype", "bfloat16"]) == 0
    assert "matches one device: yes" in capsys.readouterr().out
    table = out.read_text()
    assert "| decode step, batch 16" in table and "| weight memory per device" in table
    assert "| decode, batch 1: one 1-step program, per step |" in table  # the older reading
    assert "partial sums added across devices in bfloat16" in table
    assert "sequence-parallel: temporaries per device (MiB) |" in table

    # The compiled decode step moves activations only: two all-reduces per block, no weight
    # gathered, and the fused q/k/v and gate/up outputs split without any resharding.
    cfg = example.SMALL
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    bf16_params, params = example.make_params(cfg, mesh, jax.random.key(0))
    caches = example.kv_caches(cfg, mesh, 1, jax.random.key(1))
    x = jax.device_put(jnp.zeros((1, 1, cfg.hidden), jnp.bfloat16), NamedSharding(mesh, P()))
    step = example.decode_steps(cfg, example.nvfp4_linear, mesh.shape["tp"], 1)
    hlo = step.lower(x, params, caches).compile().as_text()
    for op in ("all-gather", "all-to-all", "collective-permute"):
        assert op not in hlo, op
    assert hlo.count("all-reduce-start") + hlo.count(" all-reduce(") == 2 * cfg.layers

    # --reduce-dtype bfloat16 reaches both models' row-parallel sums: each step's output moves
    # from the float32 sums' by bfloat16 rounding.
    x = jax.random.normal(jax.random.key(5), x.shape, jnp.bfloat16)
    for linear, weights in ((example.nvfp4_linear, params), (example.bf16_linear, bf16_params)):
        f32, bf16 = (example.decode_steps(cfg, functools.partial(linear, reduce_dtype=r),
                                          mesh.shape["tp"], 1)(x, weights, caches)
                     for r in (None, jnp.bfloat16))
        assert 0 < example.relative_error(bf16, f32) < 2e-2, linear


def test_sharded_llama_table_marks_a_step_below_the_timers_noise(example):
    """A steady decode step read from programs whose longer one was not slower (a tiny model on
    a CPU) is shown as noise, not as a negative time and speedup."""
    rows = [("decode step, batch 1", {"nvfp4": math.nan, "bf16": 0.5}),
            ("prefill", {"nvfp4": 2.0, "bf16": 3.0})]
    table = example.render(example.SMALL, jax.devices()[:1], rows, [], 1e-3, jnp.dtype(jnp.float32))
    assert ("| decode step, batch 1 | noise | 0.500 | below the timer's noise: raise --steps or "
            "--repeats |") in table
    assert "| prefill | 2.000 | 3.000 | 1.50x |" in table


@multidevice
def test_sharded_llama_models_share_the_gate_up_projection(example):
    """The NVFP4 model's gate/up weight is the bf16 model's, regrouped into interleaved pairs and
    quantized: their SwiGLU outputs differ by NVFP4's rounding (about 0.1), where a mismatched
    pairing would leave them uncorrelated (about 1.4)."""
    cfg = example.SMALL
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    tp = mesh.shape["tp"]
    bf16_params, params = example.make_params(cfg, mesh, jax.random.key(0))
    h = jax.random.normal(jax.random.key(6), (4, cfg.hidden), jnp.bfloat16)
    f = jax.jit(example.swiglu, static_argnums=(2, 3))
    ours = f(h, params[0]["wgu"], example.nvfp4_linear, tp)
    theirs = f(h, bf16_params[0]["wgu"], example.bf16_linear, tp)
    assert ours.shape == theirs.shape == (4, cfg.intermediate)
    assert example.relative_error(ours, theirs) < 0.2


@multidevice
def test_sharded_llama_sequence_parallel_prefill(example):
    """Sequence parallelism in the example: the prefill's output is the same, split by tokens,
    and each block reduce-scatters its two row-parallel sums and all-gathers its two norms'
    outputs, with no all-reduce."""
    cfg = example.SMALL
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    tp = mesh.shape["tp"]
    _, params = example.make_params(cfg, mesh, jax.random.key(0))
    x = jax.random.normal(jax.random.key(4), (1, cfg.prefill, cfg.hidden), jnp.bfloat16)
    tokens_split = jax.device_put(x, NamedSharding(mesh, P(None, "tp", None)))
    sp = example.prefill(cfg, example.nvfp4_linear, tp, example.SequenceParallel(mesh))
    got = sp(tokens_split, params)
    want = example.prefill(cfg, example.nvfp4_linear, tp)(put(x, mesh, P()), params)
    assert got.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "tp", None)), 3)
    assert example.relative_error(got, want) < 1e-2  # sums of other orders, bf16 activations
    hlo = sp.lower(tokens_split, params).compile().as_text()
    count = lambda op: len(re.findall(rf"\b{op}(-start)?\(", hlo))  # noqa: E731
    assert count("reduce-scatter") == 2 * cfg.layers and count("all-gather") == 2 * cfg.layers
    assert count("all-reduce") == 0


# ------------------------------------------------------------------------------ explicit axes


@pytest.fixture(scope="module")
def explicit_mesh():
    return jax.make_mesh((N_DEV,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,),
                         devices=jax.devices()[:N_DEV])


@multidevice
@pytest.mark.parametrize("x_spec,w_spec", [(P("x", None), P(None, None)),
                                           (P(None, None), P("x", None)),
                                           (P(None, "x"), P(None, "x"))],
                         ids=["data-parallel", "column-parallel", "row-parallel"])
def test_ops_under_a_mesh_with_explicit_axes(explicit_mesh, x_spec, w_spec):
    """Under Explicit mesh axes the per-shard bodies run untyped by the mesh: quantize, matmul
    (each pattern) and dequantize give the values of a one-device run."""
    mesh = explicit_mesh
    x = row_scaled(jax.random.key(5), (16 * N_DEV, 128 * N_DEV))
    w = nv.quantize(row_scaled(jax.random.key(6), (128 * N_DEV, 128 * N_DEV)))
    f = jax.jit(lambda a, b: (nv.matmul(a, b, out_dtype=jnp.float32), nv.quantize(a),
                              nv.dequantize(b, jnp.float32)))
    want = f(x, w)
    with jax.set_mesh(mesh):
        got = f(put(x, mesh, x_spec), shard_nvfp4(w, mesh, w_spec))
    y, y_want = np.asarray(got[0]), np.asarray(want[0])  # row-parallel: another sum order
    assert np.linalg.norm(y - y_want) <= 1e-6 * np.linalg.norm(y_want)
    assert same_bytes(got[1:], want[1:])


@multidevice
@pytest.mark.parametrize("x_spec,w_spec,y_spec", [(P("x", None), P(None, None), P("x", None)),
                                                  (P(None, None), P("x", None), P(None, "x")),
                                                  (P(None, "x"), P(None, "x"), P(None, None))],
                         ids=["data-parallel", "column-parallel", "row-parallel"])
def test_explicit_axes_type_the_results_with_their_sharding(explicit_mesh, x_spec, w_spec, y_spec):
    """On Explicit axes a result's type carries the sharding the op gives it, so the ops after it
    (here a relu) keep the split: a data- or column-parallel output is not gathered (it was, while
    the types said replicated); a row-parallel one is summed to replicated."""
    mesh = explicit_mesh
    x = row_scaled(jax.random.key(12), (16 * N_DEV, 128 * N_DEV))
    w = nv.quantize(row_scaled(jax.random.key(13), (128 * N_DEV, 128 * N_DEV)))
    f = jax.jit(lambda a, b: jax.nn.relu(nv.matmul(a, b, out_dtype=jnp.float32)))
    want = np.asarray(f(x, w))
    with jax.set_mesh(mesh):
        a, b = put(x, mesh, x_spec), shard_nvfp4(w, mesh, w_spec)
        y = f(a, b)
        assert jax.typeof(y).sharding.spec == y_spec
        assert "all-gather" not in f.lower(a, b).compile().as_text()
    assert np.linalg.norm(np.asarray(y) - want) <= 1e-6 * np.linalg.norm(want)


@multidevice
@pytest.mark.parametrize("op", ["matmul", "matmul_w4a4", "vmap_matmul", "vmap_conv", "vmap_ragged"])
def test_explicit_axes_split_of_a_dimension_merged_into_rows(explicit_mesh, op):
    """x split on a leading dimension that is not the first of those merged into rows (x [B, S, K]
    placed P(None, "x", None); vmap's batch folded into M, images or ragged rows): on Explicit axes
    JAX cannot merge such a split, so that dimension is gathered first, as GSPMD does on Auto
    axes. The values are a one-device run's."""
    mesh, n = explicit_mesh, N_DEV
    w = nv.quantize(row_scaled(jax.random.key(7), (128, 64)))
    x = row_scaled(jax.random.key(8), (2, 24 * n, 64))
    mm = lambda a: nv.matmul(a, w, out_dtype=jnp.float32)  # noqa: E731
    if op == "vmap_conv":
        wc = nv.quantize_conv_weight(row_scaled(jax.random.key(9), (3, 3, 32, 16)))
        x = row_scaled(jax.random.key(10), (2, n, 5, 5, 32))
        f = jax.vmap(lambda a: nv.conv(a, wc, out_dtype=jnp.float32))
    elif op == "vmap_ragged":
        wr = jax.vmap(nv.quantize)(row_scaled(jax.random.key(11), (3, 32, 64)))
        sizes = jnp.array([[n, 10 * n, 3 * n], [0, 20 * n, 2 * n]], jnp.int32)
        per_routing = jax.vmap(lambda a, s: nv.ragged_matmul(a, wr, s, out_dtype=jnp.float32))
        f = lambda a: per_routing(a, sizes)  # noqa: E731
    else:
        f = {"matmul": mm, "matmul_w4a4": lambda a: mm(nv.quantize(a)),
             "vmap_matmul": jax.vmap(mm)}[op]
    want = jax.jit(f)(x)
    with jax.set_mesh(mesh):
        got = jax.jit(f)(put(x, mesh, P(None, "x")))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@multidevice
def test_grad_under_a_mesh_with_explicit_axes(explicit_mesh):
    """Under Explicit mesh axes every type carries its sharding: the cotangent of a row-sharded
    x must come back typed like x (autodiff reshards it), with the values of a one-device run."""
    mesh, n = explicit_mesh, N_DEV
    x = jax.random.normal(jax.random.key(3), (8 * n, 128), jnp.float32)
    w = nv.quantize(jax.random.normal(jax.random.key(4), (48, 128), jnp.float32))
    bias = jnp.linspace(-1.0, 1.0, 48, dtype=jnp.float32)

    def loss(a, b):
        return jnp.sum(nv.matmul(a, w, bias=b, out_dtype=jnp.float32) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    want_x, want_b = grad(x, bias)
    with jax.set_mesh(mesh):
        got_x, got_b = grad(put(x, mesh, P("x", None)), bias)
    assert got_x.sharding.shard_shape(got_x.shape) == (8, 128)
    np.testing.assert_allclose(np.asarray(got_x), np.asarray(want_x), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(np.asarray(got_b), np.asarray(want_b), rtol=1e-5)


@multidevice
@pytest.mark.parametrize("w_spec", [P("x", None), P(None, "x")], ids=["column", "row"])
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_grad_of_split_weights_on_explicit_axes(explicit_mesh, w_spec, activation, jit):
    """jax.grad through a column- or row-parallel matmul on Explicit axes, with and without jit
    and an epilogue activation: the JVP and transpose bind the partitioned primitives (an inner
    primitive traced on the split types failed to reshape the scales), and a column-parallel
    backward product sums over N, split in both its operands."""
    mesh, n = explicit_mesh, N_DEV
    x = jax.random.normal(jax.random.key(3), (16, 128 * n), jnp.float32)
    w = nv.quantize(jax.random.normal(jax.random.key(4), (128 * n, 128 * n), jnp.float32))

    def loss(a, b):
        return jnp.sum(nv.matmul(a, b, activation=activation, out_dtype=jnp.float32) ** 2)

    grad = jax.grad(loss)
    want = jax.jit(grad)(x, w)
    with jax.set_mesh(mesh):
        got = (jax.jit(grad) if jit else grad)(x, shard_nvfp4(w, mesh, w_spec))
    got, want = np.asarray(got), np.asarray(want)  # the backward runs in bfloat16
    assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)


@multidevice
@pytest.mark.parametrize("w_spec", [P(None, None, "x"), P(None, None, None, "x")],
                         ids=["out_channels", "in_channels"])
def test_conv_grad_of_split_weights_on_explicit_axes(explicit_mesh, w_spec):
    """jax.grad (no jit) through a conv whose filter is split on Explicit axes: the transposed
    convolution runs on Auto axes, typed like x."""
    mesh = explicit_mesh
    x = jax.random.normal(jax.random.key(5), (2, 6, 6, 64 * N_DEV), jnp.float32)
    w = nv.quantize_conv_weight(
        jax.random.normal(jax.random.key(6), (3, 3, 64 * N_DEV, 128 * N_DEV), jnp.float32))
    grad = jax.grad(lambda a, b: jnp.sum(nv.conv(a, b, out_dtype=jnp.float32) ** 2))
    want = np.asarray(jax.jit(grad)(x, w))
    with jax.set_mesh(mesh):
        got = np.asarray(grad(x, shard_nvfp4(w, mesh, w_spec)))
    assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)


@multidevice
def test_qat_grad_under_jit_on_a_mesh_with_explicit_axes(explicit_mesh):
    """The straight-through backward of qat_matmul / qat_conv under jit on Explicit axes: the
    cotangent reaching it may lack the output's sharding in its type; the gradients come back
    typed like the inputs, with the values of a one-device run."""
    mesh, n = explicit_mesh, N_DEV
    x = jax.random.normal(jax.random.key(3), (8 * n, 256), jnp.float32)
    w = jax.random.normal(jax.random.key(4), (512, 256), jnp.float32)
    img = jax.random.normal(jax.random.key(5), (n, 6, 6, 16), jnp.float32)
    filt = jax.random.normal(jax.random.key(6), (3, 3, 16, 32), jnp.float32)

    def loss(a, b, im, f):
        return (jnp.sum(qat_matmul(a, b, out_dtype=jnp.float32) ** 2)
                + jnp.sum(qat_conv(im, f, out_dtype=jnp.float32) ** 2))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    want = grad(x, w, img, filt)
    with jax.set_mesh(mesh):
        got = grad(put(x, mesh, P("x", None)), w, put(img, mesh, P("x", None, None, None)), filt)
    assert got[0].sharding.shard_shape(got[0].shape) == (8, 256)
    assert got[2].sharding.shard_shape(got[2].shape) == (1, 6, 6, 16)
    for g, g_want in zip(got, want):  # the backward runs in bfloat16
        g, g_want = np.asarray(g), np.asarray(g_want)
        assert np.linalg.norm(g - g_want) <= 1e-2 * np.linalg.norm(g_want)


@multidevice
@pytest.mark.parametrize("x_spec", [P(), P("x")], ids=["replicated", "batch-parallel"])
def test_w4a4_with_several_leading_dims_and_whole_row_tiles(mesh, x_spec):
    """NVFP4 x [B, S, K] with S a multiple of 128: its scales merge into those of [B*S, K] (the
    partitioner checks their rank against the rule), with the bytes of a one-device run."""
    x = nv.quantize(row_scaled(jax.random.key(7), (2, 128, 256)))
    w = nv.quantize(row_scaled(jax.random.key(8), (256, 256)))
    f = jax.jit(lambda a, b: nv.matmul(a, b, out_dtype=jnp.float32))
    want = f(x, w)
    got = f(jax.tree.map(lambda leaf: put(leaf, mesh, P(*x_spec[:leaf.ndim])), x), w)
    assert same_bytes(got, want)


# ------------------------------------------------------------------------------ stacked weights


E, T = 4, 256  # experts (stacked weights) and tokens per expert in the tests below


@pytest.fixture(scope="module")
def experts():
    """Per-expert activations [E, T, K] (T whole 128-row tiles, so NVFP4 x can split them), stacked NVFP4 weights [E, N, K] (each its own S_enc),
    per-expert biases [E, N]."""
    keys = jax.random.split(jax.random.key(11), 3)
    x = row_scaled(keys[0], (E * T, K)).reshape(E, T, K)
    w = jax.vmap(nv.quantize)(row_scaled(keys[1], (E * N, K)).reshape(E, N, K))
    bias = jax.random.normal(keys[2], (E, N), jnp.float32)
    return x, w, bias


def _per_expert(f, *stacked):
    """f applied expert by expert on one device (no vmap), stacked: what vmap must equal."""
    return np.stack([np.asarray(f(*(jax.tree.map(lambda a: a[e], s) for s in stacked)))
                     for e in range(E)])


STACKED_PATTERNS = {  # (x spec, w spec); the experts over "y", the rest over "x"
    "experts": (P("y"), P("y", None, None)),
    "experts+column": (P("y"), P("y", "x", None)),
    "experts+row": (P("y", None, "x"), P("y", None, "x")),
    "experts+data": (P("y", "x", None), P("y", None, None)),
}


@multidevice
@pytest.mark.parametrize("a_nvfp4", [False, True], ids=["w4a16", "w4a4"])
@pytest.mark.parametrize("pattern", list(STACKED_PATTERNS))
def test_vmap_over_stacked_weights_keeps_them_sharded(mesh, experts, pattern, a_nvfp4):
    """vmap of matmul over experts (x, w and bias all stacked): each device multiplies its own
    experts; with their N or K split too, the op's own rule applies within each expert. The
    values of an expert-by-expert run, no weight gathered, the output split like the experts."""
    x, w, bias = experts
    if a_nvfp4:
        x = jax.vmap(nv.quantize)(x)
    one = lambda a, b, c: nv.matmul(a, b, bias=c, out_dtype=jnp.float32)  # noqa: E731
    want = _per_expert(jax.jit(one), x, w, bias)
    f = jax.jit(jax.vmap(one))
    x_spec, w_spec = STACKED_PATTERNS[pattern]
    place_x = (lambda a: shard_nvfp4(a, mesh, x_spec)) if a_nvfp4 else (
        lambda a: put(a, mesh, x_spec))
    args = (place_x(x), shard_nvfp4(w, mesh, w_spec), put(bias, mesh, P("y", w_spec[1])))
    got = f(*args)
    # float32 sums: row-parallel adds the K halves in another order
    assert np.linalg.norm(np.asarray(got) - want) <= 1e-6 * np.linalg.norm(want)
    text = hlo(f, *args)
    assert "all-gather" not in text
    assert ("all-reduce" in text) == (pattern == "experts+row" and mesh.shape["x"] > 1)
    assert got.sharding.shard_shape(got.shape)[0] == E // mesh.shape["y"]


@multidevice
def test_vmap_over_stacked_weights_with_a_shared_activation(mesh, experts):
    """One activation through every expert (x not batched): x is not broadcast per expert, the
    weights stay split by expert."""
    x, w, _ = experts
    f = jax.jit(jax.vmap(lambda b: nv.matmul(x[0], b, out_dtype=jnp.float32)))
    ws = shard_nvfp4(w, mesh, P("y", None, None))
    want = _per_expert(jax.jit(lambda b: nv.matmul(x[0], b, out_dtype=jnp.float32)), w)
    np.testing.assert_allclose(np.asarray(f(ws)), want, rtol=1e-5, atol=1e-4)
    assert "all-gather" not in hlo(f, ws)


@multidevice
def test_grad_and_transpose_through_stacked_weights(mesh, experts):
    """jax.grad and jax.linear_transpose of the vmapped matmul in its activation (the stacked
    twin's JVP and transpose), sharded by expert, against expert-by-expert float64."""
    x, w, bias = experts
    w_hat = np.asarray(jax.vmap(lambda b: nv.dequantize(b, jnp.float32))(w), np.float64)
    ct = np.asarray(jax.random.normal(jax.random.key(12), (E, T, N)), np.float64)
    matmul = jax.vmap(lambda a, b, c: nv.matmul(a, b, bias=c, out_dtype=jnp.float32))
    loss = lambda a, b, c: jnp.sum(matmul(a, b, c) * ct.astype(np.float32))  # noqa: E731
    args = (put(x, mesh, P("y")), shard_nvfp4(w, mesh, P("y", None, None)),
            put(bias, mesh, P("y")))
    dx, db = jax.jit(jax.grad(loss, argnums=(0, 2)))(*args)
    want_dx = np.einsum("etn,enk->etk", ct, w_hat)
    for got, want in ((dx, want_dx), (db, ct.sum(1))):  # the backward runs in bfloat16
        got = np.asarray(got, np.float64)
        assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)

    def through_experts(a):  # one activation through every expert: linear in it
        return jax.vmap(lambda b: nv.matmul(a, b, out_dtype=jnp.float32))(args[1])

    (dx0,) = jax.jit(jax.linear_transpose(through_experts, x[0]))(ct.astype(np.float32))
    want_dx0 = np.einsum("etn,enk->tk", ct, w_hat)  # summed over the experts
    assert np.linalg.norm(np.asarray(dx0, np.float64) - want_dx0) <= 1e-2 * np.linalg.norm(want_dx0)


@multidevice
def test_vmap_over_stacked_conv_weights(mesh):
    """vmap of conv over a stack of NVFP4 filters, split by filter: each device convolves with
    its own filters, no weight gathered."""
    keys = jax.random.split(jax.random.key(13), 2)
    x = jax.random.normal(keys[0], (E, 2, 6, 6, 64), jnp.float32)
    w = jax.vmap(nv.quantize_conv_weight)(
        jax.random.normal(keys[1], (E, 3, 3, 64, 128), jnp.float32))
    one = lambda a, b: nv.conv(a, b, out_dtype=jnp.float32)  # noqa: E731
    want = _per_expert(jax.jit(one), x, w)
    f = jax.jit(jax.vmap(one))
    args = (put(x, mesh, P("y")), shard_nvfp4(w, mesh, P("y", None, None, None, None)))
    np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-5, atol=1e-4)
    assert "all-gather" not in hlo(f, *args)


@multidevice
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_stacked_weights_under_a_mesh_with_explicit_axes(explicit_mesh, activation):
    """vmap over experts split on an Explicit axis, forward and jax.grad under jit: the values of
    an expert-by-expert run, the output and the gradient split by expert."""
    mesh, n = explicit_mesh, N_DEV
    x = row_scaled(jax.random.key(14), (n * 64, 128)).reshape(n, 64, 128)
    w = jax.vmap(nv.quantize)(row_scaled(jax.random.key(15), (n * 128, 128)).reshape(n, 128, 128))
    one = lambda a, b: nv.matmul(a, b, activation=activation, out_dtype=jnp.float32)  # noqa: E731
    loss = lambda a, b: jnp.sum(jax.vmap(one)(a, b) ** 2)  # noqa: E731
    want_y = np.stack([np.asarray(jax.jit(one)(x[e], jax.tree.map(lambda a: a[e], w)))
                       for e in range(n)])
    want_g = np.asarray(jax.jit(jax.grad(loss))(x, w))
    with jax.set_mesh(mesh):
        args = (put(x, mesh, P("x")), shard_nvfp4(w, mesh, P("x", None, None)))
        y, g = jax.jit(jax.vmap(one))(*args), jax.jit(jax.grad(loss))(*args)
    assert y.sharding.shard_shape(y.shape)[0] == 1 and g.sharding.shard_shape(g.shape)[0] == 1
    for got, want in ((y, want_y), (g, want_g)):  # float32: another sum order
        assert np.linalg.norm(np.asarray(got) - want) <= 1e-6 * np.linalg.norm(want)


RAGGED_PATTERNS = {  # (x spec [M, K], w spec [G, N, K]); bias [G, N] follows w
    "experts": (P(), P("y", None, None)),
    "experts+column": (P(), P("y", "x", None)),
    "column": (P(), P(None, "y", None)),
    "row": (P(None, "x"), P(None, None, "x")),
    "row+column": (P(None, "x"), P(None, "y", "x")),
}
RAGGED_SIZES = [10, 0, 20, 5]  # 37 rows: 2 past the groups


@pytest.fixture(scope="module")
def ragged_operands():
    keys = jax.random.split(jax.random.key(21), 3)
    x = row_scaled(keys[0], (37, K))
    w = jax.vmap(nv.quantize)(row_scaled(keys[1], (4 * 512, K)).reshape(4, 512, K))
    bias = jax.random.normal(keys[2], (4, 512), jnp.float32)
    return x, w, bias


@multidevice
@pytest.mark.parametrize("a_nvfp4", [False, True], ids=["w4a16", "w4a4"])
@pytest.mark.parametrize("activation", [None, "swiglu"])
@pytest.mark.parametrize("pattern", list(RAGGED_PATTERNS))
def test_ragged_matmul_patterns(mesh, ragged_operands, pattern, activation, a_nvfp4):
    """Each split of the grouped matmul equals the one-device result; nothing is gathered."""
    x, w, bias = ragged_operands
    if a_nvfp4:
        x = nv.quantize(x)
    sizes = jnp.asarray(RAGGED_SIZES)
    f = jax.jit(lambda a, b, c, s: nv.ragged_matmul(a, b, s, bias=c, activation=activation,
                                                    out_dtype=jnp.float32))
    want = np.asarray(f(x, w, bias, sizes))
    x_spec, w_spec = RAGGED_PATTERNS[pattern]
    place_x = (lambda a: shard_nvfp4(a, mesh, x_spec)) if a_nvfp4 else (
        lambda a: put(a, mesh, x_spec))
    args = (place_x(x), shard_nvfp4(w, mesh, w_spec), put(bias, mesh, P(*w_spec[:2])), sizes)
    got = np.asarray(f(*args))
    assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want)
    assert not got[35:].any()
    assert "all-gather" not in hlo(f, *args)


@multidevice
@pytest.mark.parametrize("pattern", ["experts", "experts+column", "row"])
def test_ragged_matmul_nvfp4_output(mesh, ragged_operands, pattern):
    """out_s_enc under a split: the bytes one device's quantize gives from the same float32
    result (the quantization runs on y as the split leaves it), the weights not gathered."""
    x, w, bias = ragged_operands
    sizes, s_enc = jnp.asarray(RAGGED_SIZES), jnp.float32(64.0)
    call = lambda **kw: jax.jit(lambda a, b, c, s: nv.ragged_matmul(  # noqa: E731
        a, b, s, bias=c, activation="swiglu", **kw))
    x_spec, w_spec = RAGGED_PATTERNS[pattern]
    args = (put(x, mesh, x_spec), shard_nvfp4(w, mesh, w_spec), put(bias, mesh, P(*w_spec[:2])), sizes)
    got = call(out_s_enc=s_enc)(*args)
    y = np.asarray(call(out_dtype=jnp.float32)(*args))
    assert same_bytes(got, jax.jit(nv.quantize)(y, s_enc=s_enc))
    assert "all-gather" not in hlo(call(out_s_enc=s_enc), *args)


@multidevice
def test_ragged_row_parallel_sums_in_bfloat16_when_asked(mesh, ragged_operands):
    """reduce_dtype=bfloat16 on a K split of the grouped matmul: the partial products summed in
    bfloat16 (rounding them, 2^-9), then each row's bias once; the default keeps float32."""
    if mesh.shape["x"] < 2:
        pytest.skip("needs a K split")
    x, w, bias = ragged_operands
    sizes = jnp.asarray(RAGGED_SIZES)

    def f(a, b, c, s, reduce_dtype):
        return nv.ragged_matmul(a, b, s, bias=c, activation="swiglu", out_dtype=jnp.float32,
                                reduce_dtype=reduce_dtype)

    g = jax.jit(f, static_argnums=4)
    ref = np.asarray(g(x, w, bias, sizes, None))
    x_spec, w_spec = RAGGED_PATTERNS["row"]
    args = (put(x, mesh, x_spec), shard_nvfp4(w, mesh, w_spec), put(bias, mesh, P(*w_spec[:2])), sizes)
    errors = {}
    for reduce_dtype in (None, jnp.bfloat16):
        got = np.asarray(g(*args, reduce_dtype))
        errors[reduce_dtype] = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert not got[35:].any()  # rows past the groups stay zero
        text = hlo(g, *args, reduce_dtype)
        assert "all-gather" not in text
        if jax.devices()[0].platform == "gpu":
            assert _all_reduce_dtypes(text) == {"bf16" if reduce_dtype else "f32"}
    assert errors[None] < 1e-6
    assert 1e-4 < errors[jnp.bfloat16] < 1e-2


@multidevice
def test_ragged_matmul_gathers_split_rows_of_x_not_the_weights(mesh, ragged_operands):
    """The groups index x's rows globally: x split by rows is gathered, the experts stay split."""
    x, w, _ = ragged_operands
    x = x[:36]
    sizes = jnp.asarray(RAGGED_SIZES)
    f = jax.jit(lambda a, b, s: nv.ragged_matmul(a, b, s, out_dtype=jnp.float32))
    want = np.asarray(f(x, w, sizes))
    args = (put(x, mesh, P("x", None)), shard_nvfp4(w, mesh, P("y", None, None)), sizes)
    got = np.asarray(f(*args))
    assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want)
    gathers = re.findall(r"all-gather[^\n]*", hlo(f, *args))
    assert not [g for g in gathers if "f4e2m1fn" in g or "f8e4m3fn" in g], gathers
    if mesh.shape["x"] > 1:  # on a 1 x n mesh (2 GPUs) x's rows are not split: nothing to gather
        assert gathers


@multidevice
def test_ragged_matmul_vmap_folds_on_expert_parallel_weights(mesh, ragged_operands):
    """vmap over batches of rows and routings with the experts split: the batch folds into one
    partitioned call (the weights stay split, nothing gathered), equal to each element alone."""
    x, w, _ = ragged_operands
    xs = jnp.stack([x, 2 * x[::-1]])
    sizes = jnp.asarray([RAGGED_SIZES, RAGGED_SIZES[::-1]], jnp.int32)
    f = jax.jit(jax.vmap(lambda a, b, s: nv.ragged_matmul(a, b, s, out_dtype=jnp.float32),
                         (0, None, 0)))
    args = (xs, shard_nvfp4(w, mesh, P("y", None, None)), sizes)
    got = np.asarray(f(*args))
    for b in range(2):
        want = np.asarray(nv.ragged_matmul(xs[b], w, sizes[b], out_dtype=jnp.float32))
        assert np.linalg.norm(got[b] - want) <= 1e-6 * np.linalg.norm(want)
    assert "all-gather" not in hlo(f, *args)


@multidevice
@pytest.mark.parametrize("w_spec", [P("x", None, None), P(None, "x", None), P(None, None, "x")],
                         ids=["experts", "column", "row"])
def test_ragged_matmul_grad_on_explicit_axes(explicit_mesh, ragged_operands, w_spec):
    """jax.grad in x under a mesh with Explicit axes, the weight split by expert, N or K: the
    tangent products run on Auto axes (as matmul's backward does), equal to one device."""
    mesh = explicit_mesh
    x = ragged_operands[0]
    w = jax.vmap(nv.quantize)(row_scaled(jax.random.key(22), (N_DEV * 1024, K)).reshape(N_DEV, 1024, K))
    sizes = jnp.arange(N_DEV, dtype=jnp.int32) % 3
    loss = lambda a, b: jnp.sum(nv.ragged_matmul(a, b, sizes, activation="silu",  # noqa: E731
                                                 out_dtype=jnp.float32) ** 2)
    want = jax.jit(jax.grad(loss))(x, w)
    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(loss))(x, shard_nvfp4(w, mesh, w_spec))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                               atol=1e-5 * np.abs(np.asarray(want)).max())


@multidevice
def test_ragged_matmul_expert_parallel_grad(mesh, ragged_operands):
    """jax.grad through the expert-parallel grouped matmul equals the one-device gradient (to the
    bfloat16 rounding of its tangent products, which XLA may sum in another order)."""
    x, w, bias = ragged_operands
    sizes = jnp.asarray(RAGGED_SIZES)

    def loss(a, b, c):
        return jnp.sum(nv.ragged_matmul(a, b, sizes, bias=c, activation="silu",
                                        out_dtype=jnp.float32) ** 2)

    g = jax.jit(jax.grad(loss, argnums=(0, 2)))
    want = g(x, w, bias)
    got = g(put(x, mesh, P()), shard_nvfp4(w, mesh, P("y", None, None)), put(bias, mesh, P("y")))
    for a, b in zip(got, want):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.linalg.norm(a - b) <= 1e-2 * np.linalg.norm(b)


@multidevice
def test_a_loop_timer_rotates_a_split_operand_through_as_many_bytes_a_device_as_one_would(mesh):
    # The benchmarks' timer rotates operands past the L2; split over n devices, COPIES sets would
    # leave each device 1/n of the bytes (a 4096 x 4096 NVFP4 weight on 4 GPUs: 19 MB, in L2).
    x = put(jnp.ones((8 * N_DEV, 64), jnp.float32), mesh, P(ALL))
    assert bytes_a_device(x) == x.nbytes // N_DEV
    assert len(LoopTimer(lambda a: a * 2.0, (x,))._sets) == COPIES * N_DEV
