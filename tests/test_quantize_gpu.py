"""The CUDA quantize/dequantize kernels against the XLA reference (skips without a GPU).

The reference runs on the CPU (jitted, its inputs placed there) except for the subnormal cases,
where XLA:CPU flushes to zero and the NumPy recipe of test_quantize.py is the oracle
(docs/quantize.md).
"""

import functools
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_nvfp4
from jax_nvfp4 import reference
from jax_nvfp4.format import NVFP4Array
from jax_nvfp4.primitives._base import ffi_kernel_call
from jax_nvfp4.primitives.quantize import DEQUANTIZE_TARGET, QUANTIZE_TARGET


def _numpy_recipe():
    """The independent NumPy oracle of tests/test_quantize.py (IEEE subnormals, no flushing)."""
    spec = importlib.util.spec_from_file_location(
        "quantize_recipe", Path(__file__).with_name("test_quantize.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.recipe


@pytest.fixture
def kernels(gpu_kernels):
    return gpu_kernels(QUANTIZE_TARGET, DEQUANTIZE_TARGET)


def _on_cpu(fn):
    """fn jitted and run on the CPU backend: its arguments are placed there."""
    jitted = jax.jit(fn)
    return lambda *args: jitted(*jax.device_put(args, jax.devices("cpu")[0]))


_cpu_reference = _on_cpu(reference.quantize)  # (x, s_enc)
_cpu_reference_amax = _on_cpu(reference.quantize)  # (x): S_enc from the amax


def _bytes(codes, scales, s_dec):
    return (np.asarray(jax.lax.bitcast_convert_type(codes, jnp.uint4)).astype(np.uint8),
            np.asarray(scales).view(np.uint8), np.asarray(s_dec).view(np.uint32))


def _check(q: NVFP4Array, expected):
    got = _bytes(q.codes, q.scales, q.s_dec)
    for name, g, e in zip(("codes", "scales", "s_dec"), got, _bytes(*expected)):
        np.testing.assert_array_equal(g, e, err_msg=f"{name} differ from the reference")


def _random(shape, dtype, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


SHAPES = [(16,), (1, 16), (3, 48), (127, 80), (128, 64), (129, 208), (2, 5, 144),
          (2, 3, 257, 16), (300, 1040), (4, 1, 32)]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_quantize_bytes_equal_reference(kernels, shape, dtype):
    x = _random(shape, dtype, seed=sum(shape))
    q = jax.jit(jax_nvfp4.quantize)(jax.device_put(x, kernels))
    _check(q, _cpu_reference_amax(x))
    s = np.float32(123.25)
    q = jax.jit(lambda a: jax_nvfp4.quantize(a, s_enc=s))(jax.device_put(x, kernels))
    _check(q, _cpu_reference(x, s))


@pytest.mark.parametrize("shape", [(0, 32), (2, 0, 48)])
def test_quantize_empty_tensor(kernels, shape):
    x = np.zeros(shape, jnp.bfloat16)
    q = jax.jit(jax_nvfp4.quantize)(jax.device_put(x, kernels))
    _check(q, _cpu_reference_amax(x))
    assert float(q.s_dec) == 1.0


@pytest.mark.parametrize("shape", [(3, 130, 80), (2, 4, 3, 48)])
def test_quantize_groups(kernels, shape):
    x = _random(shape, jnp.bfloat16, seed=1)
    for g in range(1, len(shape) - 1):
        s = np.random.default_rng(g).uniform(1, 900, shape[:g]).astype(np.float32)
        q = jax_nvfp4.quantize(jax.device_put(x, kernels), s_enc=jax.device_put(s, kernels))
        _check(q, _cpu_reference(x, s))


def test_quantize_adversarial(kernels):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    x[0, :16] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2  # exact ties with s_enc = 1
    x[0, 8:16] *= -1
    x[1, :16] = 0.0
    x[2, :16] = -0.0
    x[3, :16] = np.float32(6) * np.exp2(-12)  # E4M3 subnormal scales
    x[4, :16] *= 1e4                            # saturates the block scale at 448
    x[5, 16:32] = np.nan
    x[6, 32] = np.inf
    x[7, 95] = -np.inf
    x[8, :16] = [-1e-3, 6.0] * 8                # -0.001 rounds to a signed zero
    for s in (np.float32(1.0), np.float32(300.0)):
        q = jax_nvfp4.quantize(jax.device_put(x, kernels), s_enc=s)
        _check(q, _cpu_reference(x, s))
    _check(jax_nvfp4.quantize(jax.device_put(x, kernels)), _cpu_reference_amax(x))
    for scale in (1e37, 1e-30):
        with np.errstate(over="ignore"):  # 1e37 overflows the largest entries to inf on purpose
            y = (x * np.float32(scale)).astype(np.float32)
        _check(jax_nvfp4.quantize(jax.device_put(y, kernels)), _cpu_reference_amax(y))
    zeros = np.zeros((130, 64), np.float32)
    _check(jax_nvfp4.quantize(jax.device_put(zeros, kernels)), _cpu_reference_amax(zeros))


@pytest.mark.parametrize("shape", [(1, 16), (4, 4096), (4, 4112), (512, 4096)])
def test_quantize_amax_paths(kernels, shape):
    """Up to 32 KB of input every quantize CTA computes the amax from x itself (1 x 16, and
    4 x 4096 bf16, the largest such input); above, the amax pass leaves one maximum per CTA and
    every quantize CTA reduces them: a few CTAs (4 x 4112) or as many as the pass launches at
    most (512 x 4096, its grid striding over the rest). The largest magnitude sits in the very
    last element, and all-zero input must still give S_enc = 1."""
    x = _random(shape, jnp.bfloat16, seed=11)
    x[-1, -1] = -3000.0
    _check(jax_nvfp4.quantize(jax.device_put(x, kernels)), _cpu_reference_amax(x))
    zeros = np.zeros(shape, jnp.bfloat16)
    _check(jax_nvfp4.quantize(jax.device_put(zeros, kernels)), _cpu_reference_amax(zeros))


def test_quantize_subnormals_match_numpy_recipe(kernels):
    """XLA:CPU flushes subnormals and XLA:GPU's float32 division is not correctly rounded, so
    neither XLA reference is the oracle here: the NumPy recipe is."""
    x = _random((4, 64), np.float32, seed=6, scale=1e-34)
    x[1, :16] = np.float32(3e-39)
    x[2, :16] *= np.float32(1e-5)
    q = jax_nvfp4.quantize(jax.device_put(x, kernels))
    codes, scales, s_dec = _numpy_recipe()(x)
    np.testing.assert_array_equal(np.asarray(q.packed_codes()), codes)
    np.testing.assert_array_equal(np.asarray(q.plain_scales()).view(np.uint8), scales)
    assert np.asarray(q.s_dec).view(np.uint32) == s_dec.view(np.uint32)


def test_quantize_overwrites_poisoned_outputs(kernels):
    """XLA output buffers are uninitialised: run after a kernel that leaves garbage behind."""
    x = _random((129, 80), jnp.bfloat16, seed=7)
    poison = jax.jit(lambda: jnp.full((1 << 20,), 0x7F, jnp.uint8))
    for _ in range(3):
        poison().block_until_ready()
        q = jax.jit(jax_nvfp4.quantize)(jax.device_put(x, kernels))
        _check(q, _cpu_reference_amax(x))  # padding scale entries included: must be zero


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape", [(16,), (129, 208), (2, 3, 48)])
def test_dequantize_equals_reference(kernels, shape, dtype):
    x = _random(shape, np.float32, seed=8)
    x.reshape(-1)[5] = np.nan
    codes, scales, s_dec = _cpu_reference_amax(x)
    on_gpu = [jax.device_put(a, kernels) for a in (codes, scales, s_dec)]
    got = jax.jit(lambda q: jax_nvfp4.dequantize(q, dtype))(NVFP4Array(*on_gpu))
    want = _on_cpu(functools.partial(reference.dequantize, dtype=dtype))(codes, scales, s_dec)
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    np.testing.assert_array_equal(got, want)  # NaN == NaN here; payloads may differ
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert np.isnan(got.reshape(-1)[:16]).all()


def test_dequantize_groups(kernels):
    x = _random((3, 130, 48), np.float32, seed=9)
    s = np.array([2.0, 30.0, 400.0], np.float32)
    codes, scales, s_dec = _cpu_reference(x, s)
    q = NVFP4Array(*[jax.device_put(a, kernels) for a in (codes, scales, s_dec)])
    got = jax_nvfp4.dequantize(q, jnp.float32)
    want = reference.dequantize(codes, scales, s_dec, jnp.float32)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_vmap_on_gpu(kernels):
    x = _random((3, 40, 64), jnp.bfloat16, seed=10)
    qs = jax.jit(jax.vmap(jax_nvfp4.quantize))(jax.device_put(x, kernels))
    for i in range(3):
        _check(jax.tree.map(lambda a: a[i], qs), _cpu_reference_amax(x[i]))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 3e4])
@pytest.mark.parametrize("shape", [(129, 208), (2, 5, 144)])
def test_reference_compiled_for_the_gpu_gives_cpu_bytes(gpu, shape, scale):
    """The XLA reference (what GPUs without a kernel run) divides correctly rounded on XLA:GPU
    too (jax_nvfp4.exact_division), so it matches the CPU reference byte for byte."""
    x = _random(shape, np.float32, seed=len(shape), scale=scale)
    on_gpu = jax.jit(reference.quantize)(jax.device_put(x, gpu))
    _check(NVFP4Array(*on_gpu), _cpu_reference_amax(x))
    s = np.float32(77.7)
    on_gpu = jax.jit(reference.quantize)(jax.device_put(x, gpu), jax.device_put(s, gpu))
    _check(NVFP4Array(*on_gpu), _cpu_reference(x, s))


@pytest.mark.parametrize("target, field, message", [
    (QUANTIZE_TARGET, "codes", "quantize: the codes and tiled scales results do not have the sizes"),
    (QUANTIZE_TARGET, "scales", "quantize: the codes and tiled scales results do not have the sizes"),
    (DEQUANTIZE_TARGET, "scales", "dequantize: the tiled scales or the result do not have the sizes"),
    (DEQUANTIZE_TARGET, "out", "dequantize: the tiled scales or the result do not have the sizes"),
])
def test_the_ffi_handlers_refuse_fields_of_the_wrong_size(kernels, target, field, message):
    """The FFI targets check the sizes of the buffers they write or read beside the ones whose
    shape they take (a direct caller of jax.ffi skips the primitives' checks): one row tile short
    fails the call instead of writing or reading past it."""
    q = jax_nvfp4.quantize(jnp.ones((130, 64), jnp.bfloat16))  # two 128-row scale tiles
    short_scales = jnp.zeros((1, *q.scales.shape[1:]), q.scales.dtype)
    if target == QUANTIZE_TARGET:
        results = {"codes": jax.ShapeDtypeStruct(q.codes.shape, q.codes.dtype),
                   "scales": jax.ShapeDtypeStruct(q.scales.shape, q.scales.dtype),
                   "s_dec": jax.ShapeDtypeStruct((), jnp.float32)}
        results[field] = jax.ShapeDtypeStruct(
            (128, 64) if field == "codes" else short_scales.shape, results[field].dtype)
        call = jax.jit(lambda x: ffi_kernel_call(QUANTIZE_TARGET, list(results.values()), x,
                                                 jnp.zeros((0,), jnp.float32)))
        args = (jnp.ones((130, 64), jnp.bfloat16),)
    else:
        out = jax.ShapeDtypeStruct((128 if field == "out" else 130, 64), jnp.float32)
        call = jax.jit(lambda c, s, d: ffi_kernel_call(DEQUANTIZE_TARGET, [out], c, s, d))
        args = (q.codes, short_scales if field == "scales" else q.scales, q.s_dec)
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(call(*args))
