"""Differentiation of jax_nvfp4.matmul (JVP/transpose rules) and the QAT straight-through matmul."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_nvfp4 as jn
from jax_nvfp4.primitives.autodiff import qat_conv, qat_matmul

N, K = 48, 64


# The rules are checked on the CPU path at float32 tolerances (GPU kernels split float32
# activations into bf16 hi + lo, about 2^-17 relative).
pytestmark = pytest.mark.usefixtures("on_cpu")


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture
def problem():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k1, (2, 5, K), jnp.float32)
    w = jax.random.normal(k2, (N, K), jnp.float32)
    b = jax.random.normal(k3, (N,), jnp.float32)
    return x, w, b


def _loss(y):
    return jnp.sum(jnp.sin(y.astype(jnp.float32)))


@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
def test_grad_wrt_x_and_bias_matches_dequantized_reference(problem, x_dtype):
    x, w, b = problem
    x = x.astype(x_dtype)
    wq = jn.quantize(w)
    w_hat = jn.dequantize(wq, jnp.float32)

    got = jax.grad(lambda x, b: _loss(jn.matmul(x, wq, bias=b, out_dtype=jnp.float32)),
                   (0, 1))(x, b)
    ref = jax.grad(lambda x, b: _loss(jnp.dot(x.astype(jnp.float32), w_hat.T,
                                              precision="highest") + b), (0, 1))(x, b)
    assert got[0].dtype == x_dtype and got[0].shape == x.shape
    assert got[1].dtype == b.dtype
    assert _rel(got[0], ref[0]) < 1e-2  # the backward GEMM runs in bfloat16
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=1e-5)


def test_jvp_is_the_nvfp4_gemm_of_the_tangent(problem):
    x, w, b = problem
    wq = jn.quantize(w)
    t = jax.random.normal(jax.random.key(7), x.shape)
    tb = jax.random.normal(jax.random.key(8), b.shape)
    y, y_dot = jax.jvp(lambda x, b: jn.matmul(x, wq, bias=b, out_dtype=jnp.float32), (x, b),
                       (t, tb))
    np.testing.assert_array_equal(y, jn.matmul(x, wq, bias=b, out_dtype=jnp.float32))
    ref = jnp.dot(t, jn.dequantize(wq, jnp.float32).T, precision="highest") + tb
    np.testing.assert_allclose(y_dot, ref, rtol=1e-5, atol=1e-4)


def test_grad_under_jit_and_vmap(problem):
    x, w, b = problem
    wq = jn.quantize(w)
    f = lambda x: _loss(jn.matmul(x, wq, bias=b, out_dtype=jnp.float32))
    eager = jax.grad(f)(x)
    # The backward rounds the cotangent to bf16 (BACKWARD_DTYPE); under jit XLA may keep it in
    # float32 (excess precision, as jax 0.11's CPU backend does), so jit and eager agree to the
    # backward's precision, not to float32's.
    assert _rel(jax.jit(jax.grad(f))(x), eager) < 1e-2
    per_example = jax.vmap(jax.grad(f))(x)
    np.testing.assert_allclose(per_example, jnp.stack([jax.grad(f)(xi) for xi in x]),
                               rtol=1e-6, atol=1e-6)


def test_vjp_of_bfloat16_output(problem):
    x, w, _ = problem
    wq = jn.quantize(w)
    y, vjp = jax.vjp(lambda x: jn.matmul(x, wq), x)  # default out_dtype: bfloat16
    assert y.dtype == jnp.bfloat16
    g = jnp.ones_like(y)
    (dx,) = vjp(g)
    ref = jnp.dot(jnp.ones(y.shape, jnp.float32), jn.dequantize(wq, jnp.float32))
    assert dx.dtype == x.dtype and _rel(dx, ref) < 1e-2


@pytest.mark.parametrize("activation", ["silu", "swiglu"])
def test_silu_gradient_is_finite_far_below_zero(activation):
    """silu's JVP at pre-activations where exp(-y) overflows float32 (y < -88.7): 0, as
    jax.nn.silu's, not inf / inf."""
    w = jn.quantize(jnp.ones((16, 16), jnp.float32))
    x = jnp.full((1, 16), -6.0)  # every pre-activation -96
    g = jax.grad(lambda a: jn.matmul(a, w, activation=activation, out_dtype=jnp.float32).sum())(x)
    np.testing.assert_array_equal(np.asarray(g), 0.0)


@pytest.mark.parametrize("through", ["matmul", "dequantize"])
def test_nvfp4_weight_gets_zero_gradient(problem, through):
    x, w, _ = problem
    wq = jn.quantize(w)
    if through == "matmul":
        g = jax.grad(lambda wq: _loss(jn.matmul(x, wq, out_dtype=jnp.float32)))(wq)
    else:
        g = jax.grad(lambda wq: _loss(jn.dequantize(wq, jnp.float32)))(wq)
    assert isinstance(g, jn.NVFP4Array)
    for field in (g.codes, g.scales, g.s_dec):
        assert not np.any(np.asarray(field, np.float32))


def test_w4a4_gradient_reaches_bias_only(problem):
    x, w, b = problem
    wq, xq = jn.quantize(w), jn.quantize(x)
    gb = jax.grad(lambda b: _loss(jn.matmul(xq, wq, bias=b, out_dtype=jnp.float32)))(b)
    y = jn.matmul(xq, wq, bias=b, out_dtype=jnp.float32)
    np.testing.assert_allclose(gb, jnp.sum(jnp.cos(y), axis=(0, 1)), rtol=1e-5, atol=1e-5)


def test_nvfp4_output_is_not_differentiable(problem):
    x, w, _ = problem
    wq = jn.quantize(w)
    f = lambda x: jnp.sum(jn.dequantize(jn.matmul(x, wq, out_s_enc=1.0), jnp.float32))
    with pytest.raises(TypeError, match="NVFP4 output"):
        jax.grad(f)(x)


def test_quantize_is_not_differentiable_but_a_constant_input_is_fine(problem):
    x, w, _ = problem
    wq = jn.quantize(w)
    f = lambda x: _loss(jn.matmul(jn.quantize(x), wq, out_dtype=jnp.float32))
    with pytest.raises(TypeError, match="quantize .*is a rounding step.*qat_matmul"):
        jax.grad(f)(x)
    g = jax.grad(lambda x: f(jax.lax.stop_gradient(x)) + jnp.sum(x))(x)  # no tangent reaches it
    np.testing.assert_array_equal(g, jnp.ones_like(x))


# ---- quantization-aware training: straight-through estimator ----------------------------------

def _ste_reference(x, w, b, x_hat_fn):
    """x_hat @ w_hat^T + b whose gradients pass straight through both quantizers."""
    sg = jax.lax.stop_gradient
    w_ste = w + sg(jn.dequantize(jn.quantize(sg(w)), jnp.float32) - w)
    x_ste = x + sg(x_hat_fn(sg(x)) - x)
    return jnp.dot(x_ste, w_ste.T, precision="highest") + b


@pytest.mark.parametrize("act", ["w4a16", "w4a4_dynamic", "w4a4_static"])
def test_qat_matmul_forward_and_straight_through_gradients(problem, act):
    x, w, b = problem
    s_enc = 2000.0 if act == "w4a4_static" else None
    quant_act = act != "w4a16"

    def x_in(x):
        return jn.quantize(x, s_enc=s_enc) if quant_act else x

    def x_hat(x):
        return jn.dequantize(x_in(x), jnp.float32) if quant_act else x

    y = qat_matmul(x, w, b, quantize_activations=quant_act, act_s_enc=s_enc,
                   out_dtype=jnp.float32)
    np.testing.assert_array_equal(
        y, jn.matmul(x_in(x), jn.quantize(w), bias=b, out_dtype=jnp.float32))

    got = jax.grad(lambda x, w, b: _loss(qat_matmul(
        x, w, b, quantize_activations=quant_act, act_s_enc=s_enc, out_dtype=jnp.float32)),
        (0, 1, 2))(x, w, b)
    ref = jax.grad(lambda x, w, b: _loss(_ste_reference(x, w, b, x_hat)), (0, 1, 2))(x, w, b)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert _rel(g, r) < 1e-2


def test_qat_matmul_static_scale_gets_zero_gradient(problem):
    x, w, b = problem
    g = jax.grad(lambda s: _loss(qat_matmul(x, w, b, quantize_activations=True, act_s_enc=s)))(
        jnp.float32(1000.0))
    assert g == 0


def test_qat_matmul_rejects_bad_arguments(problem):
    x, w, b = problem
    with pytest.raises(ValueError, match=r"\(48, 64, 1\)"):
        qat_matmul(x, w[..., None], b)
    with pytest.raises(ValueError, match="contracting dims differ"):
        qat_matmul(x[..., :32], w, b)
    with pytest.raises(ValueError, match="act_s_enc"):
        qat_matmul(x, w, b, act_s_enc=100.0)
    with pytest.raises(TypeError, match="qat_matmul: reduce_dtype must be float32 or bfloat16"):
        qat_matmul(x, w, b, reduce_dtype=jnp.float16)
    with pytest.raises(TypeError, match="qat_matmul: w must be a float array, got an NVFP4Array"):
        qat_matmul(x, jn.quantize(w), b)


# ---- convolution --------------------------------------------------------------------------------

def _float_conv(x, w_hwio, **kw):
    return jax.lax.conv_general_dilated(x, w_hwio, kw["window_strides"], kw["padding"],
                                        rhs_dilation=kw["rhs_dilation"],
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        precision="highest")


CONV_KW = dict(window_strides=(2, 1), padding="SAME", rhs_dilation=(1, 2))


@pytest.fixture
def conv_problem():
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(k1, (2, 7, 6, 32), jnp.float32)
    w = jax.random.normal(k2, (3, 3, 32, 16), jnp.float32) / 8
    b = jax.random.normal(k3, (16,), jnp.float32)
    return x, w, b


def test_conv_grad_and_jvp_match_dequantized_reference(conv_problem):
    x, w, b = conv_problem
    wq = jn.quantize_conv_weight(w)
    w_hat = jnp.transpose(jn.dequantize(wq, jnp.float32), (0, 1, 3, 2))
    f = lambda x, b: jn.conv(x, wq, bias=b, out_dtype=jnp.float32, **CONV_KW)
    f_ref = lambda x, b: _float_conv(x, w_hat, **CONV_KW) + b
    got = jax.grad(lambda x, b: _loss(f(x, b)), (0, 1))(x, b)
    ref = jax.grad(lambda x, b: _loss(f_ref(x, b)), (0, 1))(x, b)
    assert got[0].shape == x.shape and _rel(got[0], ref[0]) < 1e-2
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-4, atol=1e-4)
    t = jax.random.normal(jax.random.key(9), x.shape)
    _, y_dot = jax.jvp(lambda x: f(x, b), (x,), (t,))
    np.testing.assert_allclose(y_dot, _float_conv(t, w_hat, **CONV_KW), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("padding", ["SAME", ((1, 0), (2, 1))], ids=["same", "pairs"])
@pytest.mark.parametrize("act", ["w4a16", "w4a4_dynamic", "w4a4_static"])
def test_qat_conv_forward_and_straight_through_gradients(conv_problem, act, padding):
    x, w, b = conv_problem
    kw = CONV_KW | dict(padding=padding)
    s_enc = 2000.0 if act == "w4a4_static" else None
    quant_act = act != "w4a16"
    qat = dict(quantize_activations=quant_act, act_s_enc=s_enc, out_dtype=jnp.float32, **kw)
    x_in = jn.quantize(x, s_enc=s_enc) if quant_act else x
    y = qat_conv(x, w, b, **qat)
    np.testing.assert_array_equal(y, jn.conv(x_in, jn.quantize_conv_weight(w), bias=b,
                                             out_dtype=jnp.float32, **kw))
    sg = jax.lax.stop_gradient

    def ste_reference(x, w, b):
        x_hat = jn.dequantize(jn.quantize(sg(x), s_enc=s_enc), jnp.float32) if quant_act else x
        w_hat = jnp.transpose(jn.dequantize(jn.quantize_conv_weight(sg(w)), jnp.float32),
                              (0, 1, 3, 2))
        return _float_conv(x + sg(x_hat - x), w + sg(w_hat - w), **kw) + b

    got = jax.grad(lambda *a: _loss(qat_conv(*a, **qat)), (0, 1, 2))(x, w, b)
    ref = jax.grad(lambda *a: _loss(ste_reference(*a)), (0, 1, 2))(x, w, b)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert _rel(g, r) < 1e-2


def test_qat_conv_rejects_bad_arguments(conv_problem):
    x, w, b = conv_problem
    with pytest.raises(ValueError, match=r"\[R, S, C, K\].*\(3, 32, 16\)"):
        qat_conv(x, w[0], b)
    with pytest.raises(TypeError, match="qat_conv: reduce_dtype must be float32 or bfloat16"):
        qat_conv(x, w, b, reduce_dtype=jnp.int8)
    with pytest.raises(TypeError, match="qat_conv: w_hwio must be a float array, got an NVFP4Array"):
        qat_conv(x, jn.quantize_conv_weight(w), b)
