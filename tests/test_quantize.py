"""jax_nvfp4.quantize / dequantize on the default backend (the XLA reference on CPU).

The oracle is `recipe` below: DESIGN.md §2 written independently in float32 NumPy + ml_dtypes
(it imports nothing from the library). On a GPU the same tests exercise the CUDA kernels.
"""

import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_nvfp4
from jax_nvfp4 import NVFP4Array

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
TINY = F32(np.finfo(np.float32).tiny)  # smallest normal float32


def _ftz(a):
    """Flushes float32 subnormals to (signed) zero, as XLA:CPU's arithmetic does."""
    a = np.asarray(a, F32)
    return np.where(np.abs(a) < TINY, np.copysign(F32(0), a), a).astype(F32)


def recipe(x, s_enc=None, *, flush=False):
    """NVFP4 quantization of x [..., K] -> (packed codes uint8 [..., K/2], plain scale bits
    uint8 [..., K/16], s_dec). flush=True emulates flush-to-zero float32 arithmetic."""
    fz = _ftz if flush else (lambda a: np.asarray(a, F32))
    x32 = fz(np.asarray(x).astype(F32))
    with np.errstate(all="ignore"):
        if s_enc is None:
            mag = np.where(np.isfinite(x32), np.abs(x32), F32(0))
            amax = F32(mag.max(initial=F32(0)))
            s = fz(F32(6 * 448) / amax)
            s_enc = F32(1) if (amax == 0 or not np.isfinite(s) or s == 0) else F32(s)
        s_enc = np.asarray(s_enc, F32)
        s_dec = fz(F32(1) / s_enc)
        blocks = x32.reshape(*x32.shape[:-1], x32.shape[-1] // 16, 16)
        lead = s_enc.shape + (1,) * (blocks.ndim - 1 - s_enc.ndim)
        se, sd = s_enc.reshape(lead), s_dec.reshape(lead)
        finite = np.all(np.isfinite(blocks), axis=-1)
        bamax = np.max(np.where(np.isfinite(blocks), np.abs(blocks), F32(0)), axis=-1)
        sb32 = fz(bamax * fz(se * F32(1.0 / 6.0)))
        sb = np.minimum(sb32, F32(448)).astype(ml_dtypes.float8_e4m3fn)
        sb_bits = np.where(finite, sb.view(np.uint8), np.uint8(0x7F))
        sbw = sb_bits.view(ml_dtypes.float8_e4m3fn).astype(F32)
        mult = np.minimum(fz(F32(1) / fz(sbw * sd)), FLT_MAX)
        y = np.clip(fz(blocks * mult[..., None]), F32(-6), F32(6))
        y = np.where(finite[..., None], y, F32(0))
    nib = y.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(x32.shape) & 0xF
    packed = (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)
    return packed, sb_bits.astype(np.uint8), np.asarray(s_dec, F32)


def as_bytes(q: NVFP4Array):
    """(packed codes, plain scale bits, s_dec) of a quantized array, as NumPy."""
    plain = np.asarray(q.plain_scales()).view(np.uint8)
    return np.asarray(q.packed_codes()), plain, np.asarray(q.s_dec)


def assert_same_bytes(q, expected):
    codes, scales, s_dec = as_bytes(q)
    np.testing.assert_array_equal(scales, expected[1], err_msg="block scales differ")
    np.testing.assert_array_equal(codes, expected[0], err_msg="codes differ")
    np.testing.assert_array_equal(s_dec.view(np.uint32), expected[2].view(np.uint32),
                                  err_msg="s_dec differs")


def random(shape, dtype, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(F32) * F32(scale)
    return jnp.asarray(x, dtype)


SHAPES = [(16,), (3, 48), (130, 80), (2, 5, 144), (2, 3, 129, 16), (257, 64)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_random_bytes_match_recipe(shape, dtype):
    x = random(shape, dtype, seed=len(shape))
    q = jax_nvfp4.quantize(x)
    assert q.shape == shape and q.codes.dtype == jnp.float4_e2m1fn
    assert_same_bytes(q, recipe(np.asarray(x)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_heavy_tailed_data(dtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_cauchy((64, 96)) * rng.uniform(1e-3, 1e3, (64, 1))).astype(F32)
    x = jnp.asarray(x, dtype)
    assert_same_bytes(jax_nvfp4.quantize(x), recipe(np.asarray(x)))


def test_exact_e2m1_ties_round_to_even():
    # With s_enc = 1 and a block amax of 6 the block scale is exactly 1, so x*mult == x.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    row = np.array(ties + [-t for t in ties], F32)
    q = jax_nvfp4.quantize(jnp.asarray(row[None]), s_enc=1.0)
    expected_codes = [0, 2, 2, 4, 4, 6, 6, 7]  # 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2, ...
    nib = np.asarray(jax.lax.bitcast_convert_type(q.codes, jnp.uint4)).astype(np.uint8)[0]
    np.testing.assert_array_equal(nib, expected_codes + [c | 8 for c in expected_codes])
    assert_same_bytes(q, recipe(row[None], F32(1)))


def test_signed_zero_codes():
    x = np.zeros((1, 32), F32)
    x[0, :16] = 6.0
    x[0, 1] = -1e-3  # rounds to zero, keeps its sign
    x[0, 16] = -0.0
    x[0, 17] = -0.1
    x[0, 31] = 6.0
    q = jax_nvfp4.quantize(jnp.asarray(x), s_enc=1.0)
    nib = np.asarray(jax.lax.bitcast_convert_type(q.codes, jnp.uint4)).astype(np.uint8)[0]
    assert nib[1] == 0x8 and nib[16] == 0x8 and nib[17] == 0x8 and nib[18] == 0x0
    assert_same_bytes(q, recipe(x, F32(1)))


def test_e4m3_subnormal_block_scales():
    rng = np.random.default_rng(3)
    amax = np.exp2(rng.uniform(-13, -6, (64, 1))).astype(F32) * F32(6)  # sb in E4M3 subnormals
    x = (rng.uniform(-1, 1, (64, 32)) * amax).astype(F32)
    q = jax_nvfp4.quantize(jnp.asarray(x), s_enc=1.0)
    _, scales, _ = as_bytes(q)
    assert np.any((scales & 0x78) == 0) and np.any(scales > 0)  # exponent field 0: subnormal
    assert_same_bytes(q, recipe(x, F32(1)))


def test_saturation_at_448_and_6():
    x = random((8, 64), jnp.float32, seed=5)
    q = jax_nvfp4.quantize(x, s_enc=1e4)
    codes, scales, _ = as_bytes(q)
    assert np.all(scales == 0x7E)  # 448
    assert np.any((codes & 0x7) == 0x7)
    assert_same_bytes(q, recipe(np.asarray(x), F32(1e4)))


def test_zero_blocks_and_zero_tensor():
    x = np.array(random((4, 64), jnp.float32, seed=1))
    x[1, 16:32] = 0.0
    x[2] = -0.0
    assert_same_bytes(jax_nvfp4.quantize(jnp.asarray(x)), recipe(x))
    z = jnp.zeros((3, 32), jnp.bfloat16)
    q = jax_nvfp4.quantize(z)
    assert float(q.s_dec) == 1.0
    assert_same_bytes(q, recipe(np.asarray(z)))
    np.testing.assert_array_equal(np.asarray(jax_nvfp4.dequantize(q, jnp.float32)), 0)


@pytest.mark.parametrize("shape", [(0, 32), (2, 0, 48)])
def test_empty_tensor(shape):
    """No elements: amax 0, so S_enc = 1 as for an all-zero tensor; W4A4 gives an empty product."""
    q = jax_nvfp4.quantize(jnp.zeros(shape, jnp.bfloat16))
    assert q.shape == shape and float(q.s_dec) == 1.0
    assert jax_nvfp4.dequantize(q).shape == shape
    w = jax_nvfp4.quantize(random((16, shape[-1]), jnp.float32, seed=3))
    assert jax_nvfp4.matmul(q, w).shape == shape[:-1] + (16,)
    y = jax_nvfp4.matmul(q, w, out_s_enc=1.0)
    assert y.shape == shape[:-1] + (16,) and float(y.s_dec) == 1.0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_huge_magnitudes(dtype):
    x = random((4, 32), jnp.float32, seed=2, scale=1e37)
    x = x.at[0, 0].set(3.0e38)
    x = jnp.asarray(x, dtype)
    assert_same_bytes(jax_nvfp4.quantize(x), recipe(np.asarray(x)))


def test_small_normal_magnitudes():
    # amax ~1e-30: S_enc ~1e33 stays finite and every intermediate stays normal.
    x = random((4, 48), jnp.float32, seed=4, scale=1e-30)
    assert_same_bytes(jax_nvfp4.quantize(x), recipe(np.asarray(x)))


def test_subnormal_inputs_follow_flush_to_zero_on_cpu(request):
    """XLA:CPU flushes float32 subnormals (inputs and results) to zero; the CUDA kernels keep
    them. Documented in docs/quantize.md; the CPU path equals the recipe with flushing."""
    if jax.default_backend() != "cpu":
        pytest.skip("flush-to-zero is the CPU backend's behaviour")
    x = np.array(random((2, 32), jnp.float32, seed=9, scale=1e-34))
    x[1, :16] = np.float32(3e-39) * np.sign(x[1, :16])  # a block of subnormals
    expected = recipe(x, flush=True)
    assert_same_bytes(jax_nvfp4.quantize(jnp.asarray(x)), expected)
    assert np.any(recipe(x)[1] != expected[1])  # the case really differs without flushing


def test_given_scalar_s_enc():
    x = random((3, 5, 32), jnp.bfloat16, seed=11)
    q = jax_nvfp4.quantize(x, s_enc=jnp.float32(37.5))
    assert q.s_dec.shape == ()
    assert_same_bytes(q, recipe(np.asarray(x), F32(37.5)))


@pytest.mark.parametrize("groups_ndim", [1, 2])
def test_given_per_group_s_enc(groups_ndim):
    x = random((3, 4, 5, 32), jnp.float16, seed=12)
    s_enc = np.random.default_rng(1).uniform(10, 500, x.shape[:groups_ndim]).astype(F32)
    q = jax_nvfp4.quantize(x, s_enc=s_enc)
    assert q.s_dec.shape == x.shape[:groups_ndim]
    assert_same_bytes(q, recipe(np.asarray(x), s_enc))
    back = jax_nvfp4.dequantize(q, jnp.float32)
    expand = (Ellipsis,) + (None,) * (x.ndim - groups_ndim)
    np.testing.assert_allclose(np.asarray(back), np.asarray(x, F32), rtol=0.3,
                               atol=float(np.max(np.abs(np.asarray(x, F32)))) / 6)
    assert np.all(np.isfinite(np.asarray(back))) and back.shape == x.shape
    # each group's values scaled by its own s_dec: e2m1 * e4m3 exact, one float32 rounding
    blocks = np.asarray(q.codes).astype(np.float64).reshape(*x.shape[:-1], -1, 16)
    values = blocks * np.asarray(q.plain_scales()).astype(np.float64)[..., None]
    want = values.reshape(x.shape) * np.asarray(q.s_dec, np.float64)[expand]
    np.testing.assert_array_equal(np.asarray(back), want.astype(F32))


def test_nan_and_inf_poison_only_their_blocks():
    x = np.array(random((4, 64), jnp.float32, seed=13))
    x[0, 3] = np.nan
    x[2, 40] = np.inf
    x[3, 63] = -np.inf
    q = jax_nvfp4.quantize(jnp.asarray(x))
    assert_same_bytes(q, recipe(x))
    back = np.asarray(jax_nvfp4.dequantize(q, jnp.float32))
    nan_blocks = np.isnan(back).reshape(4, 4, 16).all(-1)
    expected = np.zeros((4, 4), bool)
    expected[0, 0] = expected[2, 2] = expected[3, 3] = True
    np.testing.assert_array_equal(nan_blocks, expected)
    assert not np.isnan(back.reshape(4, 4, 16)[~expected]).any()
    # amax ignores the non-finite values
    clean = np.where(np.isfinite(x), x, 0)
    assert float(q.s_dec) == float(recipe(clean)[2])


def test_dequantize_values_and_dtypes():
    x = random((5, 48), jnp.float32, seed=14)
    q = jax_nvfp4.quantize(x)
    codes = np.asarray(q.codes).astype(F32)
    sb = np.asarray(q.plain_scales()).astype(F32)
    ref = (codes.reshape(5, 3, 16) * sb[..., None]).reshape(5, 48) * np.asarray(q.s_dec)
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        out = jax_nvfp4.dequantize(q, dtype)
        assert out.dtype == dtype and out.shape == (5, 48)
        np.testing.assert_array_equal(np.asarray(out), ref.astype(dtype))
    err = np.linalg.norm(np.asarray(q.dequantize(jnp.float32)) - np.asarray(x)) / np.linalg.norm(x)
    assert err < 0.12  # NVFP4 of Gaussian data: ~0.1 relative error


def test_jit_matches_eager():
    x = random((33, 64), jnp.bfloat16, seed=15)
    eager = jax_nvfp4.quantize(x)
    jitted = jax.jit(jax_nvfp4.quantize)(x)
    assert_same_bytes(jitted, as_bytes(eager))
    d = jax.jit(lambda q: jax_nvfp4.dequantize(q, jnp.float32))(jitted)
    np.testing.assert_array_equal(np.asarray(d), np.asarray(eager.dequantize(jnp.float32)))


@pytest.mark.parametrize("shape", [(3, 32), (3, 4, 48)])
def test_vmap_has_per_example_amax(shape):
    per_example = jnp.arange(1, shape[0] + 1, dtype=jnp.float32)
    x = random(shape, jnp.float32, seed=16) * per_example.reshape((-1,) + (1,) * (len(shape) - 1))
    qs = jax.vmap(jax_nvfp4.quantize)(x)
    for i in range(shape[0]):
        assert_same_bytes(jax.tree.map(lambda a: a[i], qs), recipe(np.asarray(x[i])))
    back = jax.vmap(lambda q: jax_nvfp4.dequantize(q, jnp.float32))(qs)
    for i in range(shape[0]):
        one = jax.tree.map(lambda a: a[i], qs)
        np.testing.assert_array_equal(np.asarray(back[i]),
                                      np.asarray(jax_nvfp4.dequantize(one, jnp.float32)))


def test_vmap_with_given_s_enc():
    x = random((2, 8, 32), jnp.bfloat16, seed=17)
    s = jnp.array([3.0, 50.0], jnp.float32)
    qs = jax.vmap(lambda a, s: jax_nvfp4.quantize(a, s_enc=s))(x, s)
    for i in range(2):
        assert_same_bytes(jax.tree.map(lambda a: a[i], qs), recipe(np.asarray(x[i]), F32(s[i])))


def test_pytree_round_trip():
    q = jax_nvfp4.quantize(random((4, 32), jnp.float32, seed=18))
    leaves, treedef = jax.tree_util.tree_flatten(q)
    assert len(leaves) == 3
    q2 = jax.tree_util.tree_unflatten(treedef, leaves)
    assert isinstance(q2, NVFP4Array)
    assert_same_bytes(q2, as_bytes(q))
    q3 = jax.device_put(q)
    assert_same_bytes(q3, as_bytes(q))


@pytest.mark.parametrize("bad, match", [
    (jnp.zeros((4, 24), jnp.float32), r"contracting \(last\) dimension 24"),
    (jnp.zeros((), jnp.float32), "rank >= 1"),
    (jnp.zeros((4, 32), jnp.int32), "got int32"),
    (jnp.zeros((4, 32), jnp.float8_e4m3fn), "got float8_e4m3fn"),
])
def test_quantize_rejects_bad_input(bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        jax_nvfp4.quantize(bad)


def test_dequantize_dtype_none_is_named():
    with pytest.raises(TypeError, match="dequantize: dtype must be float32, bfloat16 or float16, got None"):
        jax_nvfp4.dequantize(jax_nvfp4.quantize(jnp.ones((2, 16))), None)


def test_quantize_takes_numpy_float64_as_jax_does():
    """A NumPy float64 array is float32 to JAX unless x64 is on, as matmul's x is."""
    x = np.random.default_rng(3).standard_normal((4, 32))
    assert_same_bytes(jax_nvfp4.quantize(x), recipe(x.astype(np.float32)))


def test_quantize_takes_nested_lists():
    rows = [[0.5 * (i - j) for i in range(32)] for j in range(3)]
    assert_same_bytes(jax_nvfp4.quantize(rows), recipe(np.asarray(rows, np.float32)))


@pytest.mark.parametrize("s_enc", ["2", True, 1 + 1j, 10**400, object(), [True, False],
                                   jnp.bool_(True), jnp.ones((2,), jnp.complex64)],
                         ids=["str", "bool", "complex", "huge_int", "object", "bool_list",
                              "jax_bool", "jax_complex"])
def test_quantize_rejects_s_enc_that_is_not_a_real_number(s_enc):
    with pytest.raises(TypeError, match="quantize: s_enc must be a real number or float array"):
        jax_nvfp4.quantize(jnp.ones((2, 16)), s_enc=s_enc)


def test_quantize_rejects_bad_s_enc_shape():
    with pytest.raises(ValueError, match=r"s_enc of shape \(3,\)"):
        jax_nvfp4.quantize(jnp.zeros((4, 32)), s_enc=jnp.ones((3,)))
    with pytest.raises(ValueError, match=r"s_enc of shape \(4,\)"):  # one per row: not a group
        jax_nvfp4.quantize(jnp.zeros((4, 32)), s_enc=jnp.ones((4,)))


@pytest.mark.parametrize("s_enc, shown", [
    (0.0, "0.0"), (-2.0, "-2.0"), (float("inf"), "inf"), (float("nan"), "nan"),
    (np.array([3.0, -1.0], F32), r"-1.0 \(in an array of shape \(2,\)\)"),
    ([2.0, -1.0], r"-1.0 \(in an array of shape \(2,\)\)"), ((0.0, 1.0), "0.0")])
def test_quantize_rejects_host_s_enc_not_finite_positive(s_enc, shown):
    with pytest.raises(ValueError, match=f"s_enc must be finite and positive, got {shown}"):
        jax_nvfp4.quantize(jnp.zeros((2, 4, 32)), s_enc=s_enc)


@pytest.mark.parametrize("s_enc", [1e39, np.float64(1e-50), 1e-39])
def test_quantize_rejects_host_s_enc_that_float32_makes_useless(s_enc):
    # 1e39 rounds to inf in float32, 1e-50 to 0, and 1e-39 (a float32 subnormal) has no finite
    # float32 reciprocal: quantizing would give all zeros or NaN.
    with pytest.raises(ValueError, match="used as a float32 whose reciprocal"):
        jax_nvfp4.quantize(jnp.ones((2, 32)), s_enc=s_enc)


def test_a_quantized_array_is_refused_where_a_float_one_is_expected():
    q = jax_nvfp4.quantize(jnp.ones((4, 32)))
    with pytest.raises(TypeError, match=r"quantize: x must be a float array, got an NVFP4Array of shape \(4, 32\)"):
        jax_nvfp4.quantize(q)
    with pytest.raises(TypeError, match="quantize_conv_weight: w_hwio must be a float array"):
        jax_nvfp4.quantize_conv_weight(q)


def test_quantize_takes_traced_s_enc_unchecked():
    # A traced scale is not read back at trace time (no host sync); jit still compiles.
    q = jax.jit(lambda s: jax_nvfp4.quantize(jnp.ones((4, 32)), s_enc=s))(F32(2.0))
    assert_same_bytes(q, recipe(np.ones((4, 32), F32), F32(2.0)))


def test_dequantize_rejects_bad_input():
    with pytest.raises(TypeError, match="expects an NVFP4Array, got ndarray"):
        jax_nvfp4.dequantize(np.zeros((4, 32)))
    q = jax_nvfp4.quantize(jnp.ones((4, 32)))
    with pytest.raises(TypeError, match="got int8"):
        jax_nvfp4.dequantize(q, jnp.int8)
    bad = NVFP4Array(q.codes, q.scales[..., :2, :], q.s_dec)
    with pytest.raises(ValueError, match="need tiled scales"):
        jax_nvfp4.dequantize(bad)


def _e2m1_probe_values():
    """Every rounding boundary of E2M1 and its float32 neighbours, both signs, subnormals,
    infinities, and random floats across the binades around [0, 8]."""
    bounds = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8],
                      F32)
    near = [np.nextafter(bounds, F32(-1)), bounds, np.nextafter(bounds, F32(10))]
    special = np.array([np.inf, 1e-45, 3e-39, TINY, 1e30, FLT_MAX], F32)
    rng = np.random.default_rng(0)
    bits = rng.integers(0x30000000, 0x41200000, 200_000, dtype=np.uint32)  # ~5e-10 .. 10
    vals = np.concatenate(near + [special, bits.view(F32)]).astype(F32)
    return np.concatenate([vals, -vals])


def test_software_e2m1_encoder_matches_ml_dtypes(host_program, tmp_path):
    """The sm_90a kernels' E2M1 rounding (cuda/quantize/nvfp4_encode.h), run on the host."""
    values = _e2m1_probe_values()
    values = np.concatenate([values, np.zeros(-values.size % 8, F32)])
    path = tmp_path / "values.bin"
    values.tofile(path)
    out = host_program(Path(__file__).parent / "host" / "e2m1_encode.cc", args=[path])
    expected = np.clip(values, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    lines = out.split()
    assert len(lines) == 2
    for encoder, line in zip(("scalar", "packed"), lines):
        got = np.array([int(c, 16) for c in line], np.uint8)
        assert got.size == values.size, encoder
        mismatch = np.flatnonzero(got != expected)
        assert mismatch.size == 0, (encoder, [(float(values[i]), int(got[i]), int(expected[i]))
                                              for i in mismatch[:10]])


def test_selftest_checks_pass_on_the_reference_and_catch_a_broken_op(monkeypatch):
    from jax_nvfp4 import quantization

    selftest_module = importlib.import_module("jax_nvfp4.selftest")  # the attribute is the function

    cpu = jax.devices("cpu")[0]
    assert "bytes equal" in selftest_module.check_quantize(cpu)
    assert "values equal" in selftest_module.check_dequantize(cpu)
    assert "worst relative error" in selftest_module.check_matmul_activation(cpu)
    assert "worst relative error" in selftest_module.check_matmul_stacked(cpu)
    assert "worst relative error" in selftest_module.check_ragged_matmul(cpu)
    real = quantization.quantize

    def off_by_one_scale(x, *, s_enc=None):
        q = real(x, s_enc=s_enc)
        return NVFP4Array(q.codes, q.scales, q.s_dec * 2)

    monkeypatch.setattr(quantization, "quantize", off_by_one_scale)
    with pytest.raises(AssertionError, match="s_dec differ"):
        selftest_module.check_quantize(cpu)


def test_selftest_reports_every_registered_check(monkeypatch, capsys):
    selftest_module = importlib.import_module("jax_nvfp4.selftest")
    monkeypatch.setattr(selftest_module, "CHECKS", list(selftest_module.CHECKS))
    selftest_module.register_check("extra", "jax_nvfp4_extra", lambda device: "ok")
    results = jax_nvfp4.selftest()
    assert [r.name for r in results][:2] == ["quantize", "dequantize"]
    assert results[-1].name == "extra" and len(results) == len(selftest_module.CHECKS)
    assert all(r.ok for r in results)
    if not any(d.platform == "gpu" for d in jax.devices()):
        assert {r.status for r in results} == {"no GPU"}
        assert "only the pure-JAX reference path exists" in capsys.readouterr().out


@pytest.fixture
def selftest_with_only_new_checks(monkeypatch):
    """The selftest module with no checks registered, run as if on a GPU with every kernel built
    (the CPU device stands in): the checks a test registers run and are reported."""
    selftest_module = importlib.import_module("jax_nvfp4.selftest")
    monkeypatch.setattr(selftest_module, "CHECKS", [])
    monkeypatch.setattr(selftest_module, "_gpu", lambda: jax.devices("cpu")[0])
    monkeypatch.setattr(selftest_module._extension, "kernel_available", lambda target: True)
    return selftest_module


def test_selftest_reports_a_check_that_raises_and_runs_the_rest(selftest_with_only_new_checks,
                                                                 capsys):
    """A kernel that errors out (an XlaRuntimeError, say) is a failed check in the report, not an
    exception that hides every other check's result."""
    selftest_module = selftest_with_only_new_checks

    def crashes(device):
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access")

    selftest_module.register_check("crashes", "jax_nvfp4_crashes", crashes)
    selftest_module.register_check("fine", "jax_nvfp4_fine", lambda device: "ok")
    results = jax_nvfp4.selftest()
    assert [(r.name, r.status, r.ok) for r in results] == [("crashes", "failed", False),
                                                            ("fine", "passed", True)]
    assert results[0].detail == "RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access"
    assert "crashes" in capsys.readouterr().out


def test_selftest_quiet_and_the_cli_exit_status_of_a_failed_check(selftest_with_only_new_checks,
                                                                   capsys):
    """verbose=False prints nothing; `python -m jax_nvfp4 selftest` exits 1 when a check fails,
    so scripts and CI can gate on it."""
    from jax_nvfp4.__main__ import main

    selftest_module = selftest_with_only_new_checks

    def wrong(device):
        raise AssertionError("codes differ")

    selftest_module.register_check("wrong", "jax_nvfp4_wrong", wrong)
    capsys.readouterr()
    results = jax_nvfp4.selftest(verbose=False)
    assert [(r.name, r.status, r.detail) for r in results] == [("wrong", "failed", "codes differ")]
    assert capsys.readouterr().out == ""
    assert main(["selftest"]) == 1
    assert "wrong" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([])  # a subcommand is required


def test_cli_demo_and_selftest(capsys):
    from jax_nvfp4.__main__ import main

    assert main(["selftest"]) == 0
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for expected in ("== selftest", "gate_proj", "down_proj", "rel Frobenius", "x smaller"):
        assert expected in out
    with pytest.raises(SystemExit):
        main(["nonsense"])


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_kernel_sass(kernel_sass, arch):
    """sm_100a rounds with the FP4 convert; sm_90a has none and rounds in software; both move
    16-byte vectors, and dequantize loads its codes in words of 8 (bf16/f16 out) or 4 (f32)."""
    from jax_nvfp4 import _extension

    if _extension.extension_path() is not None and arch not in _extension.cuda_archs():
        pytest.skip(f"extension built without {arch}")
    for name, sass in kernel_sass(arch, r"15quantize_kernel").items():
        assert "LDG.E.128" in sass, name
        assert ("F2FP.SATFINITE.E2M1.F32" in sass) == (arch == "sm_100a"), name
    for name, sass in kernel_sass(arch, r"17dequantize_kernel").items():
        assert "STG.E.128" in sass, name
        assert ("LDG.E.U16" in sass) == ("kernelIf" in name), name


def test_fast_divide_matches_integer_division(host_program):
    """The multiply-shift division the kernels use to locate scale tiles."""
    mismatches, checks = map(int, host_program(
        Path(__file__).parent / "host" / "fast_divide.cc").split())
    assert checks > 1_000_000 and mismatches == 0
