"""jax_nvfp4.ragged_matmul (grouped NVFP4 GEMM, lax.ragged_dot's semantics) against a float64
NumPy oracle that multiplies each group's rows by its dequantized weights.

On a CPU the primitive lowers to the reference; on an H100/H200 to the ragged kernels (the launcher
picks the decode or the fused_ws kernel), so the same cases test whichever runs.
The GPU-only tests at the end force each CUDA path and check the kernel is the one called."""

import importlib.util
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import jax_nvfp4 as jn
from jax_nvfp4 import _extension
from jax_nvfp4.primitives._base import ffi_kernel_call
from jax_nvfp4.primitives.ragged import RAGGED_PATH_ENV, RAGGED_TARGET, ragged_matmul_p
from jax_nvfp4.reference import activation as reference_activation

_spec = importlib.util.spec_from_file_location("matmul_cases", Path(__file__).parent / "matmul_cases.py")
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def segments(sizes, m, first_row=0):
    """[(group, first row, end row)] by the documented rule: group 0 from first_row, negative sizes
    count as 0, rows past m are dropped."""
    out, row = [], first_row
    for g, s in enumerate(sizes):
        end = min(row + max(int(s), 0), m)
        out.append((g, row, end))
        row = end
    return out


def oracle(x, w, sizes, bias=None, activation="none", first_row=0):
    """float64: each group's rows times its dequantized weights (+ bias), the activation, zeros on
    the rows of no group."""
    xs = (mc.nvfp4_to_f64(x) if isinstance(x, jn.NVFP4Array) else
          np.asarray(jnp.asarray(x, jnp.float32), np.float64))
    ws = mc.nvfp4_to_f64(w)  # decoded in NumPy, not by the library the test checks
    m, n = xs.shape[0], ws.shape[1]
    z = np.zeros((m, n))
    held = np.zeros(m, bool)
    for g, lo, hi in segments(sizes, m, first_row):
        z[lo:hi] = xs[lo:hi] @ ws[g].T + (0.0 if bias is None else np.asarray(bias[g], np.float64))
        held[lo:hi] = True
    y = mc.activation_f64(z, None if activation == "none" else activation)
    y[~held] = 0.0
    return y


def rel_err(got, want):
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def weights(key, groups, n, k, scale=1.0):
    """G experts, each quantized with its own S_enc (s_dec [G]); magnitudes differ by group."""
    w = jax.random.normal(key, (groups, n, k), jnp.float32)
    w = w * (scale * 2.0 ** jnp.arange(groups, dtype=jnp.float32))[:, None, None]
    return jax.vmap(jn.quantize)(w)


CASES = [  # (M, G, N, K, sizes): tails in every dim, empty groups, rows past the groups
    (1, 4, 40, 48, [0, 0, 1, 0]),
    (3, 2, 272, 80, [1, 2]),
    (8, 8, 128, 128, [1, 1, 1, 1, 1, 1, 1, 1]),
    (11, 3, 40, 48, [4, 0, 5]),           # rows 9, 10 of no group
    (17, 5, 200, 272, [3, 7, 0, 2, 5]),
    (24, 2, 64, 1040, [20, 4]),           # a group of several 8-row tiles
    (40, 3, 96, 64, [-3, 30, 25]),        # a negative size; the sizes pass M
]


@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16, jnp.float16, "nvfp4"])
@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}_g{c[1]}_n{c[2]}_k{c[3]}" for c in CASES])
def test_matches_float64_oracle(case, x_dtype):
    m, g, n, k, sizes = case
    keys = jax.random.split(jax.random.key(m * 1000 + k), 3)
    w = weights(keys[0], g, n, k)
    x = jax.random.normal(keys[1], (m, k), jnp.float32)
    x = jn.quantize(x) if x_dtype == "nvfp4" else x.astype(x_dtype)
    f = jax.jit(lambda x, s: jn.ragged_matmul(x, w, s, out_dtype=jnp.float32))
    y = f(x, jnp.asarray(sizes, jnp.int32))
    assert y.shape == (m, n) and y.dtype == jnp.float32
    assert rel_err(y, oracle(x, w, sizes)) <= 1e-5


@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("activation", ["relu", "gelu", "silu", "swiglu", "geglu"])
def test_bias_activation_and_output_dtype(activation, out_dtype):
    m, g, n, k, sizes = 13, 3, 96, 80, [5, 0, 6]
    keys = jax.random.split(jax.random.key(7), 3)
    w = weights(keys[0], g, n, k)
    x = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
    bias = jax.random.normal(keys[2], (g, n), jnp.float32)
    y = jn.ragged_matmul(x, w, jnp.asarray(sizes), bias=bias, activation=activation,
                         out_dtype=out_dtype)
    cols = n // 2 if activation in ("swiglu", "geglu") else n
    assert y.shape == (m, cols) and y.dtype == out_dtype
    want = oracle(x, w, sizes, bias, activation)
    assert rel_err(y, want) <= TOL[out_dtype]
    assert not np.asarray(y[11:]).any()  # rows of no group: zero, not act(bias)


def test_zeros_tiny_and_huge_values():
    """An all-zero group, weights of 1e-30 and 1e30 magnitude (each expert its own s_dec), and x
    rows of zeros: finite where the oracle is, zero rows exactly zero."""
    k, n = 64, 32
    w = jnp.stack([jnp.zeros((n, k)), jnp.full((n, k), 1e-30), jnp.full((n, k), 1e30)])
    w = w * jax.random.uniform(jax.random.key(1), (3, n, k), minval=0.5, maxval=1.0)
    wq = jax.vmap(jn.quantize)(w)
    x = jax.random.normal(jax.random.key(2), (9, k), jnp.float32).at[4].set(0.0)
    sizes = [3, 3, 3]
    y = np.asarray(jn.ragged_matmul(x, wq, jnp.asarray(sizes), out_dtype=jnp.float32))
    want = oracle(x, wq, sizes)
    assert not y[:3].any() and not y[4].any()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=0)


def test_one_group_is_matmul():
    """G = 1 with every row in it: the same values as matmul with that weight."""
    w = weights(jax.random.key(3), 1, 160, 96)
    x = jax.random.normal(jax.random.key(4), (6, 96), jnp.float32)
    y = jn.ragged_matmul(x, w, jnp.array([6]), out_dtype=jnp.float32)
    w0 = jn.NVFP4Array(w.codes[0], w.scales[0], w.s_dec[0])
    want = np.asarray(jn.matmul(x, w0, out_dtype=jnp.float32))
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_scalar_s_dec_and_traced_sizes_in_one_compilation():
    """A weight quantized as one [G, N, K] tensor (scalar s_dec); sizes are data: one jitted
    function serves every routing."""
    w = jn.quantize(jax.random.normal(jax.random.key(5), (3, 48, 64), jnp.float32))
    assert w.s_dec.shape == ()
    x = jax.random.normal(jax.random.key(6), (7, 64), jnp.float32)
    f = jax.jit(lambda s: jn.ragged_matmul(x, w, s, out_dtype=jnp.float32))
    for sizes in ([7, 0, 0], [0, 0, 7], [2, 2, 3], [0, 1, 0]):
        assert rel_err(f(jnp.asarray(sizes, jnp.int32)), oracle(x, w, sizes)) <= 1e-5
    assert f._cache_size() == 1


def ragged_calls(jaxpr):
    """The ragged matmul primitives in a jaxpr and its sub-jaxprs, and whether any is in a loop."""
    calls, looped = 0, False
    for eqn in jaxpr.eqns:
        if "ragged_matmul" in eqn.primitive.name:
            calls += 1
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n, inner_looped = ragged_calls(sub)
            calls += n
            looped |= inner_looped or (n and eqn.primitive.name in ("while", "scan"))
    return calls, looped


def assert_quantized_from(q, y, s_enc):
    """q holds the bytes of the reference quantization of float32 y with encode scale s_enc."""
    codes, scales, s_dec = mc.quantize_reference_bytes(np.asarray(y, np.float32), s_enc)
    np.testing.assert_array_equal(
        np.asarray(jax.lax.bitcast_convert_type(q.codes, jnp.uint4)).astype(np.uint8), codes)
    np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint8), scales)
    np.testing.assert_array_equal(np.asarray(q.s_dec), s_dec)


@pytest.mark.parametrize("activation", [None, "swiglu"])
def test_nvfp4_output_is_the_quantized_float32_result(activation):
    """out_s_enc: the bytes of the reference quantization of the same call's float32 result (the
    bias and the activation applied first; rows of no group zero codes), over two 128-row scale
    tiles, within NVFP4's rounding of the float64 oracle."""
    m, g, n, k, sizes = 150, 3, 64, 80, [5, 0, 140]  # rows 145-149 of no group
    keys = jax.random.split(jax.random.key(23), 3)
    w = weights(keys[0], g, n, k)
    x = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
    bias = jax.random.normal(keys[2], (g, n), jnp.float32)
    y = jn.ragged_matmul(x, w, jnp.asarray(sizes), bias=bias, activation=activation,
                         out_dtype=jnp.float32)
    s_enc = np.float32(6 * 448 / np.abs(np.asarray(y)).max())  # the recipe's scale: no saturation
    q = jax.jit(lambda x, s: jn.ragged_matmul(x, w, s, bias=bias, activation=activation,
                                              out_s_enc=s_enc))(x, jnp.asarray(sizes))
    cols = n // 2 if activation else n
    assert isinstance(q, jn.NVFP4Array) and q.shape == (m, cols)
    q.validate()
    assert_quantized_from(q, y, s_enc)
    got = np.asarray(q.dequantize(jnp.float32))
    assert not got[145:].any()
    assert rel_err(got, oracle(x, w, sizes, bias, activation or "none")) <= 0.12  # 0.08-0.1


@pytest.mark.parametrize("activation", [None, "swiglu"])
def test_nvfp4_output_without_columns_is_empty_as_matmul_gives_it(activation):
    """N = 0 (or N / 2 = 0 gated) with out_s_enc: an empty NVFP4Array with s_dec = 1 / s_enc,
    field for field what matmul returns, not an error about quantizing an empty axis."""
    w = jax.vmap(jn.quantize)(jnp.ones((2, 0, 64)))
    x = jnp.ones((5, 64), jnp.bfloat16)
    q = jax.jit(lambda x: jn.ragged_matmul(x, w, jnp.asarray([2, 3]), activation=activation,
                                           out_s_enc=2.0))(x)
    want = jn.matmul(x, jn.quantize(jnp.ones((0, 64))), activation=activation, out_s_enc=2.0)
    assert isinstance(q, jn.NVFP4Array) and q.shape == want.shape == (5, 0)
    for got, ref in zip(jax.tree.leaves(q), jax.tree.leaves(want)):
        assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_array_equal(np.asarray(q.s_dec), np.asarray(want.s_dec))


def test_nvfp4_output_feeds_the_next_expert_layer():
    """An MoE block run W4A4 after its first layer: the gate/up layer's NVFP4 output (swiglu) is
    the down projection's x, as the float64 oracle computes it from that NVFP4 x."""
    m, g, d, f, sizes = 20, 4, 64, 96, [6, 0, 9, 5]
    keys = jax.random.split(jax.random.key(24), 3)
    w13, w2 = weights(keys[0], g, 2 * f, d), weights(keys[1], g, d, f)
    x = jax.random.normal(keys[2], (m, d), jnp.bfloat16)
    s = jnp.asarray(sizes)
    h = jn.ragged_matmul(x, w13, s, activation="swiglu", out_s_enc=2.0)
    assert h.shape == (m, f)
    y = jn.ragged_matmul(h, w2, s, out_dtype=jnp.float32)
    assert rel_err(y, oracle(h, w2, sizes)) <= 1e-5


@pytest.mark.parametrize("in_axes", [(0, 0, None), (0, 0, 0)])
def test_vmap_with_nvfp4_output(in_axes):
    """vmap over x and the routings (and each element's own out_s_enc) still folds the GEMM into
    one call; each element's output is its float32 result quantized with its s_enc."""
    w = weights(jax.random.key(25), 3, 32, 48)
    x = jax.random.normal(jax.random.key(26), (2, 7, 48), jnp.float32)
    sizes = jnp.array([[2, 0, 4], [0, 7, 0]], jnp.int32)
    s_enc = np.array([50.0, 700.0], np.float32)
    e = s_enc if in_axes[2] == 0 else s_enc[0]
    f = jax.vmap(lambda a, s, e: jn.ragged_matmul(a, w, s, out_s_enc=e), in_axes)
    assert ragged_calls(jax.make_jaxpr(f)(x, sizes, e).jaxpr) == (1, False)
    q = jax.jit(f)(x, sizes, e)
    assert q.shape == (2, 7, 32)
    for b in range(2):
        y = jn.ragged_matmul(x[b], w, sizes[b], out_dtype=jnp.float32)
        assert_quantized_from(jax.tree.map(lambda t: t[b], q), y, s_enc[b] if in_axes[2] == 0
                              else s_enc[0])


def test_nvfp4_output_is_not_differentiable():
    w = weights(jax.random.key(27), 2, 32, 48)
    loss = lambda x: jn.ragged_matmul(x, w, jnp.array([2, 3]),  # noqa: E731
                                      out_s_enc=1.0).dequantize(jnp.float32).sum()
    with pytest.raises(TypeError, match="ragged_matmul's NVFP4 output.*rounding step"):
        jax.grad(loss)(jnp.ones((5, 48)))


@pytest.mark.parametrize("in_axes", [(0, 0), (1, 0), (None, 0), (0, None)])
def test_vmap_over_tokens_and_routings_is_one_call(in_axes):
    """vmap over x and/or group_sizes folds the batch into one call over all its rows (each
    group's weights read once): one ragged primitive, in no loop, and each element's rows as the
    oracle gives them: rows of no group zero, an element with no rows routed, sizes past M."""
    w = weights(jax.random.key(8), 4, 32, 48)
    x = jax.random.normal(jax.random.key(9), (3, 6, 48), jnp.float32)
    sizes = jnp.array([[1, 2, 0, 2], [0, 0, 9, 0], [0, 0, 0, 0]], jnp.int32)
    if in_axes[0] is None:
        x = x[0]
    if in_axes[1] is None:
        sizes = sizes[0]
    xs = jnp.moveaxis(x, 0, 1) if in_axes[0] == 1 else x
    f = jax.vmap(lambda a, s: jn.ragged_matmul(a, w, s, out_dtype=jnp.float32), in_axes)
    assert ragged_calls(jax.make_jaxpr(f)(xs, sizes).jaxpr) == (1, False)
    y = jax.jit(f)(xs, sizes)
    assert y.shape == (3, 6, 32)
    for b in range(3):
        x_b = x if in_axes[0] is None else x[b]
        sizes_b = sizes if in_axes[1] is None else sizes[b]
        assert rel_err(y[b], oracle(x_b, w, list(np.asarray(sizes_b)))) <= 1e-5


def test_vmap_over_routings_with_x64_enabled():
    """With 64-bit mode on, the folded call's group sizes (a sum over the batch) stay int32."""
    w = weights(jax.random.key(8), 2, 32, 48)
    x = jax.random.normal(jax.random.key(9), (2, 4, 48), jnp.float32)
    sizes = jnp.array([[1, 3], [2, 2]], jnp.int32)
    f = jax.vmap(lambda a, s: jn.ragged_matmul(a, w, s, out_dtype=jnp.float32))
    want = f(x, sizes)
    with jax.enable_x64(True):
        got = f(x, sizes)
    np.testing.assert_array_equal(got, want)
    for b in range(2):
        assert rel_err(got[b], oracle(x[b], w, list(np.asarray(sizes[b])))) <= 1e-5


def test_vmap_fold_with_first_rows_and_sizes_past_m():
    """The fold at the primitive, on what only sharding makes (each element's group 0 from its
    own first_row) and what users may pass (negative sizes, sizes past M, elements with no rows
    routed, bias, a gated activation): each element as the oracle gives it."""
    b, m, g, n, k = 6, 7, 3, 32, 64
    keys = jax.random.split(jax.random.key(14), 3)
    w = weights(keys[0], g, n, k)
    x = jax.random.normal(keys[1], (b, m, k), jnp.float32)
    bias = jax.random.normal(keys[2], (g, n), jnp.float32)
    sizes = np.array([[2, 3, 1], [0, 0, 0], [-4, 9, 2], [7, 0, 0], [1, 1, 1], [0, 2, 30]], np.int32)
    first = np.array([0, 3, 1, 6, 2, 0], np.int32)

    def call(a, s, f):
        (y,) = ragged_matmul_p.bind(a, w.codes, w.scales, w.s_dec, s, f, bias, a_nvfp4=False,
                                    has_bias=True, out_dtype=jnp.float32, activation="swiglu")
        return y

    y = jax.jit(jax.vmap(call))(x, jnp.asarray(sizes), jnp.asarray(first))
    for e in range(b):
        assert rel_err(y[e], oracle(x[e], w, sizes[e], bias, "swiglu", first[e])) <= 1e-5


def test_vmap_over_weights_or_nvfp4_x_runs_per_element():
    """Batched weights, or an NVFP4 x (its scales tiled over rows), cannot fold into one call:
    they run once per element, with each element's values."""
    ws = jax.vmap(lambda k: weights(k, 2, 32, 64))(jax.random.split(jax.random.key(11), 2))
    x = jax.random.normal(jax.random.key(12), (2, 5, 64), jnp.float32)
    sizes = jnp.array([2, 3], jnp.int32)
    f = jax.vmap(lambda a, w: jn.ragged_matmul(a, w, sizes, out_dtype=jnp.float32))
    assert ragged_calls(jax.make_jaxpr(f)(x, ws).jaxpr) == (1, True)
    y = f(x, ws)
    for b in range(2):
        w_b = jax.tree.map(lambda t: t[b], ws)
        assert rel_err(y[b], oracle(x[b], w_b, [2, 3])) <= 1e-5
    w = weights(jax.random.key(13), 2, 32, 64)
    xq = jax.vmap(jn.quantize)(x)
    fq = jax.vmap(lambda a: jn.ragged_matmul(a, w, sizes, out_dtype=jnp.float32))
    assert ragged_calls(jax.make_jaxpr(fq)(xq).jaxpr) == (1, True)
    yq = fq(xq)
    for b in range(2):
        assert rel_err(yq[b], oracle(jax.tree.map(lambda t: t[b], xq), w, [2, 3])) <= 1e-5


@pytest.mark.parametrize("activation", [None, "silu", "swiglu"])
def test_grad_in_x_and_bias(activation):
    """d/dx and d/dbias of sum(c * y) against jax.grad of the oracle's formula in float32 (HIGHEST precision): rows of no group get
    zero gradient, each group's bias the sum over its rows."""
    m, g, n, k, sizes = 10, 3, 32, 48, [4, 0, 4]
    keys = jax.random.split(jax.random.key(10), 4)
    w = weights(keys[0], g, n, k)
    x = jax.random.normal(keys[1], (m, k), jnp.float32)
    bias = jax.random.normal(keys[2], (g, n), jnp.float32)
    cols = n // 2 if activation == "swiglu" else n
    c = jax.random.normal(keys[3], (m, cols), jnp.float32)

    def loss(x, bias):
        y = jn.ragged_matmul(x, w, jnp.asarray(sizes), bias=bias, activation=activation,
                             out_dtype=jnp.float32)
        return jnp.sum(c * y)

    def loss_ref(x, bias):  # the oracle's formula with plain JAX ops
        ws = jn.dequantize(w, jnp.float32)
        rows = jnp.concatenate([jnp.full(s, i) for i, s in enumerate(sizes)] + [jnp.full(m - 8, 0)])
        z = jnp.einsum("mk,mnk->mn", x, ws[rows], precision="highest") + bias[rows]
        y = reference_activation(z, activation or "none") * (jnp.arange(m) < 8)[:, None]
        return jnp.sum(c * y)

    gx, gb = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, bias)
    wx, wb = jax.grad(loss_ref, argnums=(0, 1))(x, bias)
    # the tangent products run in bfloat16 against the 4-bit weights
    assert rel_err(gx, np.asarray(wx, np.float64)) <= 1e-2
    assert rel_err(gb, np.asarray(wb, np.float64)) <= 1e-5
    assert not np.asarray(gx[8:]).any() and not np.asarray(gb[1]).any()


def test_jacobians_hessian_and_per_example_grads():
    """jacfwd, jacrev, hessian and vmap(grad) in x: the tangent products batch (a loop per
    element) and transpose into each other; the two Jacobians agree to their bf16 rounding."""
    w = weights(jax.random.key(17), 2, 16, 32)
    x = jax.random.normal(jax.random.key(18), (5, 32), jnp.float32)
    sizes = jnp.array([2, 2])
    f = lambda x: jn.ragged_matmul(x, w, sizes, activation="silu", out_dtype=jnp.float32)  # noqa: E731
    fwd, rev = jax.jacfwd(f)(x), jax.jacrev(f)(x)
    assert fwd.shape == (5, 16, 5, 32) and rel_err(rev, np.asarray(fwd, np.float64)) <= 1e-2
    assert not np.asarray(fwd[4]).any()  # row 4 holds no group
    assert jax.hessian(lambda x: f(x).sum())(x).shape == (5, 32, 5, 32)
    per_example = jax.vmap(jax.grad(lambda x: f(x).sum()))(jnp.stack([x, 2 * x]))
    np.testing.assert_allclose(per_example[0], jax.grad(lambda x: f(x).sum())(x), rtol=1e-6)


@pytest.mark.parametrize("sizes, dtype, want_rows", [
    ([2**31 + 5, 0], np.uint32, 4),      # past int32: clipped, not wrapped to a negative size
    ([2**32 + 3, 0], np.int64, 4),       # a NumPy int64 without jax_enable_x64
    ([2**31 + 5, 0], jnp.uint32, 4),     # a jax array
    ([-3, 2], np.int8, 0),               # negative: 0 rows; then group 1's 2
])
def test_group_sizes_are_clipped_not_wrapped(sizes, dtype, want_rows):
    w = jax.vmap(jn.quantize)(jnp.stack([jnp.ones((16, 16)), 2 * jnp.ones((16, 16))]))
    group_sizes = jnp.asarray(sizes, dtype) if dtype is jnp.uint32 else np.asarray(sizes, dtype)
    y = np.asarray(jn.ragged_matmul(jnp.ones((4, 16)), w, group_sizes, out_dtype=jnp.float32))
    want = [16.0] * want_rows + ([32.0, 32.0, 0.0, 0.0] if want_rows == 0 else [])
    np.testing.assert_array_equal(y[:, 0], want)


def test_export_with_a_symbolic_m_lowers_to_the_kernel(monkeypatch):
    """Exported for Hopper with M symbolic, the call takes the decode kernel (its grid is sized per
    call; it needs no workspace, which would be sized by M)."""
    from jax import export

    monkeypatch.setattr(_extension, "kernel_available", lambda target: True)
    monkeypatch.setattr(_extension, "visible_cuda_arch", lambda: "sm_90a")
    jax.clear_caches()
    w = weights(jax.random.key(19), 4, 32, 64)
    (m,) = export.symbolic_shape("M")
    exported = export.export(jax.jit(lambda x, s: jn.ragged_matmul(x, w, s)), platforms=["cuda"],
                             disabled_checks=[export.DisabledSafetyCheck.custom_call(RAGGED_TARGET)])(
        jax.ShapeDtypeStruct((m, 64), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32))
    jax.clear_caches()
    call = next(line for line in exported.mlir_module().splitlines() if RAGGED_TARGET in line)
    assert "path = 1 : i64" in call  # GemmPath::kDecode


def _lowered_for_sm100(monkeypatch, x_shape, n, k):
    """The cuda lowering of a ragged call exported as for an sm_100a GPU (no GPU needed)."""
    from jax import export

    monkeypatch.setattr(_extension, "kernel_available", lambda target: True)
    monkeypatch.setattr(_extension, "visible_cuda_arch", lambda: "sm_100a")
    monkeypatch.setattr(_extension, "_cuda_compute_capability", lambda: (10, 0))
    jax.clear_caches()
    try:
        w = weights(jax.random.key(20), 3, n, k)
        exported = export.export(
            jax.jit(lambda x, s: jn.ragged_matmul(x, w, s)), platforms=["cuda"],
            disabled_checks=[export.DisabledSafetyCheck.custom_call(RAGGED_TARGET)])(
            jax.ShapeDtypeStruct(x_shape, jnp.bfloat16), jax.ShapeDtypeStruct((3,), jnp.int32))
        return exported.mlir_module()
    finally:
        jax.clear_caches()


def test_sm100_lowers_to_the_grouped_kernel(monkeypatch):
    """On sm_100a a call whose K is a multiple of 32 and N of 4 takes the FFI target, with the one
    path sm_100a has (0, the launcher's)."""
    module = _lowered_for_sm100(monkeypatch, (40, 64), 48, 64)
    call = next(line for line in module.splitlines() if RAGGED_TARGET in line)
    assert "path = 0 : i64" in call


@pytest.mark.parametrize("x_shape, n, k", [
    ((40, 48), 32, 48),   # K = 48: rows of codes not 16 bytes apart
    ((40, 64), 34, 64),   # N = 34: rows of the float32 result not 16 bytes apart
    (("M", 64), 32, 64),  # a symbolic M: the workspace holds M rows
])
def test_sm100_lowers_other_shapes_to_xla(monkeypatch, x_shape, n, k):
    if x_shape[0] == "M":
        from jax import export

        x_shape = (export.symbolic_shape("M")[0], x_shape[1])
    module = _lowered_for_sm100(monkeypatch, x_shape, n, k)
    assert RAGGED_TARGET not in module
    assert "ragged_dot" in module  # XLA's dequantize + ragged_dot


def test_sm100_refuses_a_forced_sm90_kernel(monkeypatch):
    monkeypatch.setenv(RAGGED_PATH_ENV, "decode")
    with pytest.raises(ValueError, match="forces an sm_90a kernel; this GPU is sm_100a"):
        _lowered_for_sm100(monkeypatch, (40, 64), 48, 64)


def test_export_for_cpu_and_cuda_in_one_artifact():
    """One artifact for platforms ["cpu", "cuda"] (exported on any machine) compiles and runs on the
    CPU, with its gradient and under vmap: the reference's index math holds no jnp.cumsum, which
    aborted XLA:CPU's compile of such a module."""
    from jax import export

    w = weights(jax.random.key(18), 3, 32, 48)
    x = jax.random.normal(jax.random.key(19), (2, 7, 48), jnp.float32)
    sizes = jnp.array([[2, 0, 4], [7, 0, 0]], jnp.int32)

    def f(x, s):
        y = jax.vmap(lambda a, t: jn.ragged_matmul(a, w, t, out_dtype=jnp.float32))(x, s)
        dx = jax.grad(lambda a: jn.ragged_matmul(a, w, s[0], out_dtype=jnp.float32).sum())(x[0])
        return y, dx

    exported = export.export(jax.jit(f), platforms=["cpu", "cuda"],
                             disabled_checks=[export.DisabledSafetyCheck.custom_call(RAGGED_TARGET)])(
        jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(sizes.shape, sizes.dtype))
    with jax.default_device(jax.devices("cpu")[0]):
        got, want = exported.call(x, sizes), jax.jit(f)(x, sizes)
    for g, h in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-6, atol=1e-6)


def test_nvfp4_operands_are_constants():
    w = weights(jax.random.key(12), 2, 16, 32)
    xq = jn.quantize(jax.random.normal(jax.random.key(13), (4, 32)))
    _, t = jax.jvp(lambda w: jn.ragged_matmul(xq, w, jnp.array([2, 2])), (w,), (w,))
    assert not np.asarray(t, np.float32).any()


def _bad(**overrides):
    w = weights(jax.random.key(14), 2, 32, 48)
    args = dict(x=jnp.ones((5, 48)), w=w, group_sizes=jnp.array([2, 3]))
    args.update(overrides)
    kw = {k: args.pop(k) for k in ("bias", "activation", "out_dtype", "out_s_enc", "reduce_dtype")
          if k in args}
    return lambda: jn.ragged_matmul(args["x"], args["w"], args["group_sizes"], **kw)


@pytest.mark.parametrize("overrides, error, match", [
    (dict(w=jnp.ones((2, 32, 48))), TypeError, "w must be an NVFP4Array"),
    (dict(w=jn.quantize(jnp.ones((32, 48)))), ValueError,
     r"3-D \[G, N, K\].*of shape \(\) or \(G,\), got shape \(32, 48\)"),
    (dict(w=jax.vmap(jn.quantize)(jnp.ones((0, 32, 48))), group_sizes=jnp.zeros((0,), jnp.int32)),
     ValueError, r"w \(0, 32, 48\) has no groups \(G = 0\)"),
    (dict(x=jnp.ones((2, 5, 48))), ValueError, r"x must be \[M, K\].*\(2, 5, 48\)"),
    (dict(x=jnp.ones((5, 64))), ValueError, "K=64.*K=48"),
    (dict(x=jnp.ones((5, 48), jnp.int32)), TypeError, "x"),
    (dict(group_sizes=jnp.array([2.0, 3.0])), TypeError, "group_sizes must be an integer.*float32"),
    (dict(group_sizes=jnp.array([5])), ValueError, r"group_sizes must have shape \(2,\).*\(1,\)"),
    (dict(group_sizes=jn.quantize(jnp.ones((2, 16)))), TypeError,
     "group_sizes must be an integer array, got an NVFP4Array.*it counts rows"),
    (dict(bias=jnp.ones((32,))), ValueError, r"bias must have shape \(2, 32\).*\(32,\)"),
    (dict(bias=jn.quantize(jnp.ones((2, 32)))), TypeError,
     "bias must be a float array, got an NVFP4Array.*biases stay float"),
    (dict(bias=jnp.ones((2, 32), jnp.int32)), TypeError,
     "ragged_matmul: bias must be float32, bfloat16 or float16, got int32"),
    (dict(reduce_dtype=jnp.float16), TypeError,
     "ragged_matmul: reduce_dtype must be float32 or bfloat16, got float16"),
    (dict(activation="swish"), ValueError, "swish"),
    (dict(out_dtype=jnp.int8), TypeError, "out_dtype"),
    (dict(out_s_enc=1.0, out_dtype=jnp.float32), ValueError,
     "out_dtype=float32 has no effect with out_s_enc"),
    (dict(out_s_enc=jnp.ones((2,))), ValueError, r"out_s_enc must be a scalar, got shape \(2,\)"),
    (dict(out_s_enc=float("inf")), ValueError, "out_s_enc must be finite and positive, got inf"),
    (dict(out_s_enc="1"), TypeError, "out_s_enc must be a real number"),
    (dict(w=weights(jax.random.key(17), 2, 40, 48), out_s_enc=1.0), ValueError,
     "columns a multiple of 16, got N=40"),
    (dict(w=weights(jax.random.key(17), 2, 48, 48), activation="swiglu", out_s_enc=1.0),
     ValueError, r"got N / 2 = 24 \(activation='swiglu', N=48\)"),
])
def test_trace_time_errors_name_the_value(overrides, error, match):
    with pytest.raises(error, match=match):
        jax.jit(_bad(**overrides))()


def test_gated_activation_needs_even_n():
    w = weights(jax.random.key(15), 2, 24, 32)
    w = jn.NVFP4Array(w.codes[:, :23], jn.quantize(jnp.ones((2, 23, 32))).scales, w.s_dec)
    with pytest.raises(ValueError, match="N=23"):
        jn.ragged_matmul(jnp.ones((3, 32)), w, jnp.array([1, 2]), activation="swiglu")


def test_s_dec_of_another_shape_is_rejected():
    w = weights(jax.random.key(16), 2, 16, 32)
    bad = jn.NVFP4Array(w.codes, w.scales, jnp.ones((2, 16), jnp.float32))
    with pytest.raises(ValueError, match=r"w.s_dec has shape \(2, 16\)"):
        jn.ragged_matmul(jnp.ones((3, 32)), bad, jnp.array([1, 2]))


# --------------------------------------------------------------------------- the CUDA paths

def ragged_path(path):
    return mc.lowering_env(RAGGED_PATH_ENV, path)


@pytest.fixture
def ragged_kernel(gpu_kernels):
    device = gpu_kernels(RAGGED_TARGET)
    if _extension.device_arch(device) != "sm_90a":
        pytest.skip("the ragged kernel is sm_90a's")
    return device


@pytest.mark.parametrize("operand, message", [
    ("b_scales", r"stacked operand 4 \[3, 1, 1, 32, 4, 4\] is not a stack of 2 elements"),
    ("bias", r"stacked operand 6 \[3, 32\] is not a stack of 2 elements")])
def test_the_ffi_handler_refuses_a_stack_of_another_group_count(ragged_kernel, operand, message):
    """The ragged FFI target checks that the weights' scales, and a per-group s_dec or bias, hold
    one element a group (a direct caller of jax.ffi skips the primitive's checks): another count
    would give each group the wrong slice."""
    w, w3 = weights(jax.random.key(40), 2, 32, 64), weights(jax.random.key(41), 3, 32, 64)
    ops = dict(a=jnp.ones((5, 64), jnp.bfloat16), a_scales=jnp.zeros((0,), jnp.float8_e4m3fn),
               a_s_dec=jnp.ones((), jnp.float32), b_codes=w.codes, b_scales=w.scales,
               b_s_dec=w.s_dec, bias=jnp.ones((2, 32), jnp.float32),
               out_s_enc=jnp.zeros((0,), jnp.float32), group_sizes=jnp.array([2, 3], jnp.int32),
               first_row=jnp.zeros((), jnp.int32))
    ops[operand] = {"b_scales": w3.scales, "bias": jnp.ones((3, 32), jnp.float32)}[operand]
    call = jax.jit(lambda *o: ffi_kernel_call(
        RAGGED_TARGET, [jax.ShapeDtypeStruct((5, 32), jnp.float32)], *o, workspace=1 << 20,
        path=np.int64(0), activation=np.int64(0)))
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(call(*ops.values()))


@pytest.mark.parametrize("path", ["decode", "fused_ws_64", "fused_ws", "fused_ws_256", "xla"])
@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32, "nvfp4"])
@pytest.mark.parametrize("case", [(1, 8, 4112, 4096, [0, 0, 0, 1, 0, 0, 0, 0]),
                                  (6, 8, 2064, 1040, [0, 2, 0, 0, 1, 0, 3, 0]),
                                  (70, 4, 520, 272, [9, 0, 50, 3]),
                                  (130, 3, 256, 2048, [0, 120, 5])],
                         ids=["decode", "top2x3", "m70", "m130"])
def test_cuda_paths(ragged_kernel, case, x_dtype, path):
    """Each CUDA path on tails, the output buffer poisoned with NaN first: the kernel must write
    every element, zeros on rows of no group included."""
    m, g, n, k, sizes = case
    keys = jax.random.split(jax.random.key(m + n), 3)
    w = weights(keys[0], g, n, k, scale=0.01)
    x = jax.random.normal(keys[1], (m, k), jnp.float32)
    x = jn.quantize(x) if x_dtype == "nvfp4" else x.astype(x_dtype)
    bias = jax.random.normal(keys[2], (g, n), jnp.bfloat16)
    jnp.full((m * n * 2,), jnp.nan, jnp.float32).block_until_ready().delete()
    before = _extension.host_calls(RAGGED_TARGET)
    with ragged_path(path):
        y = jax.jit(lambda x, s: jn.ragged_matmul(x, w, s, bias=bias, activation="swiglu",
                                                  out_dtype=jnp.float32))(x, jnp.asarray(sizes))
        y = np.asarray(y)
    assert (_extension.host_calls(RAGGED_TARGET) > before) == (path != "xla")
    assert np.isfinite(y).all()
    assert rel_err(y, oracle(x, w, sizes, bias, "swiglu")) <= 1e-5


@pytest.mark.parametrize("path", ["decode", "fused_ws", "xla"])
def test_cuda_paths_nvfp4_output(ragged_kernel, path):
    """out_s_enc on the GPU: the path's float32 result, quantized by the quantize kernel into the
    bytes the reference quantization gives (rows of no group zero codes); 272 output columns, 70
    rows (a partial 128-row scale tile)."""
    m, g, n, k, sizes = 70, 4, 544, 272, [9, 0, 50, 3]  # rows 62-69 of no group
    keys = jax.random.split(jax.random.key(28), 3)
    w = weights(keys[0], g, n, k, scale=0.01)
    x = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
    bias = jax.random.normal(keys[2], (g, n), jnp.bfloat16)
    s_enc = np.float32(400.0)
    call = lambda **kw: jax.jit(lambda x, s: jn.ragged_matmul(  # noqa: E731
        x, w, s, bias=bias, activation="swiglu", **kw))(x, jnp.asarray(sizes))
    before = _extension.host_calls(RAGGED_TARGET)
    with ragged_path(path):
        q, y = call(out_s_enc=s_enc), call(out_dtype=jnp.float32)
    assert (_extension.host_calls(RAGGED_TARGET) > before) == (path != "xla")
    assert q.shape == (m, n // 2)
    assert_quantized_from(q, y, s_enc)
    assert not np.asarray(q.dequantize(jnp.float32))[62:].any()


@pytest.mark.parametrize("path", ["decode", "fused_ws_64", "fused_ws", "fused_ws_256"])
@pytest.mark.parametrize("k", [1024, 1040])  # 16- and 8-byte weight copies
@pytest.mark.parametrize("x_dtype,out_dtype,activation", [(jnp.bfloat16, jnp.bfloat16, "none"),
                                                          (jnp.float16, jnp.float32, "gelu"),
                                                          ("nvfp4", jnp.bfloat16, "swiglu")])
def test_kernels_on_groups_across_tiles(ragged_kernel, path, k, x_dtype, out_dtype, activation):
    """Groups whose rows begin and end inside fused_ws's 64- to 256-row tiles of x (staged each from a
    tile boundary, its last tile partial), group 0 from first_row > 0 (a shard of the groups), rows
    of no group before and after, N past the last whole tile; the output poisoned with NaN
    first."""
    m, g, n, first_row = 300, 5, 2064, 2
    sizes = [0, 130, 7, 120, 40]  # rows 2 .. 298; rows 0, 1 and 299 are in no group
    keys = jax.random.split(jax.random.key(k + m), 3)
    w = weights(keys[0], g, n, k, scale=0.01)
    x = jax.random.normal(keys[1], (m, k), jnp.float32)
    x = jn.quantize(x) if x_dtype == "nvfp4" else x.astype(x_dtype)
    bias = jax.random.normal(keys[2], (g, n), jnp.bfloat16)
    a_ops = [x.codes, x.scales, x.s_dec] if x_dtype == "nvfp4" else [x]

    def call(x_ops, sizes, first):
        (y,) = ragged_matmul_p.bind(*x_ops, w.codes, w.scales, w.s_dec, sizes, first, bias,
                                    a_nvfp4=x_dtype == "nvfp4", has_bias=True, out_dtype=out_dtype,
                                    activation=activation)
        return y

    jnp.full((m * n * 2,), jnp.nan, jnp.float32).block_until_ready().delete()
    before = _extension.host_calls(RAGGED_TARGET)
    with ragged_path(path):
        y = np.asarray(jnp.asarray(jax.jit(call)(a_ops, jnp.asarray(sizes, jnp.int32),
                                                 jnp.int32(first_row)), jnp.float32))
    assert _extension.host_calls(RAGGED_TARGET) > before
    assert np.isfinite(y).all() and not y[[0, 1, 299]].any()
    want = oracle(x, w, sizes, bias, activation, first_row)
    assert rel_err(y, want) <= TOL[out_dtype]


def test_auto_path_takes_the_kernel_at_any_m(ragged_kernel):
    """The kernel at every M, the launcher's choices on both sides of its rule (gemm_sm90.h: fused_ws
    from 16 rows a group on 64-row tiles, on 128- and 256-row ones from 64 and 144: 32, 128 and
    288 rows here)."""
    w = weights(jax.random.key(20), 2, 64, 64)
    for m in (1, 31, 32, 127, 128, 287, 288, 5000):
        x = jax.random.normal(jax.random.key(m), (m, 64), jnp.float32)
        sizes = [m // 3, m - m // 3]
        before = _extension.host_calls(RAGGED_TARGET)
        y = jn.ragged_matmul(x, w, jnp.asarray(sizes), out_dtype=jnp.float32)
        assert _extension.host_calls(RAGGED_TARGET) > before
        assert rel_err(y, oracle(x, w, sizes)) <= 1e-5


def test_kernel_nan_stays_in_its_row(ragged_kernel):
    m, g, n, k = 9, 3, 48, 64
    w = weights(jax.random.key(21), g, n, k)
    x = np.array(jax.random.normal(jax.random.key(22), (m, k), jnp.float32))
    x[2, 5] = np.nan
    with ragged_path("kernel"):
        y = np.asarray(jn.ragged_matmul(jnp.asarray(x), w, jnp.array([4, 0, 4]), out_dtype=jnp.float32))
    assert np.isnan(y[2]).all() and not np.isnan(np.delete(y, 2, axis=0)).any()
    assert not y[8].any()

