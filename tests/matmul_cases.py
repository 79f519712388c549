"""Shared pieces of the matmul tests: random operands and a float64 NumPy oracle.

The oracle decodes the NVFP4 operands independently (ml_dtypes for E2M1/E4M3, the plain scale
layout) and multiplies in float64, so it shares no arithmetic with the library's kernels."""

import contextlib
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import jax_nvfp4 as jn
from jax_nvfp4 import reference


@contextlib.contextmanager
def lowering_env(name, value):
    """Environment variable `name` set to `value` (unset for None) for the calls lowered inside
    the block (a path choice is read when a call is lowered): jax's caches are cleared on the way
    in and out, and the old value comes back after."""
    old = os.environ.get(name)

    def put(v):
        if v is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = v
        jax.clear_caches()

    put(value)
    try:
        yield
    finally:
        put(old)


def random_float(shape, dtype, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)


def random_weight(n, k, seed):
    return jn.quantize(random_float((n, k), jnp.float32, seed, 0.05))


def nvfp4_to_f64(q):
    """Value of an NVFP4Array in float64 NumPy: e2m1(code) * e4m3(scale) * s_dec (a stack's
    s_dec [E] scaling its elements)."""
    codes = np.asarray(q.codes).astype(np.float64)
    scales = np.asarray(q.plain_scales()).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    blocks = codes.reshape(*codes.shape[:-1], -1, 16) * scales[..., None]
    s_dec = np.asarray(q.s_dec).astype(np.float64)
    return blocks.reshape(codes.shape) * s_dec.reshape(s_dec.shape + (1,) * (codes.ndim - s_dec.ndim))


def activation_f64(y, name):
    """The epilogue activations in float64 (relu, gelu's tanh approximation, silu; the gated
    ones pair y's interleaved columns: act(y[:, 0::2]) * y[:, 1::2])."""
    if name is None:
        return y
    if name in ("swiglu", "geglu"):
        return activation_f64(y[..., 0::2], "silu" if name == "swiglu" else "gelu") * y[..., 1::2]
    if name == "relu":
        return np.where(y < 0, 0.0, y)
    if name == "gelu":
        return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    if name == "silu":
        return y / (1 + np.exp(-y))
    raise ValueError(name)


def oracle(x, w, bias=None, activation=None):
    """float64 act(x @ w.T (+ bias)) on the dequantized operands."""
    xv = nvfp4_to_f64(x) if isinstance(x, jn.NVFP4Array) else np.asarray(x).astype(np.float64)
    out = xv @ nvfp4_to_f64(w).T
    if bias is not None:
        out = out + np.asarray(bias).astype(np.float64)
    return activation_f64(out, activation)


def rel_error(got, want):
    got = np.asarray(got).astype(np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def assert_close(got, want, tol):
    """Relative Frobenius error <= tol and every element near its reference (no stray values)."""
    got64 = np.asarray(jnp.asarray(got, jnp.float32)).astype(np.float64)
    assert got64.shape == want.shape, (got64.shape, want.shape)
    assert np.all(np.isfinite(got64)), "non-finite values in the output"
    err = rel_error(got64, want)
    assert err <= tol, f"relative Frobenius error {err:.3g} > {tol}"
    # Elementwise: bf16 rounding of the output (2^-8 relative) plus accumulation slack.
    bound = 8 * tol * np.abs(want) + 8 * tol * np.sqrt(np.mean(want ** 2))
    bad = np.abs(got64 - want) > bound
    assert not bad.any(), f"{bad.sum()} elements off, first at {np.argwhere(bad)[0]}"


TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2, jnp.float16: 2e-3}


def quantize_reference_bytes(y, s_enc):
    """(codes bits, tiled scale bits, s_dec) of the reference quantization of float32 y."""
    cpu = jax.devices("cpu")[0]
    codes, scales, s_dec = jax.jit(reference.quantize)(
        jax.device_put(np.asarray(y, np.float32), cpu), jax.device_put(np.float32(s_enc), cpu))
    return (np.asarray(jax.lax.bitcast_convert_type(codes, jnp.uint4)).astype(np.uint8),
            np.asarray(scales).view(np.uint8), np.asarray(s_dec))
