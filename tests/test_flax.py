"""jax_nvfp4.flax: nnx and linen layers, conversion of float models, QAT, sharding names, orbax."""

import functools
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import jax_nvfp4 as jn
from jax_nvfp4.flax import activation_s_enc, convert
from jax_nvfp4.flax import linen as nvlinen
from jax_nvfp4.flax import nnx as nvnnx

IN, OUT = 64, 48


@pytest.fixture
def weights():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    kernel = jax.random.normal(k1, (IN, OUT), jnp.float32) / 8  # Flax layout [in, out]
    bias = jax.random.normal(k2, (OUT,), jnp.float32)
    x = jax.random.normal(k3, (3, 5, IN), jnp.float32)
    return kernel, bias, x


def _reference(x, kernel, bias, *, x_in=None, out_dtype=jnp.float32):
    """The layer's contract: jax_nvfp4.matmul with the transposed, quantized kernel."""
    return jn.matmul(x if x_in is None else x_in, jn.quantize(kernel.T), bias=bias,
                     out_dtype=out_dtype)


def _linen_params(kernel, bias):
    return {"params": {"kernel": kernel, "bias": bias}}


# ---- public names --------------------------------------------------------------------------------

@pytest.mark.parametrize("module, names", [
    (nvnnx, {"Linear", "Conv", "NVFP4Kernel", "NVFP4Param"}),
    (nvlinen, {"Dense", "DenseGeneral", "Conv"}),
    (convert, {"quantize_params", "quantize_model", "save", "restore", "trainable_mask",
               "quantize_all", "skip", "is_conv", "Predicate"}),
])
def test_star_import_gives_the_documented_names_only(module, names):
    # A star import must not bring this module's own imports (jax, jnp, nn, ...) along.
    scope = {}
    exec(f"from {module.__name__} import *", scope)
    assert set(scope) - {"__builtins__"} == names


# ---- forward pass -------------------------------------------------------------------------------

def test_nnx_linear_equals_reference_matmul(weights):
    kernel, bias, x = weights
    layer = nvnnx.Linear.from_float(kernel, bias)
    assert isinstance(layer.weight, jn.NVFP4Array) and layer.weight.shape == (OUT, IN)
    y = layer(x)
    assert y.dtype == jnp.float32 and y.shape == (3, 5, OUT)
    np.testing.assert_array_equal(y, _reference(x, kernel, bias))


def test_nnx_linear_initializes_like_flax(weights):
    _, _, x = weights
    ours = nvnnx.Linear(IN, OUT, rngs=nnx.Rngs(3))
    flax_layer = nnx.Linear(IN, OUT, rngs=nnx.Rngs(3))
    np.testing.assert_array_equal(
        ours(x), _reference(x, flax_layer.kernel[...], flax_layer.bias[...]))


def test_linen_dense_and_nnx_linear_agree(weights):
    kernel, bias, x = weights
    params = convert.quantize_params(nn.Dense(OUT).init(jax.random.key(0), x))
    params["params"]["kernel"] = jn.quantize(kernel.T)
    params["params"]["bias"] = bias
    y_linen = nvlinen.Dense(OUT).apply(params, x)
    np.testing.assert_array_equal(y_linen, nvnnx.Linear.from_float(kernel, bias)(x))


def test_dtype_conventions(weights):
    kernel, bias, x = weights
    xb = x.astype(jnp.bfloat16)
    # dtype=None: x promoted with the float params as they are, else param_dtype (as flax's
    # Dense); dtype given: computed in it.
    assert nvnnx.Linear.from_float(kernel, bias)(xb).dtype == jnp.float32
    bf16_params = jax.tree.map(lambda a: a.astype(jnp.bfloat16),
                               nn.Dense(OUT).init(jax.random.key(0), xb))
    assert nn.Dense(OUT).apply(bf16_params, xb).dtype == jnp.bfloat16
    assert nvlinen.Dense(OUT).apply(convert.quantize_params(bf16_params), xb).dtype == jnp.bfloat16
    assert nvlinen.Dense(OUT, qat=True).apply(bf16_params, xb).dtype == jnp.bfloat16
    assert nvlinen.Dense(OUT).apply(convert.quantize_params(bf16_params), x).dtype == jnp.float32
    # from_float's param_dtype: the kernel quantized from, and the bias kept, in that dtype
    layer = nvnnx.Linear.from_float(kernel, bias, param_dtype=jnp.bfloat16)
    assert layer.bias.dtype == jnp.bfloat16 and layer(xb).dtype == jnp.bfloat16
    np.testing.assert_array_equal(layer.weight.codes.astype(jnp.float32),
                                  jn.quantize(kernel.astype(jnp.bfloat16).T).codes.astype(jnp.float32))
    y = nvnnx.Linear.from_float(kernel, bias, dtype=jnp.bfloat16)(x)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y, _reference(xb, kernel, bias, out_dtype=jnp.bfloat16))
    y = nvlinen.Dense(OUT, use_bias=False, param_dtype=jnp.bfloat16).init_with_output(
        jax.random.key(0), xb)[0]
    assert y.dtype == jnp.bfloat16


def test_linen_dense_general_matches_reshaped_dense():
    x = jax.random.normal(jax.random.key(1), (2, 4, 16, 3))
    float_model = nn.DenseGeneral((4, 8), axis=(1, 2))
    params = float_model.init(jax.random.key(0), x)
    kernel = params["params"]["kernel"]
    assert kernel.shape == (4, 16, 4, 8)
    q = convert.quantize_params(params, conv=lambda path, k: False, in_ndim=lambda path, k: 2)
    y = nvlinen.DenseGeneral((4, 8), axis=(2, 1)).apply(q, x)  # axis order as Flax: sorted
    x2 = jnp.moveaxis(x, (1, 2), (2, 3)).reshape(2, 3, 64)
    ref = _reference(x2, kernel.reshape(64, 32), params["params"]["bias"].reshape(32))
    np.testing.assert_array_equal(y, ref.reshape(2, 3, 4, 8))
    # a freshly initialized layer has the same parameter structure as the converted tree
    init = nvlinen.DenseGeneral((4, 8), axis=(1, 2)).init(jax.random.key(0), x)
    assert jax.tree.map(jnp.shape, init) == jax.tree.map(jnp.shape, q)


def test_linen_dense_general_options():
    """use_bias, dtype, act_quant / act_s_enc, reduce_dtype and bias_init on DenseGeneral, as on
    Dense: the output is matmul's on the quantized x, without bias, in bfloat16."""
    x = jax.random.normal(jax.random.key(2), (3, 2, 32))
    layer = nvlinen.DenseGeneral((4, 8), axis=(1, 2), use_bias=False, dtype=jnp.bfloat16,
                                 act_quant=True, act_s_enc=300.0, reduce_dtype=jnp.bfloat16)
    params = layer.init(jax.random.key(0), x)
    assert "bias" not in params["params"]
    w = params["params"]["kernel"]
    x_in = jn.quantize(x.reshape(3, 64).astype(jnp.bfloat16), s_enc=300.0)
    want = jn.matmul(x_in, w, out_dtype=jnp.bfloat16).reshape(3, 4, 8)
    got = layer.apply(params, x)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got, want)
    biased = nvlinen.DenseGeneral((4, 8), axis=(1, 2), bias_init=nn.initializers.constant(0.5))
    assert np.all(np.asarray(biased.init(jax.random.key(0), x)["params"]["bias"]) == 0.5)


@pytest.mark.parametrize("qat", [True, False], ids=["qat", "inference"])
def test_linen_layers_initialize_like_flax(qat):
    # Flax's DenseGeneral calls kernel_init on the flattened [prod(in), prod(out)] kernel, so its
    # fan-in and fan-out are the totals; Dense and Conv call it on their own shapes.
    x = jax.random.normal(jax.random.key(1), (2, 4, 16, 32))
    key = jax.random.key(5)
    cases = [(nn.DenseGeneral((2, 24), axis=(1, 2)), nvlinen.DenseGeneral((2, 24), axis=(1, 2), qat=qat), 2),
             (nn.Dense(48), nvlinen.Dense(48, qat=qat), 1),
             (nn.Conv(48, (3, 3)), nvlinen.Conv(48, (3, 3), qat=qat), None)]
    for float_layer, layer, in_ndim in cases:
        float_params = float_layer.init(key, x)
        got = layer.init(key, x)["params"]["kernel"]
        if qat:
            np.testing.assert_array_equal(got, float_params["params"]["kernel"])
            continue
        want = convert.quantize_params(float_params, conv=lambda path, k, n=in_ndim: n is None,
                                       in_ndim=lambda path, k, n=in_ndim: n)
        want = want["params"]["kernel"]
        for field in ("codes", "scales", "s_dec"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field))


@pytest.mark.parametrize("s_enc", [None, 1500.0])
def test_w4a4_quantizes_activations(weights, s_enc):
    kernel, bias, x = weights
    layer = nvnnx.Linear.from_float(kernel, bias, act_quant=True, act_s_enc=s_enc)
    ref = _reference(x, kernel, bias, x_in=jn.quantize(x, s_enc=s_enc))
    np.testing.assert_array_equal(layer(x), ref)
    dense = nvlinen.Dense(OUT, act_quant=True, act_s_enc=s_enc)
    q = convert.quantize_params(_linen_params(kernel, bias))
    np.testing.assert_array_equal(dense.apply(q, x), ref)


def test_activation_s_enc_calibration(weights):
    _, _, x = weights
    s = activation_s_enc(x)
    assert s == pytest.approx(6 * 448 / float(jnp.max(jnp.abs(x))), rel=1e-6)
    # calibrating on the batch itself reproduces dynamic quantization
    a, b = jn.quantize(x, s_enc=s), jn.quantize(x)
    np.testing.assert_array_equal(a.codes.astype(jnp.float32), b.codes.astype(jnp.float32))


def test_jit(weights):
    kernel, bias, x = weights
    layer = nvnnx.Linear.from_float(kernel, bias)
    np.testing.assert_array_equal(nnx.jit(lambda m, x: m(x))(layer, x), layer(x))
    q = convert.quantize_params(_linen_params(kernel, bias))
    np.testing.assert_array_equal(jax.jit(nvlinen.Dense(OUT).apply)(q, x), layer(x))


def test_grad_through_inference_layer(weights):
    kernel, bias, x = weights
    layer = nvnnx.Linear.from_float(kernel, bias)
    w_hat = jn.dequantize(layer.weight, jnp.float32)
    g = jax.grad(lambda x: jnp.sum(layer(x) ** 2))(x)
    ref = jax.grad(lambda x: jnp.sum((jnp.dot(x, w_hat.T, precision="highest") + bias) ** 2))(x)
    assert np.linalg.norm(g - ref) / np.linalg.norm(ref) < 1e-2


# ---- convolution --------------------------------------------------------------------------------

CONV_X_SHAPE = (2, 6, 5, 32)


@pytest.fixture
def conv_weights():
    k1, k2, k3 = jax.random.split(jax.random.key(4), 3)
    kernel = jax.random.normal(k1, (3, 3, 32, 16), jnp.float32) / 8  # Flax HWIO
    bias = jax.random.normal(k2, (16,), jnp.float32)
    x = jax.random.normal(k3, CONV_X_SHAPE, jnp.float32)
    return kernel, bias, x


def _conv_reference(x, kernel, bias, **kw):
    return jn.conv(x, jn.quantize_conv_weight(kernel), bias=bias, out_dtype=jnp.float32, **kw)


def test_nnx_and_linen_conv_equal_reference(conv_weights):
    kernel, bias, x = conv_weights
    kw = dict(strides=(2, 1), padding=1, kernel_dilation=(1, 2))
    ref = _conv_reference(x, kernel, bias, window_strides=(2, 1), padding=((1, 1), (1, 1)),
                          rhs_dilation=(1, 2))
    layer = nvnnx.Conv.from_float(kernel, bias, **kw)
    assert layer.weight.shape == (3, 3, 16, 32)
    np.testing.assert_array_equal(layer(x), ref)
    np.testing.assert_array_equal(layer(x[0]), ref[0])  # an unbatched [H, W, C] input
    params = convert.quantize_params({"params": {"kernel": kernel, "bias": bias}})
    np.testing.assert_array_equal(nvlinen.Conv(16, (3, 3), **kw).apply(params, x), ref)


def test_convert_float_conv_models(conv_weights):
    _, _, x = conv_weights
    float_conv = nn.Conv(16, (3, 3), padding="VALID")
    params = float_conv.init(jax.random.key(0), x)
    q = convert.quantize_params(params)
    assert q["params"]["kernel"].shape == (3, 3, 16, 32)
    np.testing.assert_array_equal(
        nvlinen.Conv(16, (3, 3), padding="VALID").apply(q, x),
        _conv_reference(x, params["params"]["kernel"], params["params"]["bias"],
                        padding="VALID"))
    model = nnx.Conv(32, 16, (3, 3), strides=2, rngs=nnx.Rngs(0))
    grouped = nnx.Conv(32, 16, (3, 3), feature_group_count=2, rngs=nnx.Rngs(0))
    converted = convert.quantize_model(model)
    assert isinstance(converted, nvnnx.Conv)
    np.testing.assert_array_equal(
        converted(x), _conv_reference(x, model.kernel[...], model.bias[...], window_strides=(2, 2)))
    assert convert.quantize_model(grouped) is grouped  # NVFP4 conv has no feature groups


def test_conv_qat_gradients_reach_the_master_filter(conv_weights):
    kernel, bias, x = conv_weights
    layer = nvnnx.Conv(32, 16, (3, 3), qat=True, rngs=nnx.Rngs(0))
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)
    assert grads["kernel"][...].shape == (3, 3, 32, 16)
    assert float(jnp.linalg.norm(grads["kernel"][...])) > 0
    np.testing.assert_array_equal(convert.quantize_model(layer)(x), layer(x))


@pytest.mark.parametrize("s_enc", [None, 1500.0])
def test_conv_w4a4_quantizes_activations(conv_weights, s_enc):
    """act_quant on the conv layers: nnx, linen, QAT (forward) and quantize_model's act_s_enc."""
    kernel, bias, x = conv_weights
    ref = _conv_reference(jn.quantize(x, s_enc=s_enc), kernel, bias)
    assert not np.array_equal(ref, _conv_reference(x, kernel, bias))
    layer = nvnnx.Conv.from_float(kernel, bias, act_quant=True, act_s_enc=s_enc)
    np.testing.assert_array_equal(layer(x), ref)
    params = convert.quantize_params({"params": {"kernel": kernel, "bias": bias}})
    np.testing.assert_array_equal(
        nvlinen.Conv(16, (3, 3), act_quant=True, act_s_enc=s_enc).apply(params, x), ref)
    qat = nvnnx.Conv(32, 16, (3, 3), qat=True, act_quant=True, act_s_enc=s_enc, rngs=nnx.Rngs(0))
    qat.kernel[...], qat.bias[...] = kernel, bias
    np.testing.assert_array_equal(qat(x), ref)
    model = nnx.Conv(32, 16, (3, 3), rngs=nnx.Rngs(0))
    model.kernel[...], model.bias[...] = kernel, bias
    converted = convert.quantize_model(model, act_quant=True, act_s_enc=s_enc)
    assert converted.act_quant and converted.act_s_enc == s_enc
    np.testing.assert_array_equal(converted(x), ref)


def test_conv_sharding_names_follow_the_nvfp4_layout(conv_weights):
    _, _, x = conv_weights
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                        (None, None, "embed", "mlp"))
    params = nvlinen.Conv(16, (3, 3), kernel_init=init).init(jax.random.key(0), x)
    specs = nn.get_partition_spec(params)["params"]["kernel"]
    assert specs.codes == P(None, None, "mlp", "embed")
    assert specs.scales == P(None, None, "mlp", "embed", None, None, None)


def test_conv_rejects_bad_arguments(conv_weights):
    _, _, x = conv_weights
    with pytest.raises(ValueError, match="in_features=24"):
        nvnnx.Conv(24, 16, (3, 3), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel_size=\\(3, 3, 3\\)"):
        nvnnx.Conv(32, 16, (3, 3, 3), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="CIRCULAR"):
        nvnnx.Conv(32, 16, (3, 3), padding="CIRCULAR", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="negative padding -1 is not supported"):
        nvnnx.Conv(32, 16, (3, 3), padding=-1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"\[\.\.\., H, W, C\]"):
        nvlinen.Conv(16, (3, 3)).init(jax.random.key(0), jnp.ones((5, 32)))
    for padding in (None, ((1, "x"), (1, 1)), (1, 1, 1)):
        with pytest.raises(ValueError, match="padding=.* must be 'SAME'"):
            nvnnx.Conv(32, 16, (3, 3), padding=padding, rngs=nnx.Rngs(0))
    # Flax reads an int kernel_size as a 1-D kernel: refused, not run as (3, 3)
    with pytest.raises(ValueError, match=r"kernel_size=3 is a 1-D kernel in Flax.*\(3, 3\)"):
        nvnnx.Conv(32, 16, 3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"kernel_size=3 is a 1-D kernel in Flax"):
        nvlinen.Conv(16, 3).init(jax.random.key(0), jnp.ones((1, 4, 4, 32)))


# ---- quantization-aware training ----------------------------------------------------------------

def _regression_problem():
    k1, k2 = jax.random.split(jax.random.key(5))
    x = jax.random.normal(k1, (64, 32))
    target = jnp.tanh(x @ jax.random.normal(k2, (32, 16)) / 4)
    return x, target


def test_nnx_qat_training_reduces_loss_and_converts_bit_exactly():
    x, target = _regression_problem()
    model = nvnnx.Linear(32, 16, qat=True, rngs=nnx.Rngs(0))
    assert isinstance(model.kernel, nnx.Param) and model.kernel.shape == (32, 16)

    def loss_fn(m):
        return jnp.mean((m(x) - target) ** 2)

    @nnx.jit
    def step(m):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        params = nnx.state(m, nnx.Param)
        nnx.update(m, jax.tree.map(lambda p, g: p - 0.5 * g, params, grads))
        return loss

    losses = [float(step(model)) for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0]

    y_qat = model(x)
    inference = convert.quantize_model(model)
    assert isinstance(inference.kernel, nvnnx.NVFP4Kernel)
    np.testing.assert_array_equal(inference(x), y_qat)


def test_linen_qat_training_reduces_loss():
    x, target = _regression_problem()
    model = nvlinen.Dense(16, qat=True, act_quant=True)
    params = model.init(jax.random.key(0), x)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(
        jnp.shape, nn.Dense(16).init(jax.random.key(0), x))

    @jax.jit
    def step(params):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((model.apply(p, x) - target) ** 2))(params)
        return jax.tree.map(lambda p, g: p - 0.5 * g, params, grads), loss

    losses = []
    for _ in range(20):
        params, loss = step(params)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    q = convert.quantize_params(params)
    np.testing.assert_array_equal(nvlinen.Dense(16, act_quant=True).apply(q, x),
                                  model.apply(params, x))


@pytest.mark.parametrize("layer,x", [
    (lambda qat: nvlinen.Dense(32, qat=qat), jnp.ones((2, 32))),  # square: float and NVFP4 fit
    (lambda qat: nvlinen.Conv(16, (3, 3), qat=qat), jnp.ones((1, 5, 5, 16))),
], ids=["dense", "conv"])
def test_linen_layer_refuses_params_of_the_other_mode(layer, x):
    """A linen layer's mode is its `qat` flag: float params given to an inference layer, or
    converted (NVFP4) params given to a QAT layer, raise instead of running the other mode
    (whose shapes can coincide: a square Dense, a conv with as many outputs as inputs)."""
    float_params = layer(True).init(jax.random.key(0), x)
    nvfp4_params = convert.quantize_params(float_params)
    np.testing.assert_array_equal(layer(False).apply(nvfp4_params, x), layer(True).apply(float_params, x))
    # A top-level module has no name: the message starts with its class alone.
    with pytest.raises(TypeError, match=r"^(Dense|Conv): an inference layer \(qat=False\) takes an "
                                        r"NVFP4Array 'kernel'"):
        layer(False).apply(float_params, x)
    with pytest.raises(TypeError, match="^(Dense|Conv): qat=True trains a float 'kernel'"):
        layer(True).apply(nvfp4_params, x)


# ---- conversion -------------------------------------------------------------------------------

class _LinenLM(nn.Module):
    dense: type = nn.Dense

    @nn.compact
    def __call__(self, tokens):
        h = nn.Embed(100, 64, name="embed")(tokens)
        h = nn.relu(self.dense(128, name="fc1")(h))
        h = self.dense(64, name="fc2")(h)
        return nn.Dense(100, name="lm_head")(h)


def test_quantize_params_keeps_structure_and_honours_predicate():
    tokens = jnp.arange(12).reshape(3, 4)
    params = _LinenLM().init(jax.random.key(0), tokens)
    q = convert.quantize_params(params, predicate=convert.skip("lm_head"))
    assert jax.tree.structure(params, is_leaf=lambda v: isinstance(v, jn.NVFP4Array)) == \
        jax.tree.structure(q, is_leaf=lambda v: isinstance(v, jn.NVFP4Array))
    p, qp = params["params"], q["params"]
    assert qp["embed"]["embedding"] is p["embed"]["embedding"]
    assert qp["lm_head"]["kernel"] is p["lm_head"]["kernel"]
    for name in ("fc1", "fc2"):
        assert isinstance(qp[name]["kernel"], jn.NVFP4Array)
        np.testing.assert_array_equal(qp[name]["kernel"].codes.astype(jnp.float32),
                                      jn.quantize(p[name]["kernel"].T).codes.astype(jnp.float32))
        assert qp[name]["bias"] is p[name]["bias"]
    y = _LinenLM(dense=nvlinen.Dense).apply(q, tokens)
    y_float = _LinenLM().apply(params, tokens)
    cos = jnp.sum(y * y_float) / (jnp.linalg.norm(y) * jnp.linalg.norm(y_float))
    assert cos > 0.99


def test_quantize_params_of_an_abstract_tree_is_the_abstract_nvfp4_tree():
    """jax.eval_shape of init (the tree a checkpoint is restored into) converts to the shapes
    and dtypes the concrete conversion has, the predicate honoured."""
    tokens = jnp.arange(12).reshape(3, 4)
    abstract = jax.eval_shape(_LinenLM().init, jax.random.key(0), tokens)
    q = convert.quantize_params(abstract, predicate=convert.skip("lm_head"))
    want = convert.quantize_params(_LinenLM().init(jax.random.key(0), tokens),
                                   predicate=convert.skip("lm_head"))
    assert isinstance(q["params"]["fc1"]["kernel"], jn.NVFP4Array)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), q) == jax.tree.map(lambda a: (a.shape, a.dtype), want)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(q))


def test_quantize_params_keeps_kernels_nvfp4_cannot_hold():
    params = {"a": {"kernel": jnp.ones((24, 8))}, "b": {"kernel": jnp.ones((32, 8))}}
    q = convert.quantize_params(params)
    assert not isinstance(q["a"]["kernel"], jn.NVFP4Array)
    assert isinstance(q["b"]["kernel"], jn.NVFP4Array)


def test_quantize_params_quantizes_scanned_layers_one_by_one():
    class Block(nn.Module):
        dense: type = nn.Dense

        @nn.compact
        def __call__(self, h, _):
            return nn.relu(self.dense(64)(h)), None

    def stack(**kw):
        return nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)(**kw)

    x = jax.random.normal(jax.random.key(1), (4, 64))
    float_params = stack().init(jax.random.key(0), x, None)
    q = convert.quantize_params(float_params, stack_ndim=lambda path, k: 1)
    kernel = q["params"]["Dense_0"]["kernel"]
    assert kernel.shape == (3, 64, 64) and kernel.s_dec.shape == (3,)
    float_kernel = float_params["params"]["Dense_0"]["kernel"]
    for i in range(3):  # each layer as quantize_params quantizes one unstacked layer
        layer = jax.tree.map(lambda a: a[i], kernel)
        want = convert.quantize_params({"kernel": float_kernel[i]})["kernel"]
        for field in ("codes", "scales", "s_dec"):
            np.testing.assert_array_equal(np.asarray(getattr(layer, field), np.float32),
                                          np.asarray(getattr(want, field), np.float32))
    y = stack(dense=nvlinen.Dense).apply(q, x, None)[0]
    assert y.shape == (4, 64) and bool(jnp.isfinite(y).all())
    init = stack(dense=nvlinen.Dense).init(jax.random.key(0), x, None)
    assert jax.tree.map(jnp.shape, init) == jax.tree.map(jnp.shape, q)
    with pytest.raises(ValueError, match="stack_ndim=2"):
        convert.quantize_params(float_params, stack_ndim=lambda path, k: 2)


def test_quantize_params_keeps_the_names_of_a_stack_of_boxed_kernels():
    """A scanned stack whose kernels are boxed (nn.with_partitioning, the stack axis named by
    metadata_params): the NVFP4 tree has the names the NVFP4 layers' own init gives, the stack
    axis's first; a stacked kernel NVFP4 cannot hold stays float in its box."""
    class Block(nn.Module):
        dense: type = nn.Dense
        features: int = 64

        @nn.compact
        def __call__(self, h, _):
            init = nn.with_partitioning(nn.initializers.lecun_normal(), (None, "tp"))
            return nn.relu(self.dense(self.features, kernel_init=init)(h)), None

    def stack(**kw):
        return nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=3,
                       metadata_params={nn.PARTITION_NAME: "layers"})(**kw)

    x = jax.random.normal(jax.random.key(1), (4, 64))
    float_params = stack().init(jax.random.key(0), x, None)
    q = convert.quantize_params(float_params, stack_ndim=lambda path, k: 1)
    own = stack(dense=nvlinen.Dense).init(jax.random.key(0), x, None)
    assert nn.get_partition_spec(q) == nn.get_partition_spec(own)
    kernel = q["params"]["Dense_0"]["kernel"]
    assert kernel.codes.names == ("layers", "tp", None) and kernel.s_dec.shape == (3,)
    unboxed = convert.quantize_params(nn.unbox(float_params), stack_ndim=lambda path, k: 1)
    for got, want in zip(jax.tree.leaves(nn.unbox(q)), jax.tree.leaves(unboxed)):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    narrow = {"kernel": nn.Partitioned(jnp.ones((3, 24, 64)), ("layers", None, "tp"))}
    kept = convert.quantize_params(narrow, stack_ndim=lambda path, k: 1)["kernel"]
    assert isinstance(kept, nn.Partitioned) and kept.names == ("layers", None, "tp")
    assert kept.value.shape == (3, 24, 64)


def test_quantize_params_rejects_bad_in_ndim():
    params = {"a": {"kernel": jnp.ones((16, 4, 4))}}
    with pytest.raises(ValueError, match=r"in_ndim=3 .*\(16, 4, 4\) at a"):
        convert.quantize_params(params, in_ndim=lambda path, k: 3)


class _NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List([nnx.Linear(64, 64, rngs=rngs) for _ in range(2)])
        self.head = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
        for layer in self.layers:
            x = nnx.relu(layer(x))
        return self.head(x)


def test_quantize_model_converts_selected_layers(weights):
    _, _, x = weights
    model = _NnxMLP(nnx.Rngs(0))
    kernels = [layer.kernel[...] for layer in model.layers]
    head_kernel = model.head.kernel
    out = convert.quantize_model(model, predicate=convert.skip("head"))
    assert out is model
    assert all(isinstance(layer, nvnnx.Linear) for layer in model.layers)
    assert type(model.head) is nnx.Linear and model.head.kernel is head_kernel
    for layer, kernel in zip(model.layers, kernels):
        np.testing.assert_array_equal(layer.weight.codes.astype(jnp.float32),
                                      jn.quantize(kernel.T).codes.astype(jnp.float32))
    assert model(x).shape == (3, 5, 10)


def test_quantize_model_keeps_shared_layers_shared_and_reaches_into_containers_and_private_names():
    class Model(nnx.Module):
        def __init__(self):
            self.a = nnx.Linear(32, 32, rngs=nnx.Rngs(0))
            self.b = self.a  # tied
            self._private = nnx.Linear(32, 32, rngs=nnx.Rngs(5))  # nnx visits these too
            self._tied = self.a
            self.in_tuple = nnx.data((nnx.Linear(32, 16, rngs=nnx.Rngs(1)), 3))
            self.in_dict = nnx.data({"p": nnx.Linear(32, 16, rngs=nnx.Rngs(2))})
            self.in_list = nnx.List([nnx.Linear(32, 16, rngs=nnx.Rngs(3))])
            self.stack = nnx.vmap(lambda r: nnx.Linear(32, 32, rngs=r))(nnx.Rngs(4).split(3))

    model = Model()
    assert convert.quantize_model(model) is model
    assert model.a is model.b is model._tied and isinstance(model.a, nvnnx.Linear)
    assert isinstance(model._private, nvnnx.Linear)
    assert isinstance(model.in_tuple[0], nvnnx.Linear) and model.in_tuple[1] == 3
    assert isinstance(model.in_dict["p"], nvnnx.Linear) and isinstance(model.in_list[0], nvnnx.Linear)
    assert isinstance(model.stack, nvnnx.Linear)  # a stack (nnx.vmap): a stack of NVFP4 layers


def test_quantize_model_converts_a_stack_of_layers_made_by_nnx_vmap():
    """Each layer of an nnx.vmap stack (experts, say) is quantized on its own, one s_dec a
    layer; applied under nnx.vmap the stack runs one stacked GEMM and gives each layer's own
    NVFP4 result. Sharding names carry over to the NVFP4 fields, the stack axis's included
    (test_sharded_layers_match_one_device_in_a_child_process splits such a stack)."""
    stack = nnx.vmap(lambda r: nnx.Linear(32, 16, rngs=r))(nnx.Rngs(5).split(3))
    kernels, biases = stack.kernel[...], stack.bias[...]
    x = jax.random.normal(jax.random.key(6), (3, 4, 32))
    q = convert.quantize_model(stack)
    assert isinstance(q, nvnnx.Linear) and q.weight.s_dec.shape == (3,)

    @nnx.vmap(in_axes=(0, 0), out_axes=0)
    def apply(layer, a):
        return layer(a)

    want = np.stack([np.asarray(nvnnx.Linear.from_float(kernels[e], biases[e])(x[e]))
                     for e in range(3)])
    np.testing.assert_array_equal(np.asarray(apply(q, x)), want)
    graphdef, state = nnx.split(q)
    jaxpr = str(jax.make_jaxpr(lambda st, a: apply(nnx.merge(graphdef, st), a))(state, x))
    assert "nvfp4_matmul_stacked" in jaxpr and "scan" not in jaxpr

    with jax.set_mesh(jax.make_mesh((1, 1), ("ep", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)):
        init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "tp"))
        named = nnx.vmap(lambda r: nnx.Linear(32, 16, kernel_init=init, rngs=r),
                         transform_metadata={nnx.PARTITION_NAME: "ep"})(nnx.Rngs(7).split(3))
        qat = nnx.vmap(lambda r: nvnnx.Linear(32, 16, qat=True, kernel_init=init, rngs=r),
                       transform_metadata={nnx.PARTITION_NAME: None})(nnx.Rngs(9).split(3))
        for stack, stack_name in ((named, "ep"), (qat, None)):
            kernel = stack.kernel[...]
            q = convert.quantize_model(stack)
            assert type(q) is nvnnx.Linear and not q.qat
            fields = q.kernel
            assert fields.codes.get_metadata()["out_sharding"] == (stack_name, "tp", None)
            assert fields.scales.get_metadata()["out_sharding"] == (stack_name, "tp") + (None,) * 4
            assert fields.s_dec[...].shape == (3,)  # replicated: no names
            want = jax.vmap(jn.quantize)(jnp.swapaxes(kernel, 1, 2))
            for got, ref in zip(jax.tree.leaves(q.weight), jax.tree.leaves(want)):
                np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
        bias_named = nnx.vmap(  # the bias names its stack axis otherwise than the kernel
            lambda r: nnx.Linear(32, 16, kernel_init=init, rngs=r, bias_init=nnx.with_partitioning(
                nnx.initializers.zeros_init(), ("tp",))),
            transform_metadata={nnx.PARTITION_NAME: "ep"})(nnx.Rngs(12).split(3))
        bias_named.bias.set_metadata(out_sharding=(None, "tp"))
        with pytest.raises(ValueError, match=r"names its stack axes \('ep',\) in the kernel"):
            convert.quantize_model(bias_named)
    convs = nnx.vmap(lambda r: nnx.Conv(32, 16, (3,), rngs=r))(nnx.Rngs(8).split(3))
    assert type(convert.quantize_model(convs)) is nnx.Conv  # 1-D convs: [3, 3, 32, 16] kernels
    qat_convs = nnx.vmap(lambda r: nvnnx.Conv(32, 16, (3, 3), qat=True, rngs=r))(
        nnx.Rngs(10).split(3))
    assert convert.quantize_model(qat_convs).qat  # a stack of convs stays as it is
    nested = nnx.vmap(nnx.vmap(lambda r: nnx.Linear(32, 16, rngs=r)))(nnx.Rngs(11).split((2, 3)))
    assert convert.quantize_model(nested).weight.s_dec.shape == (2, 3)
    # Stacked on axis 1: [in, E, out]. With E == in (64) only the bias ([out, E]) tells.
    for e, use_bias in ((16, False), (16, True), (4, True), (64, True)):
        for cls in (nnx.Linear, functools.partial(nvnnx.Linear, qat=True)):
            odd = nnx.vmap(lambda r: cls(64, 96, use_bias=use_bias, rngs=r), out_axes=1)(
                nnx.Rngs(13).split(e))
            assert convert.quantize_model(odd) is odd, (e, use_bias, cls)  # left as it is


def test_quantize_model_leaves_layers_with_their_own_product_float():
    def my_dot(*args, **kwargs):
        return jax.lax.dot_general(*args, **kwargs)

    layers = [nnx.Linear(32, 16, dot_general=my_dot, rngs=nnx.Rngs(0)),
              nnx.Linear(32, 16, preferred_element_type=jnp.float32, rngs=nnx.Rngs(0)),
              nnx.Conv(16, 16, (3, 3), preferred_element_type=jnp.float32, rngs=nnx.Rngs(0))]
    for layer in layers:
        assert convert.quantize_model(layer) is layer


def test_quantize_model_leaves_the_model_unchanged_when_a_layer_fails(monkeypatch):
    class Model(nnx.Module):
        def __init__(self):
            self.first = nnx.Linear(32, 32, rngs=nnx.Rngs(0))
            self.second = nnx.Linear(32, 16, rngs=nnx.Rngs(1))

    model = Model()
    convert_layer = convert._to_nvfp4

    def failing_on_second(module, *args):  # e.g. a sharding the mesh cannot split
        if module is model.second:
            raise ValueError("cannot convert the second layer")
        return convert_layer(module, *args)

    monkeypatch.setattr(convert, "_to_nvfp4", failing_on_second)
    with pytest.raises(ValueError, match="quantize_model: layer second: cannot convert the second layer"):
        convert.quantize_model(model)
    assert type(model.first) is nnx.Linear and type(model.second) is nnx.Linear


@pytest.mark.parametrize("padding", ["CIRCULAR", "REFLECT", "CAUSAL", -1, ((1, 1), (0, -1))])
def test_quantize_model_leaves_convs_with_other_paddings_float(padding):
    conv = nnx.Conv(16, 8, (3, 3), padding=padding, rngs=nnx.Rngs(0))
    assert convert.quantize_model(conv) is conv


def test_quantize_model_of_a_single_layer(weights):
    kernel, bias, x = weights
    layer = nnx.Linear(IN, OUT, rngs=nnx.Rngs(0))
    layer.kernel[...] = kernel
    layer.bias[...] = bias
    q = convert.quantize_model(layer, act_quant=True, reduce_dtype=jnp.bfloat16)
    assert isinstance(q, nvnnx.Linear) and q.act_quant and q.reduce_dtype == jnp.bfloat16
    qat = nvnnx.Linear(IN, OUT, qat=True, reduce_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert convert.quantize_model(qat).reduce_dtype == jnp.bfloat16  # a QAT layer keeps its own
    np.testing.assert_array_equal(q(x), _reference(x, kernel, bias, x_in=jn.quantize(x)))


# ---- sharding annotations ---------------------------------------------------------------------

def test_nnx_sharding_names_follow_the_nvfp4_layout():
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    with jax.set_mesh(mesh):
        layer = nvnnx.Linear(
            IN, OUT, rngs=nnx.Rngs(0),
            kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), ("data", "model")),
            bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("model",)))
    specs = nnx.get_partition_spec(nnx.state(layer))
    assert specs["kernel"]["codes"].get_value() == P("model", "data")
    assert specs["kernel"]["scales"].get_value() == P("model", "data", None, None, None)
    assert specs["kernel"]["s_dec"].get_value() == P()
    assert specs["bias"].get_value() == P("model")


def test_quantize_model_carries_sharding_over():
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    with jax.set_mesh(mesh):
        layer = nnx.Linear(IN, OUT, rngs=nnx.Rngs(0), kernel_metadata={
            "out_sharding": (None, "model")})
        q = convert.quantize_model(layer)
    specs = nnx.get_partition_spec(nnx.state(q))
    assert specs["kernel"]["codes"].get_value() == P("model", None)


def test_linen_logical_partitioning_follows_the_nvfp4_layout(weights):
    _, _, x = weights
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    params = nvlinen.Dense(OUT, kernel_init=init).init(jax.random.key(0), x)
    specs = nn.get_partition_spec(params)["params"]
    assert specs["kernel"].codes == P("mlp", "embed")
    assert specs["kernel"].scales == P("mlp", "embed", None, None, None)
    assert specs["kernel"].s_dec == P()
    # conversion carries a float model's boxes over the same way
    float_params = nn.Dense(OUT, kernel_init=init).init(jax.random.key(0), x)
    q_specs = nn.get_partition_spec(convert.quantize_params(float_params))["params"]
    assert q_specs["kernel"] == specs["kernel"]


def test_dense_general_names_only_the_outermost_flattened_axis():
    x = jnp.ones((2, 64))
    ok = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "heads", None))
    params = nvlinen.DenseGeneral((4, 8), kernel_init=ok).init(jax.random.key(0), x)
    assert nn.get_partition_spec(params)["params"]["kernel"].codes == P("heads", "embed")
    bad = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", None, "kv"))
    with pytest.raises(ValueError, match="outermost"):
        nvlinen.DenseGeneral((4, 8), kernel_init=bad).init(jax.random.key(0), x)


# Megatron-style MLP on a 2 x 4 mesh of forced CPU devices (Auto axes: the NVFP4 primitives'
# types carry no sharding): the layers' sharding annotations place codes and scales by whole
# tiles, and the forward pass and the gradient equal one-device runs.
_SHARDED_MLP = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from jax_nvfp4.flax import nnx as nvnnx

mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
x = jax.random.normal(jax.random.key(1), (8, 256))
init = nnx.initializers.lecun_normal()
with jax.set_mesh(mesh):
    # Megatron MLP: column-parallel up (512 rows / 4 = whole 128-row tiles), row-parallel down
    # (512 inputs / 4 = whole 64-column tiles)
    up = nvnnx.Linear(256, 512, kernel_init=nnx.with_partitioning(init, (None, "model")),
                      bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("model",)),
                      rngs=nnx.Rngs(0))
    down = nvnnx.Linear(512, 256, kernel_init=nnx.with_partitioning(init, ("model", None)),
                        rngs=nnx.Rngs(1))
    assert up.kernel.codes[...].sharding.spec == P("model", None)
    assert down.kernel.scales[...].sharding.spec == P(None, "model", None, None, None)
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    mlp = lambda x, up, down: down(nnx.relu(up(x)))
    y = nnx.jit(mlp)(xs, up, down)
    g = nnx.jit(jax.grad(lambda x, up, down: jnp.sum(mlp(x, up, down) ** 2)))(xs, up, down)
single = jax.devices()[0]
local = [jax.tree.map(lambda a: jax.device_put(a, single), nnx.state(m)) for m in (up, down)]
up1, down1 = (nnx.merge(nnx.graphdef(m), s) for m, s in zip((up, down), local))
x1 = jax.device_put(x, single)
np.testing.assert_allclose(np.asarray(y), np.asarray(mlp(x1, up1, down1)), rtol=1e-5, atol=1e-5)
g1 = jax.grad(lambda x: jnp.sum(mlp(x, up1, down1) ** 2))(x1)
g, g1 = np.asarray(g), np.asarray(g1)
assert np.linalg.norm(g - g1) < 1e-2 * np.linalg.norm(g1)  # the backward runs in bfloat16

# reduce_dtype=bfloat16 (inference and QAT layers, same weights as `down`): the row-parallel
# partial products are rounded to bfloat16 before the cross-device sum, so y moves from the
# float32 sum by about bfloat16's rounding (XLA:CPU hides the dtype of the collective itself).
with jax.set_mesh(mesh):
    h = nnx.jit(lambda x, up: nnx.relu(up(x)))(xs, up)
    y32 = np.asarray(nnx.jit(lambda h, m: m(h))(h, down), np.float32)
    for qat in (False, True):
        down16 = nvnnx.Linear(512, 256, kernel_init=nnx.with_partitioning(init, ("model", None)),
                              qat=qat, reduce_dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
        y16 = np.asarray(nnx.jit(lambda h, m: m(h))(h, down16), np.float32)
        err = np.linalg.norm(y16 - y32) / np.linalg.norm(y32)
        assert 1e-4 < err < 1e-2, (qat, err)

# An expert stack (nnx.vmap, stack axis named "model": one expert a device; each expert's
# output rows split over "data") converted by quantize_model and placed by its names: applied
# under nnx.vmap it gathers no weight and equals each expert's one-device layer.
from jax_nvfp4.flax import convert
with jax.set_mesh(mesh):
    experts = nnx.vmap(lambda r: nnx.Linear(256, 256, kernel_init=nnx.with_partitioning(init, (None, "data")), rngs=r),
                       transform_metadata={nnx.PARTITION_NAME: "model"})(nnx.Rngs(2).split(4))
    kernels, biases = experts.kernel[...], experts.bias[...]
    q = convert.quantize_model(experts)
    graphdef, state = nnx.split(q)
    q = nnx.merge(graphdef, jax.device_put(state, nnx.get_named_sharding(state, mesh)))
    assert q.kernel.codes[...].sharding.spec == P("model", "data", None)
    xe = jax.device_put(jax.random.normal(jax.random.key(3), (4, 8, 256)), NamedSharding(mesh, P("model")))
    apply = nnx.jit(lambda m, x: nnx.vmap(lambda l, a: l(a), in_axes=(0, 0))(m, x))
    assert "all-gather" not in apply.lower(q, xe).compile().as_text()
    ye = np.asarray(apply(q, xe))
for e in range(4):
    one = nvnnx.Linear.from_float(jax.device_put(kernels[e], single), jax.device_put(biases[e], single))
    np.testing.assert_allclose(ye[e], np.asarray(one(jax.device_put(xe[e], single))), rtol=1e-6, atol=1e-6)

# Splits into parts of scale tiles (the float layer takes them), on Auto and Explicit axes: 48
# output rows over 4 devices (JAX refuses to split the one row tile), and two splits JAX takes
# (the tile counts divide by 4) whose scales could not follow the codes: 400 rows (100 a
# device), 224 inputs (56 a device).
explicit = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
for m in (mesh, explicit):
    with jax.set_mesh(m):
        for n_in, n_out, names in ((64, 48, (None, "model")), (64, 400, (None, "model")),
                                   (224, 256, ("model", None))):
            try:
                nvnnx.Linear(n_in, n_out, kernel_init=nnx.with_partitioning(init, names), rngs=nnx.Rngs(0))
                raise AssertionError(f"a split of {(n_out, n_in)} into parts of tiles was accepted")
            except ValueError as e:
                assert f"({n_out}, {n_in})" in str(e) and "whole 128-row scale tiles" in str(e), e
# The same 400-row split named logically (the variable's sharding_rules, or nnx.logical_axis_rules)
# or with the mesh in the metadata instead of the context: refused too; 512 rows are whole tiles.
import contextlib
rules = (("embed", None), ("mlp", "model"))
for context, kernel_init in (
        (contextlib.nullcontext(), nnx.with_partitioning(init, ("embed", "mlp"), sharding_rules=rules)),
        (nnx.logical_axis_rules(rules), nnx.with_partitioning(init, ("embed", "mlp")))):
    with jax.set_mesh(mesh), context:
        nvnnx.Linear(64, 512, kernel_init=kernel_init, rngs=nnx.Rngs(0))
        try:
            nvnnx.Linear(64, 400, kernel_init=kernel_init, rngs=nnx.Rngs(0))
            raise AssertionError("a logically named split into parts of tiles was accepted")
        except ValueError as e:
            assert "(400, 64)" in str(e) and "whole 128-row scale tiles" in str(e), e
try:
    nvnnx.Linear(64, 400, kernel_init=nnx.with_partitioning(init, (None, "model"), mesh=mesh), rngs=nnx.Rngs(0))
    raise AssertionError("a split into parts of tiles on the metadata's mesh was accepted")
except ValueError as e:
    assert "(400, 64)" in str(e), e
# Explicit axes: a column-parallel layer's output stays split through the relu (its type says
# so), and a row-parallel one takes nnx.Linear's out_sharding.
with jax.set_mesh(explicit):
    up = nvnnx.Linear(256, 512, kernel_init=nnx.with_partitioning(init, (None, "model")), rngs=nnx.Rngs(0))
    down = nvnnx.Linear(512, 256, kernel_init=nnx.with_partitioning(init, ("model", None)), rngs=nnx.Rngs(1))
    xs = jax.device_put(x, NamedSharding(explicit, P("data", None)))
    mlp = nnx.jit(lambda up, down, x: down(nnx.relu(up(x)), out_sharding=P("data", None)))
    y = mlp(up, down, xs)
    assert y.sharding.spec == P("data", None), y.sharding
    assert "all-gather" not in mlp.lower(up, down, xs).compile().as_text()
    conv = nvnnx.Conv(256, 16, (3, 3), kernel_init=nnx.with_partitioning(init, (None, None, "model", None)),
                      rngs=nnx.Rngs(2))  # 64 input channels a device: the sums all-reduced
    images = jax.device_put(jnp.ones((2, 6, 6, 256)), NamedSharding(explicit, P("data", None, None, "model")))
    y = nnx.jit(lambda c, a: c(a, out_sharding=P("data", None, None, None)))(conv, images)
    assert y.sharding.spec == P("data", None, None, None), y.sharding
print("SHARDED_FLAX_OK")
"""


def test_sharded_layers_match_one_device_in_a_child_process():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=8").strip()
    # The bound only guards against a hang (the run takes seconds; it took minutes while XLA:CPU
    # inlined quantize's divisions into the QAT layer's matmul, test_exact_division.py).
    proc = subprocess.run([sys.executable, "-c", _SHARDED_MLP], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "SHARDED_FLAX_OK" in proc.stdout, proc.stderr[-3000:]


# ---- orbax ------------------------------------------------------------------------------------

def test_orbax_round_trip_linen(tmp_path):
    tokens = jnp.arange(12).reshape(3, 4)
    q = convert.quantize_params(_LinenLM().init(jax.random.key(0), tokens),
                                predicate=convert.skip("lm_head"))
    convert.save(tmp_path / "linen", q)
    restored = convert.restore(tmp_path / "linen", jax.eval_shape(lambda: q))
    assert isinstance(restored["params"]["fc1"]["kernel"], jn.NVFP4Array)
    for a, b in zip(jax.tree.leaves(q), jax.tree.leaves(restored)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_flax_serialization_round_trip_linen():
    tokens = jnp.arange(12).reshape(3, 4)
    q = convert.quantize_params(_LinenLM().init(jax.random.key(0), tokens),
                                predicate=convert.skip("lm_head"))
    from flax import serialization
    restored = serialization.from_bytes(q, serialization.to_bytes(q))
    assert isinstance(restored["params"]["fc1"]["kernel"], jn.NVFP4Array)
    for a, b in zip(jax.tree.leaves(q), jax.tree.leaves(restored)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    state = serialization.to_state_dict(q)["params"]["fc1"]["kernel"]
    with pytest.raises(ValueError, match="missing"):
        serialization.from_state_dict(q["params"]["fc1"]["kernel"], {"codes": state["codes"]})


def test_trainable_mask_keeps_an_optimizer_off_the_nvfp4_fields():
    import optax

    tokens = jnp.arange(12).reshape(3, 4)
    q = convert.quantize_params(_LinenLM().init(jax.random.key(0), tokens),
                                predicate=convert.skip("lm_head"))
    model = _LinenLM(dense=nvlinen.Dense)
    loss = lambda p: jnp.mean(model.apply(p, tokens) ** 2)  # noqa: E731
    mask = convert.trainable_mask(q)
    assert mask["params"]["fc1"]["kernel"] is False and mask["params"]["fc1"]["bias"] is True
    assert mask["params"]["lm_head"]["kernel"] is True
    # Adam over the whole tree divides the NVFP4 fields' zero gradients by zero: NaN scales.
    opt = optax.masked(optax.adam(1e-2), mask)
    updates, _ = opt.update(jax.grad(loss)(q), opt.init(q), q)
    p = optax.apply_updates(q, updates)
    assert jnp.isfinite(loss(p)) and loss(p) < loss(q)
    for name in ("fc1", "fc2"):
        for field in ("codes", "scales", "s_dec"):
            np.testing.assert_array_equal(
                np.asarray(getattr(p["params"][name]["kernel"], field), np.float32),
                np.asarray(getattr(q["params"][name]["kernel"], field), np.float32))
    assert not np.array_equal(p["params"]["lm_head"]["kernel"], q["params"]["lm_head"]["kernel"])


def test_orbax_round_trip_nnx(tmp_path, weights):
    _, _, x = weights
    model = convert.quantize_model(_NnxMLP(nnx.Rngs(0)))
    convert.save(tmp_path / "nnx", nnx.state(model))
    abstract = nnx.eval_shape(lambda: convert.quantize_model(_NnxMLP(nnx.Rngs(1))))
    graphdef, abstract_state = nnx.split(abstract)
    restored = nnx.merge(graphdef, convert.restore(tmp_path / "nnx", abstract_state))
    np.testing.assert_array_equal(restored(x), model(x))


# ---- bad arguments ----------------------------------------------------------------------------

def test_numpy_sizes_and_scales_are_taken():
    """Flax takes NumPy integers for sizes; a calibrated scale often arrives as a NumPy float."""
    layer = nvnnx.Linear(np.int64(IN), np.int64(OUT), act_quant=True, act_s_enc=np.float32(2.0),
                         rngs=nnx.Rngs(0))
    assert layer(jnp.ones((2, IN))).shape == (2, OUT)
    with pytest.raises(ValueError, match="in_features=True"):
        nvnnx.Linear(True, OUT, rngs=nnx.Rngs(0))
    x = jnp.ones((1, 6, 6, 16))
    conv = nvnnx.Conv(16, 32, (np.int64(3), np.int64(3)), strides=np.int64(2), rngs=nnx.Rngs(0))
    assert conv.kernel_size == (3, 3) and conv.strides == (2, 2) and conv(x).shape == (1, 3, 3, 32)
    y = nvlinen.Conv(32, (3, 3), strides=(np.int32(2), 2)).init_with_output(jax.random.key(0), x)[0]
    assert y.shape == (1, 3, 3, 32)


def test_none_strides_and_dilation_are_one_as_in_flax():
    x = jax.random.normal(jax.random.key(0), (1, 6, 6, 16))
    float_conv = nnx.Conv(16, 32, (3, 3), strides=None, kernel_dilation=None, rngs=nnx.Rngs(0))
    converted = convert.quantize_model(nnx.clone(float_conv))
    assert isinstance(converted, nvnnx.Conv) and converted.strides == (1, 1)
    assert converted(x).shape == float_conv(x).shape == (1, 6, 6, 32)
    with pytest.raises(ValueError, match="kernel_size=None"):
        nvnnx.Conv(16, 32, None, rngs=nnx.Rngs(0))


def test_from_float_and_layer_arguments_are_checked(weights):
    kernel, bias, _ = weights
    with pytest.raises(ValueError, match=r"Linear.from_float: kernel must be \[in, out\], "
                                         r"got shape \(2, 64, 48\)"):
        nvnnx.Linear.from_float(jnp.stack([kernel, kernel]), bias)
    with pytest.raises(ValueError, match=r"Conv.from_float: kernel must be .*got shape \(64, 48\)"):
        nvnnx.Conv.from_float(kernel, bias)
    with pytest.raises(ValueError, match=r"kernel sharding names \('a', 'b', 'c'\) must name "
                                         r"the kernel's axes"):
        nvnnx.Linear.from_float(kernel, bias, kernel_metadata={"sharding_names": ("a", "b", "c")})
    with pytest.raises(ValueError, match="features must not be empty"):
        nvlinen.DenseGeneral(()).init(jax.random.key(0), jnp.ones((2, IN)))
    with pytest.raises(ValueError, match="input must have rank >= 1, got a scalar"):
        nvlinen.Dense(OUT).init(jax.random.key(0), jnp.float32(1.0))


def test_bad_features_are_rejected(weights):
    with pytest.raises(ValueError, match="in_features=30"):
        nvnnx.Linear(30, OUT, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="0"):
        nvnnx.Linear(IN, 0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"input size \(24,\)"):
        nvlinen.Dense(OUT).init(jax.random.key(0), jnp.ones((2, 24)))
    with pytest.raises(ValueError, match="features"):
        nvlinen.Dense(-3).init(jax.random.key(0), jnp.ones((2, 32)))
    with pytest.raises(ValueError, match=r"axis=\(1, 5\)"):
        nvlinen.DenseGeneral(8, axis=(1, 5)).init(jax.random.key(0), jnp.ones((2, 16, 4)))


def test_bad_inputs_are_rejected(weights):
    kernel, bias, x = weights
    layer = nvnnx.Linear.from_float(kernel, bias)
    with pytest.raises(ValueError, match=r"\(3, 32\) does not end in in_features=64"):
        layer(jnp.ones((3, 32)))
    with pytest.raises(TypeError, match="int32"):
        layer(jnp.ones((3, IN), jnp.int32))
    with pytest.raises(ValueError, match="act_quant=False"):
        nvnnx.Linear(IN, OUT, act_s_enc=100.0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="finite positive"):
        nvlinen.Dense(OUT, act_quant=True, act_s_enc=-1.0).init(jax.random.key(0), x)
    with pytest.raises(TypeError, match="Linear: reduce_dtype must be float32 or bfloat16, got "
                                        "float16"):
        nvnnx.Linear(IN, OUT, reduce_dtype=jnp.float16, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="Conv 'c': reduce_dtype must be float32 or bfloat16"):
        nvlinen.Conv(OUT, (3, 3), reduce_dtype=jnp.int8, name="c").init(jax.random.key(0),
                                                                   jnp.ones((1, 4, 4, IN)))


# ---- demo section -------------------------------------------------------------------------------

def test_demo_section_reports_accuracy_and_memory():
    from jax_nvfp4.flax import demo

    lines = []
    figures = demo.run(lines.append, d_model=64, d_ff=128, vocab=32, tokens=4)
    assert figures["cosine"] > 0.99
    assert figures["max_abs_error"] < 0.1 * figures["max_abs_output"]
    # up [128, 64] and down [64, 128]: bf16 weights -> 4-bit codes, 1 and 2 tiles of 512 E4M3
    # scales, a float32 s_dec each
    saved = 2 * 64 * 128 * 2 - (2 * 64 * 128 // 2 + 3 * 512 + 2 * 4)
    assert figures["bytes_float"] - figures["bytes_nvfp4"] == saved
    assert any("cosine similarity" in line for line in lines)


# ---- epilogue activation ------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ["silu", "swiglu"])
def test_linear_activation_runs_in_the_matmul(weights, activation):
    """nnx Linear and linen Dense with `activation`: matmul(..., activation=) on the transposed,
    quantized kernel; a gated one's kernel has twice the output columns (interleaved gate/up)."""
    kernel, bias, x = weights  # [IN, OUT]: OUT / 2 gated outputs
    out = OUT // 2 if activation == "swiglu" else OUT
    want = jn.matmul(x, jn.quantize(kernel.T), bias=bias, activation=activation,
                     out_dtype=jnp.float32)
    layer = nvnnx.Linear.from_float(kernel, bias, activation=activation)
    assert layer.out_features == out and layer(x).shape == (3, 5, out)
    np.testing.assert_array_equal(layer(x), want)
    dense = nvlinen.Dense(out, activation=activation)
    params = dense.init(jax.random.key(0), x)
    assert params["params"]["kernel"].shape == (OUT, IN) and params["params"]["bias"].shape == (OUT,)
    params["params"]["kernel"], params["params"]["bias"] = jn.quantize(kernel.T), bias
    np.testing.assert_array_equal(dense.apply(params, x), want)
    fresh = nvnnx.Linear(IN, out, activation=activation, rngs=nnx.Rngs(0))
    assert fresh.weight.shape == (OUT, IN) and fresh.bias[...].shape == (OUT,)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_qat_activation_converts_and_trains(weights, activation):
    """A QAT Linear applies the activation to its straight-through result in float32; its
    gradients reach the master kernel; quantize_model keeps the activation, and the inference
    layer gives the QAT forward to float32 rounding."""
    kernel, bias, x = weights
    out = OUT // 2 if activation == "swiglu" else OUT
    qat = nvnnx.Linear(IN, out, qat=True, activation=activation, rngs=nnx.Rngs(0))
    qat.kernel[...], qat.bias[...] = kernel, bias
    want = jn.matmul(x, jn.quantize(kernel.T), bias=bias, activation=activation,
                     out_dtype=jnp.float32)
    np.testing.assert_allclose(qat(x), want, rtol=1e-5, atol=1e-5)
    grad = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(qat)
    assert np.isfinite(grad.kernel[...]).all() and np.abs(grad.kernel[...]).sum() > 0
    inference = convert.quantize_model(nnx.clone(qat))
    assert isinstance(inference.weight, jn.NVFP4Array) and inference.activation == activation
    np.testing.assert_allclose(inference(x), qat(x), rtol=1e-5, atol=1e-5)
    y, _ = nvlinen.Dense(out, qat=True, activation=activation).init_with_output(
        jax.random.key(0), x)
    assert y.shape == (3, 5, out)


def test_bad_activation_is_rejected(weights):
    kernel, bias, x = weights
    with pytest.raises(ValueError, match=r"Linear: activation must be None or one of .*got 'tanh'"):
        nvnnx.Linear(IN, OUT, activation="tanh", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"activation='geglu' needs an even number of kernel "
                                         r"columns \(gate/up pairs\), got kernel shape \(64, 47\)"):
        nvnnx.Linear.from_float(kernel[:, :47], activation="geglu")
    with pytest.raises(ValueError, match=r"Dense 'd': activation must be None or one of"):
        nvlinen.Dense(OUT, activation="tanh", name="d").init(jax.random.key(0), x)
