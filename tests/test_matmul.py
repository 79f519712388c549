"""jax_nvfp4.matmul on the default backend (the XLA reference on CPU) against a float64 oracle,
its API (validation, jit, vmap, NVFP4 output), the sm_90a dequantization math on the host, and
the SASS of the built sm_90a GEMM kernels."""

import importlib.util
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_nvfp4 as jn

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("matmul_cases", HERE / "matmul_cases.py")
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)

SHAPES_NK = [(40, 48), (130, 208)]  # N and K off every tile size


@pytest.mark.parametrize("m", [1, 3, 17, 255])
@pytest.mark.parametrize("n,k", SHAPES_NK)
@pytest.mark.parametrize("x_dtype,out_dtype", [(jnp.float32, jnp.float32),
                                               (jnp.bfloat16, jnp.bfloat16)])
def test_w4a16_matches_float64(m, n, k, x_dtype, out_dtype):
    x = mc.random_float((m, k), x_dtype, seed=m + k)
    w = mc.random_weight(n, k, seed=n)
    y = jn.matmul(x, w, out_dtype=out_dtype)
    assert y.shape == (m, n) and y.dtype == out_dtype
    mc.assert_close(y, mc.oracle(x, w), mc.TOL[out_dtype])


@pytest.mark.parametrize("m", [1, 17, 200])
def test_w4a4_matches_float64(m):
    n, k = 72, 160
    xq = jn.quantize(mc.random_float((m, k), jnp.float32, seed=5))
    w = mc.random_weight(n, k, seed=6)
    y = jn.matmul(xq, w, out_dtype=jnp.float32)
    mc.assert_close(y, mc.oracle(xq, w), 1e-5)


def test_default_out_dtype_is_bfloat16():
    y = jn.matmul(mc.random_float((2, 32), jnp.float32, 0), mc.random_weight(16, 32, 1))
    assert y.dtype == jnp.bfloat16


@pytest.mark.parametrize("bias_dtype", [jnp.float32, jnp.bfloat16])
def test_bias(bias_dtype):
    x = mc.random_float((5, 64), jnp.bfloat16, 1)
    w = mc.random_weight(48, 64, 2)
    bias = mc.random_float((48,), bias_dtype, 3)
    y = jn.matmul(x, w, bias=bias, out_dtype=jnp.float32)
    mc.assert_close(y, mc.oracle(x, w, bias), 1e-5)


@pytest.mark.parametrize("lead", [(2, 3), (4, 130)])
def test_batched_x(lead):
    k, n = 96, 40
    x = mc.random_float((*lead, k), jnp.float32, 7)
    w = mc.random_weight(n, k, 8)
    y = jn.matmul(x, w, out_dtype=jnp.float32)
    assert y.shape == (*lead, n)
    mc.assert_close(y.reshape(-1, n), mc.oracle(x.reshape(-1, k), w), 1e-5)


@pytest.mark.parametrize("lead", [(6,), (2, 3), (2, 130)])
def test_nvfp4_output_is_the_quantized_float32_result(lead):
    k, n = 64, 48
    x = mc.random_float((*lead, k), jnp.bfloat16, 9)
    w = mc.random_weight(n, k, 10)
    s_enc = np.float32(1500.0)
    q = jn.matmul(x, w, out_s_enc=s_enc)
    assert isinstance(q, jn.NVFP4Array) and q.shape == (*lead, n)
    q.validate()
    y = jn.matmul(x, w, out_dtype=jnp.float32).reshape(-1, n)
    codes, scales, s_dec = mc.quantize_reference_bytes(y, s_enc)
    got = jn.NVFP4Array(q.codes.reshape(-1, n), None, q.s_dec)
    np.testing.assert_array_equal(
        np.asarray(jax.lax.bitcast_convert_type(got.codes, jnp.uint4)).astype(np.uint8), codes)
    plain = np.asarray(q.plain_scales()).view(np.uint8).reshape(-1, n // 16)
    np.testing.assert_array_equal(plain, jn.format.tiled_to_plain(scales, y.shape[0], n // 16))
    np.testing.assert_array_equal(np.asarray(q.s_dec), s_dec)


ACTIVATIONS = ["relu", "gelu", "silu", "swiglu", "geglu"]
# jax.nn's functions of the same names (y's interleaved gate/up pairs for the gated ones).
FLOAT_ACTIVATIONS = {
    "relu": jax.nn.relu, "gelu": jax.nn.gelu, "silu": jax.nn.silu,
    "swiglu": lambda y: jax.nn.silu(y[..., 0::2]) * y[..., 1::2],
    "geglu": lambda y: jax.nn.gelu(y[..., 0::2]) * y[..., 1::2],
}


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("a_nvfp4", [False, True], ids=["w4a16", "w4a4"])
def test_activation_matches_float64(activation, a_nvfp4):
    m, n, k = 17, 130, 208
    x = mc.random_float((m, k), jnp.float32, 21)
    if a_nvfp4:
        x = jn.quantize(x)
    w = mc.random_weight(n, k, 22)
    bias = mc.random_float((n,), jnp.float32, 23, 0.5)
    pre = mc.oracle(x, w, bias)
    assert (pre < -1).any() and (pre > 1).any()  # both sides of the nonlinearity
    want = mc.oracle(x, w, bias, activation)
    y = jn.matmul(x, w, bias=bias, activation=activation, out_dtype=jnp.float32)
    mc.assert_close(y, want, 1e-5)
    mc.assert_close(jn.matmul(x, w, bias=bias, activation=activation), want, 1e-2)


def test_relu_keeps_nan():
    """relu is y < 0 ? 0 : y: a NaN (a NaN weight block's column) stays NaN, not 0."""
    x = jnp.ones((2, 32), jnp.float32)
    wf = jnp.zeros((32, 32), jnp.float32).at[3].set(-1.0).at[5, 0].set(jnp.nan)
    y = np.asarray(jn.matmul(x, jn.quantize(wf), activation="relu", out_dtype=jnp.float32))
    assert np.isnan(y[:, 5]).all() and (y[:, 3] == 0).all()


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_nvfp4_output_quantizes_the_activated_result(activation):
    k, n = 64, 96
    x = mc.random_float((6, k), jnp.bfloat16, 24)
    w = mc.random_weight(n, k, 25)
    q = jn.matmul(x, w, activation=activation, out_s_enc=np.float32(1500.0))
    y = jn.matmul(x, w, activation=activation, out_dtype=jnp.float32)
    codes, _, _ = mc.quantize_reference_bytes(y, np.float32(1500.0))
    np.testing.assert_array_equal(
        np.asarray(jax.lax.bitcast_convert_type(q.codes, jnp.uint4)).astype(np.uint8), codes)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activation_gradients_match_the_float_function(activation):
    """grad and jvp through the epilogue activation equal those of act(x @ w_hat.T + b) with the
    dequantized weight (the backward runs in bfloat16). The float function's dot asks for full
    float32 precision: on a GPU XLA's default would be TF32, about 1e-3 off."""
    x = mc.random_float((5, 64), jnp.float32, 26)
    w = mc.random_weight(48, 64, 27)
    b = mc.random_float((48,), jnp.float32, 28, 0.5)
    w_hat = jn.dequantize(w, jnp.float32)
    fn = FLOAT_ACTIVATIONS[activation]
    ours = lambda x, b: jnp.sum(jn.matmul(x, w, bias=b, activation=activation,  # noqa: E731
                                          out_dtype=jnp.float32) ** 2)
    linear = lambda x, b: jnp.dot(x, w_hat.T, precision=jax.lax.Precision.HIGHEST) + b  # noqa: E731
    theirs = lambda x, b: jnp.sum(fn(linear(x, b)) ** 2)  # noqa: E731
    for got, want in zip(jax.grad(ours, (0, 1))(x, b), jax.grad(theirs, (0, 1))(x, b)):
        assert mc.rel_error(got, np.asarray(want, np.float64)) < 1e-2
    t = mc.random_float(x.shape, jnp.float32, 29)
    _, got = jax.jvp(lambda x: jn.matmul(x, w, bias=b, activation=activation,
                                         out_dtype=jnp.float32), (x,), (t,))
    _, want = jax.jvp(lambda x: fn(linear(x, b)), (x,), (t,))
    assert mc.rel_error(got, np.asarray(want, np.float64)) < 1e-5


def test_activation_under_vmap_and_jit():
    xs = mc.random_float((3, 4, 64), jnp.float32, 30)
    w = mc.random_weight(32, 64, 31)
    f = jax.jit(jax.vmap(lambda a: jn.matmul(a, w, activation="silu", out_dtype=jnp.float32)))
    mc.assert_close(f(xs).reshape(12, 32), mc.oracle(xs.reshape(12, 64), w, None, "silu"), 1e-5)


def test_activation_is_checked():
    x, w = mc.random_float((2, 32), jnp.float32, 0), mc.random_weight(16, 32, 1)
    with pytest.raises(ValueError, match=r"matmul: activation must be None or one of \('relu', "
                                         r"'gelu', 'silu', 'swiglu', 'geglu'\), got 'tanh'"):
        jn.matmul(x, w, activation="tanh")


def test_gated_activation_pairs_interleaved_rows():
    """matmul(x, quantize(interleave_gate_up(g, u)), activation="swiglu") is silu(x @ g.T) *
    (x @ u.T) on the dequantized rows, [M, F] from a [2F, K] weight; the bias pairs the same way."""
    m, f, k = 9, 40, 96
    x = mc.random_float((m, k), jnp.float32, 40)
    g, u = mc.random_float((f, k), jnp.float32, 41), mc.random_float((f, k), jnp.float32, 42)
    bg, bu = mc.random_float((f,), jnp.float32, 43), mc.random_float((f,), jnp.float32, 44)
    w = jn.quantize(jn.interleave_gate_up(g, u))
    bias = jn.interleave_gate_up(bg, bu)
    assert w.shape == (2 * f, k) and bias.shape == (2 * f,)
    np.testing.assert_array_equal(np.asarray(bias[0::2]), np.asarray(bg))
    np.testing.assert_array_equal(np.asarray(bias[1::2]), np.asarray(bu))
    wv = mc.nvfp4_to_f64(w)
    xv = np.asarray(x, np.float64)
    gate = xv @ wv[0::2].T + np.asarray(bg, np.float64)
    up = xv @ wv[1::2].T + np.asarray(bu, np.float64)
    y = jn.matmul(x, w, bias=bias, activation="swiglu", out_dtype=jnp.float32)
    assert y.shape == (m, f)
    mc.assert_close(y, gate / (1 + np.exp(-gate)) * up, 1e-5)


def test_gated_activation_is_checked():
    x = mc.random_float((2, 32), jnp.float32, 0)
    with pytest.raises(ValueError, match=r"matmul: activation='swiglu' pairs w's rows \(gate, up\), "
                                         r"so N must be even, got N=17"):
        jn.matmul(x, mc.random_weight(17, 32, 1), activation="swiglu")
    with pytest.raises(ValueError, match=r"NVFP4 output needs its columns a multiple of 16, got "
                                         r"N / 2 = 24 \(activation='geglu', N=48\)"):
        jn.matmul(x, mc.random_weight(48, 32, 1), activation="geglu", out_s_enc=1.0)
    with pytest.raises(ValueError, match=r"bias must have shape \(48,\)"):
        jn.matmul(x, mc.random_weight(48, 32, 1), bias=jnp.zeros(24), activation="geglu")
    with pytest.raises(ValueError, match=r"interleave_gate_up: gate and up must have the same "
                                         r"shape.*\(4, 32\) and \(5, 32\)"):
        jn.interleave_gate_up(jnp.zeros((4, 32)), jnp.zeros((5, 32)))
    with pytest.raises(TypeError, match=r"same dtype, got float32 and bfloat16"):
        jn.interleave_gate_up(jnp.zeros((4, 32)), jnp.zeros((4, 32), jnp.bfloat16))
    with pytest.raises(TypeError, match=r"interleave the float weights, then quantize"):
        jn.interleave_gate_up(mc.random_weight(16, 32, 1), mc.random_weight(16, 32, 2))


def test_nan_propagates_to_its_row_and_column_only():
    m, n, k = 4, 32, 64
    x = np.array(mc.random_float((m, k), jnp.float32, 11))
    x[1, 5] = np.nan
    wf = np.array(mc.random_float((n, k), jnp.float32, 12))
    wf[7, 40] = np.nan  # its block gets the NaN scale
    y = np.asarray(jn.matmul(jnp.asarray(x), jn.quantize(jnp.asarray(wf)), out_dtype=jnp.float32))
    nan = np.isnan(y)
    assert nan[1].all() and nan[:, 7].all()
    assert not np.delete(np.delete(nan, 1, axis=0), 7, axis=1).any()


def test_jit_equals_eager():
    x = mc.random_float((9, 80), jnp.bfloat16, 13)
    w = mc.random_weight(24, 80, 14)
    eager = jn.matmul(x, w, out_dtype=jnp.float32)
    jitted = jax.jit(lambda a, b: jn.matmul(a, b, out_dtype=jnp.float32))(x, w)
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))


def test_vmap_over_x_and_over_weights():
    k, n = 64, 32
    xs = mc.random_float((3, 5, k), jnp.float32, 15)
    w = mc.random_weight(n, k, 16)
    f = lambda a: jn.matmul(a, w, out_dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(xs)), np.stack([f(a) for a in xs]),
                               rtol=1e-6, atol=1e-6)
    ws = jax.vmap(jn.quantize)(mc.random_float((2, n, k), jnp.float32, 17) * 0.05)
    g = lambda wq: jn.matmul(xs[0], wq, out_dtype=jnp.float32)
    stacked = jax.vmap(g)(ws)
    for i in range(2):
        wi = jax.tree.map(lambda a: a[i], ws)
        mc.assert_close(stacked[i], mc.oracle(xs[0], wi), 1e-5)


def test_vmap_with_an_empty_batch_or_empty_rows():
    w = mc.random_weight(32, 64, 18)
    f = lambda a: jn.matmul(a, w, out_dtype=jnp.float32)  # noqa: E731
    for shape in [(3, 0, 64), (0, 5, 64), (0, 64)]:
        assert jax.vmap(f)(jnp.zeros(shape)).shape == (*shape[:-1], 32)


def test_w4a4_with_several_leading_dims_and_whole_row_tiles():
    # x [2, 128, K]: its scales merge into those of a [256, K] matrix (two row tiles).
    x = mc.random_float((2, 128, 64), jnp.float32, 19)
    w = mc.random_weight(32, 64, 20)
    xq = jn.quantize(x)
    got = jn.matmul(xq, w, out_dtype=jnp.float32)
    want = jn.matmul(jn.quantize(x.reshape(256, 64), s_enc=1.0 / xq.s_dec), w, out_dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want).reshape(2, 128, 32))
    mc.assert_close(got, mc.oracle(xq, w), 1e-5)


def test_linear_transpose_equals_the_vjp():
    w = mc.random_weight(32, 64, 21)
    x = mc.random_float((5, 64), jnp.float32, 22)
    ct = mc.random_float((5, 32), jnp.float32, 23)
    f = lambda a: jn.matmul(a, w, out_dtype=jnp.float32)  # noqa: E731
    (transposed,) = jax.linear_transpose(f, x)(ct)
    (pulled,) = jax.vjp(f, x)[1](ct)
    np.testing.assert_array_equal(np.asarray(transposed), np.asarray(pulled))


class TestValidation:
    w = mc.random_weight(32, 64, 0)

    def test_mismatched_k(self):
        with pytest.raises(ValueError, match=r"contracting dims differ.*K=48.*K=64"):
            jn.matmul(jnp.zeros((2, 48)), self.w)

    def test_x_dtype(self):
        with pytest.raises(TypeError, match="matmul: x must be float32, bfloat16 or float16, got int32"):
            jn.matmul(jnp.zeros((2, 64), jnp.int32), self.w)

    def test_x_scalar(self):
        with pytest.raises(ValueError, match="matmul: x must have rank >= 1"):
            jn.matmul(1.0, self.w)

    def test_w_not_nvfp4(self):
        with pytest.raises(TypeError, match="w must be an NVFP4Array.*got ArrayImpl"):
            jn.matmul(jnp.zeros((2, 64)), jnp.zeros((32, 64)))

    def test_w_not_2d(self):
        w3 = jn.quantize(jnp.ones((2, 32, 64)))
        with pytest.raises(ValueError, match=r"2-D \[N, K\].*\(2, 32, 64\)"):
            jn.matmul(jnp.zeros((2, 64)), w3)

    def test_bias_shape(self):
        with pytest.raises(ValueError, match=r"bias must have shape \(32,\), got \(31,\)"):
            jn.matmul(jnp.zeros((2, 64)), self.w, bias=jnp.zeros((31,)))

    def test_out_dtype(self):
        with pytest.raises(TypeError, match="out_dtype must be float32.*got int8"):
            jn.matmul(jnp.zeros((2, 64)), self.w, out_dtype=jnp.int8)

    def test_nvfp4_out_needs_n_multiple_of_16(self):
        w = mc.random_weight(40, 64, 1)
        with pytest.raises(ValueError, match="columns a multiple of 16, got N=40"):
            jn.matmul(jnp.zeros((2, 64)), w, out_s_enc=1.0)

    def test_out_s_enc_scalar(self):
        with pytest.raises(ValueError, match=r"out_s_enc must be a scalar, got shape \(2,\)"):
            jn.matmul(jnp.zeros((2, 64)), self.w, out_s_enc=jnp.ones((2,)))

    def test_dtypes_as_jax_canonicalizes_them(self):
        """The builtin `float` is float32 without x64 (as jnp reads it), and lists of Python
        numbers are float32 with or without it (as quantize takes them); float64 arrays under
        x64 are refused."""
        x = jnp.ones((2, 64))
        assert jn.matmul(x, self.w, out_dtype=float).dtype == jnp.float32
        assert jn.dequantize(self.w, float).dtype == jnp.float32
        with jax.enable_x64(True):
            y = jn.matmul([[1.0] * 64] * 2, self.w, bias=[0.5] * 32, out_dtype=jnp.float32)
            np.testing.assert_array_equal(y, jn.matmul(x, self.w, bias=jnp.full((32,), 0.5, jnp.float32),
                                                        out_dtype=jnp.float32))
            with pytest.raises(TypeError, match="matmul: out_dtype must be .*got float64"):
                jn.matmul(x.astype(jnp.float32), self.w, out_dtype=float)
            with pytest.raises(TypeError, match="matmul: x must be .*got float64"):
                jn.matmul(jnp.ones((2, 64), jnp.float64), self.w)

    def test_dtype_that_is_not_one(self):
        with pytest.raises(TypeError, match="matmul: out_dtype must be .*got 'flaot32'"):
            jn.matmul(jnp.zeros((2, 64)), self.w, out_dtype="flaot32")
        with pytest.raises(TypeError, match="matmul: reduce_dtype must be float32 or bfloat16, got 'foo'"):
            jn.matmul(jnp.zeros((2, 64)), self.w, reduce_dtype="foo")

    def test_out_dtype_with_out_s_enc(self):
        with pytest.raises(ValueError, match="out_dtype=float32 has no effect with out_s_enc"):
            jn.matmul(jnp.zeros((2, 64)), self.w, out_s_enc=1.0, out_dtype=jnp.float32)

    def test_nvfp4_bias(self):
        with pytest.raises(TypeError, match="matmul: bias must be a float array, got an NVFP4Array"):
            jn.matmul(jnp.zeros((2, 64)), self.w, bias=jn.quantize(jnp.ones((2, 32))))

    def test_nvfp4_x_with_a_scale_per_batch(self):
        xq = jax.vmap(jn.quantize)(jnp.ones((2, 16, 64)))  # s_dec of shape (2,)
        with pytest.raises(ValueError, match=r"matmul: an NVFP4 x needs a scalar s_dec, got shape \(2,\)"):
            jn.matmul(xq, self.w)

    @pytest.mark.parametrize("s_enc", [0.0, -1.0, float("inf")])
    def test_out_s_enc_finite_positive(self, s_enc):
        with pytest.raises(ValueError, match=f"out_s_enc must be finite and positive, got {s_enc}"):
            jn.matmul(jnp.zeros((2, 64)), self.w, out_s_enc=s_enc)


def test_sm90_dequantization_is_exact(host_program):
    """The kernels' bf16 NVFP4 decoding (every code x every E4M3 scale, exact) and their scale
    pointer arithmetic, on the host."""
    out = host_program(HERE / "host" / "gemm_sm90_dequant.cc")
    # 254 non-NaN scales x 16 codes x 8 positions, then the scale pointer arithmetic
    assert out.split() == ["checked", "32512", "layout", "ok"]


def test_sm90_fused_staging_layout_is_cutes_wgmma_swizzle(host_program):
    """The fused kernels' staged activation tile (fused_staging.h; 64, 128 and 256 rows) against
    CuTe's K-major 128-byte-swizzle wgmma atom, element by element and per k-step descriptor
    offset, on the host; and its K order places every element of a chunk exactly once."""
    out = host_program(HERE / "host" / "gemm_sm90_fused_layout.cc", cutlass=True)
    # MT, elements + k-steps checked, mismatches
    assert out.split() == ["64", "8200", "0", "128", "16392", "0", "256", "32776", "0", "order", "ok"]


def test_sm90_prefill_kernel_uses_wgmma(kernel_sass):
    kernels = kernel_sass("sm_90a", r"GemmUniversal.*MainloopSm90TmaGmma")
    for name, sass in kernels.items():
        assert "HGMMA" in sass, f"{name} has no HGMMA"
        assert "UTMALDG" in sass, f"{name} has no TMA load"


def test_sm90_fused_kernel_uses_wgmma_with_register_a(kernel_sass):
    """The mid-M kernel dequantizes into wgmma's A registers, its activations come by cp.async,
    and its 8 k-steps of one chunk are issued back to back, not serialized by ptxas."""
    kernels = kernel_sass("sm_90a", r"12fused_kernel")
    assert len(kernels) == 4, sorted(kernels)  # 64 or 128 activation rows x 16- or 8-byte weight copies
    for name, sass in kernels.items():
        assert re.search(r"HGMMA\.64x(64|128)x16\.F32\.BF16 R\d+, R\d+, gdesc", sass), name
        assert "LDGSTS" in sass, f"{name} has no cp.async"
        assert "LDL" not in sass and "STL" not in sass, f"{name} spills to local memory"
        # ptxas inserts a wait after each wgmma when it cannot prove the pipeline safe.
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass, f"{name}: no wgmma left in flight"
        assert_tile_epilogue(name, sass)


def assert_tile_epilogue(name, sass):
    """The fused kernels' epilogue through shared memory (tile_epilogue.cuh): stmatrix into the
    tile, 16-byte reads of it and 16-byte stores of output rows."""
    assert "STSM" in sass, f"{name} has no stmatrix"
    assert re.search(r"LDS\.128 ", sass), f"{name} reads no 16-byte pieces of its tile"
    assert re.search(r"STG\.E\.128 ", sass), f"{name} stores no 16-byte pieces of output rows"


def test_sm90_fused_ws_kernel_is_warp_specialized(kernel_sass):
    """The large-M kernel: register-A wgmma (N = 128, or 256 on the wide tiles, whose producer
    warpgroup hands its registers to the consumers), the activation tiles by bulk copy (TMA) and
    the weights by cp.async into an mbarrier ring, 8 k-steps left in flight, no local memory;
    split-K's partial tiles meet through distributed shared memory after a cluster barrier (not
    in the ragged kernels)."""
    kernels = kernel_sass("sm_90a", r"15fused_ws_kernel")
    # 128- or 256-row tiles x 16- or 8-byte weight copies, and for ragged GEMMs, which never split
    # K, 64-, 128- or 256-row tiles
    assert len(kernels) == 10, sorted(kernels)
    for name, sass in kernels.items():
        wide, ragged = "ILi256E" in name, "ELb1EE" in name
        assert ragged != ("ELb0EE" in name), name
        n = int(re.search(r"fused_ws_kernelILi(\d+)E", name).group(1))
        assert ragged or n >= 128, name
        assert re.search(rf"HGMMA\.64x{n}x16\.F32\.BF16 R\d+, R\d+, gdesc", sass), name
        assert ("USETMAXREG" in sass) == wide, f"{name}: setmaxnreg only in the wide kernel"
        assert "UBLKCP" in sass, f"{name} has no bulk copy"
        assert "LDGSTS" in sass and "ARRIVES.LDGSTSBAR" in sass, f"{name}: no cp.async arriving on an mbarrier"
        assert "SYNCS.PHASECHK" in sass, f"{name} waits on no mbarrier"
        assert "LDL" not in sass and "STL" not in sass, f"{name} spills to local memory"
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass, f"{name}: no wgmma left in flight"
        assert ("UCGABAR_WAIT" in sass) != ragged, f"{name}: a cluster barrier (split-K) only where not ragged"
        assert_tile_epilogue(name, sass)


def test_sm90_decode_kernel_uses_tensor_cores(kernel_sass):
    """mma.sync on bf16, no local memory, and the weight stream's loads bypass L1 and fill
    whole 128-byte L2 lines (gemm_decode.cu, ld_stream16): 16 bytes a load, or 8 in the kernels
    fixed to 8-byte loads (CodeLoads::k8, for rows that are only 8-byte aligned), which hold no
    16-byte form."""
    kernels = kernel_sass("sm_90a", r"decode_kernel")
    # T x activation kind x CodeLoads: 18 warp-split kernels, 11 cluster-split ones (T >= 2),
    # and the 7 of T = 1 again for stacks run in one launch (Grid::kStack: warp split, M <= 8)
    # and again for ragged GEMMs (Grid::kRagged)
    flags = {name: re.search(r"ELb([01])ELNS\w*4GridE([012])EE", name).groups() for name in kernels}
    assert len(kernels) == 43, sorted(kernels)
    assert sum(warp == "0" for warp, _ in flags.values()) == 11, sorted(kernels)
    for grid in ("1", "2"):  # stacks, ragged
        own = [name for name, (warp, g) in flags.items() if g == grid]
        assert len(own) == 7 and all("decode_kernelILi1E" in n and flags[n][0] == "1" for n in own)
    for name, sass in kernels.items():
        assert "HMMA.16816.F32.BF16" in sass, f"{name} has no bf16 mma.sync"
        assert "LDL" not in sass and "STL" not in sass, f"{name} spills to local memory"
        if "CodeLoadsE1E" in name:
            assert "LDG.E.NA.LTC128B.64.CONSTANT" in sass, f"{name}: weight loads lost their hints"
            assert "LTC128B.128" not in sass, f"{name} holds 16-byte weight loads"
        else:
            assert "LDG.E.NA.LTC128B.128.CONSTANT" in sass, f"{name}: weight loads lost their hints"


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_activation_pass_moves_16_bytes_per_access(kernel_sass, arch):
    """The passes that apply the epilogue activation where the GEMM library cannot (sm_90a
    prefill, sm_100a; gated ones included) run at the speed of their
    bytes: 16-byte loads and stores in place (8 bf16/f16 or 4 f32 elements), gated 16-byte loads
    of pairs and 8-byte stores of their outputs; the accurate expf/tanhf, no local memory."""
    kernels = kernel_sass(arch, r"activation_in_place_kernel|gated_kernel")
    assert len(kernels) == 6, sorted(kernels)  # both passes: float32, bf16 and f16 outputs
    for name, sass in kernels.items():
        store = "STG.E.64" if "gated" in name else "STG.E.128"  # gated: half as many outputs
        assert "LDG.E.128" in sass and store in sass, f"{name}: no 16-byte loads or {store}"
        assert "MUFU.EX2" in sass, f"{name}: no exponential"
        assert "LDL" not in sass and "STL" not in sass, f"{name} spills to local memory"
