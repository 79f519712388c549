"""NVFP4Array: pytree behaviour, the tiled scale layout (DESIGN.md §3), conversions, validation."""

import itertools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_nvfp4 import NVFP4Array, format as fmt


def _tiled_by_formula(plain, rows, k_blocks):
    """DESIGN.md §3 directly: element [rt, kt, i, j, l] scales row rt*128 + j*32 + i and
    block kt*4 + l; entries outside the matrix are zero."""
    rt_n, kt_n = -(-rows // 128), -(-k_blocks // 4)
    out = np.zeros((rt_n, kt_n, 32, 4, 4), plain.dtype)
    for rt, kt, i, j, l in itertools.product(range(rt_n), range(kt_n), range(32), range(4),
                                             range(4)):
        r, kb = rt * 128 + j * 32 + i, kt * 4 + l
        if r < rows and kb < k_blocks:
            out[rt, kt, i, j, l] = plain[r, kb]
    return out


@pytest.mark.parametrize("rows, k_blocks", [(1, 1), (5, 3), (128, 4), (130, 9), (257, 8)])
def test_plain_to_tiled_matches_formula(rows, k_blocks):
    plain = np.random.default_rng(rows).integers(1, 255, (rows, k_blocks)).astype(np.uint8)
    tiled = fmt.plain_to_tiled(plain)
    np.testing.assert_array_equal(tiled, _tiled_by_formula(plain, rows, k_blocks))
    np.testing.assert_array_equal(fmt.tiled_to_plain(tiled, rows, k_blocks), plain)
    # jax arrays take the same path
    np.testing.assert_array_equal(np.asarray(fmt.plain_to_tiled(jnp.asarray(plain))), tiled)


def test_tiled_bytes_offsets():
    """Row-major bytes: offset ((rt*KT + kt)*512 + i*16 + j*4 + l), as CUTLASS reads them."""
    rows, k_blocks = 200, 6
    plain = np.arange(rows * k_blocks, dtype=np.uint32).reshape(rows, k_blocks)
    flat = fmt.plain_to_tiled(plain).reshape(-1)
    kt_n = 2
    for r, kb in [(0, 0), (1, 0), (31, 3), (32, 0), (127, 5), (128, 4), (199, 5)]:
        rt, rr, kt, l = r // 128, r % 128, kb // 4, kb % 4
        off = (rt * kt_n + kt) * 512 + (rr % 32) * 16 + (rr // 32) * 4 + l
        assert flat[off] == plain[r, kb]


def test_batched_layout_and_shape():
    assert fmt.tiled_scales_shape((3, 130, 80)) == (3, 2, 2, 32, 4, 4)
    assert fmt.tiled_scales_shape((48,)) == (1, 1, 32, 4, 4)
    plain = np.random.default_rng(0).integers(0, 255, (2, 3, 130, 5)).astype(np.uint8)
    tiled = fmt.plain_to_tiled(plain)
    assert tiled.shape == (2, 3, 2, 2, 32, 4, 4)
    np.testing.assert_array_equal(tiled[1, 2], fmt.plain_to_tiled(plain[1, 2]))


def _example(shape=(130, 48), seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, shape).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    scales = rng.integers(0, 0x7F, shape[:-1] + (shape[-1] // 16,)).astype(np.uint8)
    return codes, scales.view(ml_dtypes.float8_e4m3fn), np.float32(0.25)


def test_from_plain_scales_round_trip_numpy_and_jax():
    codes, scales, s_dec = _example()
    q = NVFP4Array.from_plain_scales(codes, scales, s_dec)
    assert q.shape == (130, 48) and q.ndim == 2 and q.size == 130 * 48
    assert q.scales.shape == (2, 1, 32, 4, 4)
    np.testing.assert_array_equal(q.plain_scales().view(np.uint8), scales.view(np.uint8))
    qj = NVFP4Array.from_plain_scales(jnp.asarray(codes), jnp.asarray(scales), s_dec)
    np.testing.assert_array_equal(np.asarray(qj.scales).view(np.uint8),
                                  q.scales.view(np.uint8))
    assert q.nbytes == 130 * 48 // 2 + 2 * 512 + 4


@pytest.mark.parametrize("scales_shape", [(130, 2), (129, 3), (3, 130), (390,)])
def test_from_plain_scales_rejects_scales_of_another_shape(scales_shape):
    """A mismatch inside one scale tile would pass the tiled shape check and zero the data."""
    codes, _, s_dec = _example()
    scales = np.zeros(scales_shape, ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"codes of shape \(130, 48\) need plain scales of shape "
                                         r"\(130, 3\), got " + re.escape(str(scales_shape))):
        NVFP4Array.from_plain_scales(codes, scales, s_dec)
    packed = NVFP4Array.from_plain_scales(codes, _example()[1], s_dec).packed_codes()
    with pytest.raises(ValueError, match="need plain scales"):
        NVFP4Array.from_packed(packed[:129], _example()[1], s_dec)


def test_from_plain_scales_and_from_packed_reject_other_dtypes():
    """Raw scale bytes (uint8) or float scales would be converted by value, not reinterpreted;
    signed packed bytes would carry their sign bit into the high nibble's neighbours."""
    codes, scales, s_dec = _example()
    for other in (scales.view(np.uint8), scales.astype(np.float32)):
        with pytest.raises(TypeError, match=f"scales must be float8_e4m3fn, got {other.dtype}"):
            NVFP4Array.from_plain_scales(codes, other, s_dec)
    packed = NVFP4Array.from_plain_scales(codes, scales, s_dec).packed_codes()
    with pytest.raises(TypeError, match="packed codes must be uint8, got int8"):
        NVFP4Array.from_packed(packed.view(np.int8), scales, s_dec)
    # lists have no dtype to check: refused by name, not an AttributeError
    with pytest.raises(TypeError, match="scales must be a NumPy or JAX array of float8_e4m3fn, got list"):
        NVFP4Array.from_plain_scales(codes, scales.tolist(), s_dec)
    with pytest.raises(TypeError, match="codes must be a NumPy or JAX array of float4_e2m1fn, got list"):
        NVFP4Array.from_plain_scales(codes.tolist(), scales, s_dec)
    with pytest.raises(TypeError, match="packed codes must be a NumPy or JAX array of uint8, got list"):
        NVFP4Array.from_packed(packed.tolist(), scales, s_dec)


@pytest.mark.parametrize("to", [np.asarray, jnp.asarray], ids=["numpy", "jax"])
def test_from_packed_with_no_rows(to):
    q = NVFP4Array.from_packed(to(np.zeros((0, 24), np.uint8)),
                               to(np.zeros((0, 3), ml_dtypes.float8_e4m3fn)), np.float32(1))
    assert q.shape == (0, 48)


def test_validate_names_a_field_that_is_not_an_array():
    q = NVFP4Array.from_plain_scales(*_example())
    with pytest.raises(TypeError, match=r"NVFP4Array.s_dec must be an array, got float"):
        NVFP4Array(q.codes, q.scales, 1.0).validate()


def test_rank1_arrays_have_one_row():
    codes, scales, s_dec = _example((64,))
    q = NVFP4Array.from_plain_scales(codes, scales, s_dec)
    assert q.scales.shape == (1, 1, 32, 4, 4)
    np.testing.assert_array_equal(q.plain_scales().view(np.uint8), scales.view(np.uint8))


def test_packed_codes_low_nibble_first():
    codes = np.array([[1, 2, 15, 8] * 8], np.uint8).view(ml_dtypes.float4_e2m1fn)
    scales = np.ones((1, 2), ml_dtypes.float8_e4m3fn)
    q = NVFP4Array.from_plain_scales(codes, scales, np.float32(1))
    np.testing.assert_array_equal(q.packed_codes()[0, :2], [0x21, 0x8F])
    qj = NVFP4Array.from_plain_scales(jnp.asarray(codes), jnp.asarray(scales), 1.0)
    np.testing.assert_array_equal(np.asarray(qj.packed_codes()), q.packed_codes())
    back = NVFP4Array.from_packed(q.packed_codes(), scales, np.float32(1))
    np.testing.assert_array_equal(back.codes.view(np.uint8), codes.view(np.uint8))
    back_j = NVFP4Array.from_packed(jnp.asarray(q.packed_codes()), jnp.asarray(scales), 1.0)
    np.testing.assert_array_equal(np.asarray(back_j.codes).astype(np.float32),
                                  codes.astype(np.float32))


def test_pytree_and_to_numpy():
    q = NVFP4Array.from_plain_scales(*[jnp.asarray(a) for a in _example()])
    leaves, treedef = jax.tree_util.tree_flatten(q)
    assert [leaf.dtype for leaf in leaves] == [jnp.float4_e2m1fn, jnp.float8_e4m3fn, jnp.float32]
    assert isinstance(jax.tree_util.tree_unflatten(treedef, leaves), NVFP4Array)
    doubled = jax.jit(lambda q: NVFP4Array(q.codes, q.scales, q.s_dec * 2))(q)
    assert float(doubled.s_dec) == 0.5
    host = q.to_numpy()
    assert isinstance(host.codes, np.ndarray) and host.codes.dtype == ml_dtypes.float4_e2m1fn
    stacked = jax.vmap(lambda s: NVFP4Array(q.codes, q.scales, s))(jnp.ones((3,), jnp.float32))
    assert stacked.codes.shape == (3, 130, 48) and stacked.s_dec.shape == (3,)


@pytest.mark.parametrize("convert", [np.asarray, jnp.asarray, lambda q: jnp.ones((48,)) @ q],
                         ids=["np.asarray", "jnp.asarray", "jnp matmul"])
def test_an_nvfp4_array_is_not_taken_for_a_float_array(convert):
    # NumPy would otherwise wrap it in a 0-d object array, silently.
    q = NVFP4Array.from_plain_scales(*[jnp.asarray(a) for a in _example()])
    with pytest.raises(TypeError, match=r"NVFP4Array is not a (NumPy|JAX) array: read its values "
                                        r"with q.dequantize"):
        convert(q)


def test_trees_of_shapes_compare_by_value():
    # The dataclass's field-wise equality: trees of shapes (jax.tree.map(jnp.shape, params))
    # compare as users expect; between arrays, as for jax arrays, there is no single truth value.
    q = NVFP4Array.from_plain_scales(*[jnp.asarray(a) for a in _example()])
    assert jax.tree.map(jnp.shape, q) == jax.tree.map(jnp.shape, NVFP4Array(q.codes, q.scales, q.s_dec))
    assert jax.tree.map(jnp.shape, q) != jax.tree.map(jnp.shape, NVFP4Array(q.codes, q.scales,
                                                                           q.s_dec[None]))
    assert hash(jax.tree.map(jnp.shape, q)) == hash(jax.tree.map(jnp.shape, q))


@pytest.mark.parametrize("host", [False, True], ids=["jax", "numpy"])
def test_comparing_nvfp4_arrays_of_arrays_names_what_to_compare(host):
    q = NVFP4Array.from_plain_scales(*[jnp.asarray(a) for a in _example()])
    q = q.to_numpy() if host else q
    with pytest.raises(TypeError, match=r"NVFP4Array == NVFP4Array is not defined for arrays: "
                                        r"compare the fields"):
        q == NVFP4Array(q.codes, q.scales, q.s_dec)  # noqa: B015
    assert (q == "q") is False


def test_export_serializes_functions_taking_and_returning_nvfp4_arrays():
    pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers (in "
                        "the test extra)")
    from jax import export

    import jax_nvfp4 as jn

    w = jn.quantize(jax.random.normal(jax.random.key(0), (32, 64)))
    x = jax.random.normal(jax.random.key(1), (5, 64))
    f = jax.jit(lambda a, b: (jn.matmul(a, b), jn.quantize(a)))
    # On a GPU with the extension the program holds our FFI calls (no compatibility guarantee:
    # JAX serializes them only when asked, README "What runs where").
    targets = ("jax_nvfp4_gemm", "jax_nvfp4_gemm_nvfp4_out", "jax_nvfp4_gemm_stacked",
               "jax_nvfp4_gemm_nvfp4_out_stacked", "jax_nvfp4_quantize", "jax_nvfp4_dequantize",
               "jax_nvfp4_conv")
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in targets]
    restored = export.deserialize(export.export(f, disabled_checks=checks)(x, w).serialize())
    got, want = restored.call(x, w), f(x, w)
    assert isinstance(got[1], NVFP4Array)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.parametrize("mutate, error, match", [
    (lambda c, s, d: (c.astype(np.float32), s, d), TypeError, "codes must be float4_e2m1fn"),
    (lambda c, s, d: (c, s.astype(np.float32), d), TypeError, "scales must be float8_e4m3fn"),
    (lambda c, s, d: (c, s, np.float16(1)), TypeError, "s_dec must be float32"),
    (lambda c, s, d: (c, s[:1], d), ValueError, r"need tiled scales \(2, 1, 32, 4, 4\)"),
    (lambda c, s, d: (c, s, np.ones((2,), np.float32)), ValueError, "s_dec has shape"),
])
def test_validate_names_the_problem(mutate, error, match):
    codes, scales, s_dec = _example()
    tiled = fmt.plain_to_tiled(scales)
    with pytest.raises(error, match=match):
        NVFP4Array(*mutate(codes, tiled, s_dec)).validate()


def test_bad_contracting_dim():
    with pytest.raises(ValueError, match=r"contracting \(last\) dimension 40"):
        fmt.check_logical_shape((3, 40), "x")
