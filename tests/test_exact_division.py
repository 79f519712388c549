"""jax_nvfp4.exact_division: correctly rounded float32 quotients from integer arithmetic."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_nvfp4 import exact_division, reference

F32_MAX = np.finfo(np.float32).max


def _divisors(seed):
    """Random positive finite float32 bit patterns (normals and subnormals) plus edge cases."""
    bits = np.random.default_rng(seed).integers(0, 0x7F800000, 200_000, dtype=np.uint32)
    edges = [0, 1e-45, 1.1754942e-38, 1.1754944e-38, 7e-36, 1e-30, 0.5, 1, 6, 448, 2688,
             3e38, F32_MAX]
    return np.concatenate([bits.view(np.float32), np.float32(edges)])


def _normal_cases(num, den):
    """Where the contract promises IEEE results: normal divisor, normal or overflowing quotient."""
    with np.errstate(all="ignore"):
        want = np.float32(num) / den
    ok = (den >= np.finfo(np.float32).tiny) & ((want >= np.finfo(np.float32).tiny) | np.isinf(want))
    return want, ok


@pytest.mark.parametrize("num", [2688.0, 1.0, 6.0])
def test_divide_is_ieee_round_to_nearest_even(num):
    den = _divisors(int(num))
    got = np.asarray(jax.jit(lambda d: exact_division.divide(num, d))(den))
    want, ok = _normal_cases(num, den)
    assert ok.sum() > 100_000
    np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


def test_divide_ties_round_to_even():
    # 1/den with den = 1 + 2^-23 ... quotients just around representable halfway points.
    den = np.float32(1) + np.arange(1, 5000, dtype=np.float32) * np.float32(2.0 ** -23)
    got = np.asarray(exact_division.divide(1.0, den))
    np.testing.assert_array_equal(got.view(np.uint32), (np.float32(1) / den).view(np.uint32))


def test_divide_rejects_a_numerator_float32_cannot_hold():
    with pytest.raises(ValueError, match="numerator 0.1"):
        exact_division.divide(0.1, np.float32(2))


def test_encode_scale_from_amax_matches_the_recipe():
    """S_enc = 2688/amax exactly (IEEE), and 1 for amax == 0 or an overflowing quotient."""
    amax = _divisors(7)
    got = np.asarray(jax.jit(reference.encode_scale_from_amax)(amax))
    with np.errstate(all="ignore"):
        want = np.float32(2688.0) / amax
    want = np.where((amax == 0) | ~np.isfinite(want), np.float32(1), want).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# Quantization fused into its consumer: before the quotients were materialized, XLA:CPU inlined
# the 26-step division chains into the dequantization and took ~4 minutes to compile this program
# (10 for dequantize(quantize(w))); it now takes about a second.
_QUANTIZE_THEN_CONSUME = """
import jax, jax.numpy as jnp
import jax_nvfp4 as jn
w = jnp.ones((256, 512)); x = jnp.ones((8, 512))
jax.jit(lambda x, w: jn.matmul(x, jn.quantize(w))).lower(x, w).compile()
jax.jit(lambda w: jn.dequantize(jn.quantize(w))).lower(w).compile()
print("COMPILED")
"""


def test_quantize_fused_into_its_consumer_compiles_promptly_on_cpu():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # The bound guards against the regression (minutes), not a performance goal.
    proc = subprocess.run([sys.executable, "-P", "-c", _QUANTIZE_THEN_CONSUME], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "COMPILED" in proc.stdout, proc.stderr[-3000:]
