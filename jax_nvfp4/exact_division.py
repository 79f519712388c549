"""Correctly rounded float32 division by integer arithmetic, identical on every XLA backend.

The quantization recipe divides three times (S_enc = 2688/amax, s_dec = 1/S_enc and the block
multiplier 1/(scale * s_dec)), and the CUDA kernels divide with IEEE round-to-nearest-even.
XLA:GPU lowers float32 division to `div.full.f32`, which is not correctly rounded, and XLA:CPU
flushes subnormals; so the pure-JAX reference computes these quotients from the operands' bits:
the significands are divided by restoring long division, then rounded to nearest even."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

_MANT_BITS = 23
_QUOTIENT_BITS = 26  # 24 kept, a round bit, one more for quotients >= 1


def _u32(v):
    return jnp.uint32(v)


def divide(numerator: float, den):
    """float32 `numerator / den`, rounded to nearest even, for a positive normal float32
    constant `numerator` and a float32 array `den`.

    Exact for every normal positive `den` whose quotient is a normal float or overflows (then
    +inf). Zero, subnormal, infinite or NaN divisors, and quotients in the subnormal range, fall
    back to XLA's division: the recipe only meets those in corners (an all-zero block, an amax
    below ~3e-35) that the recipe (docs/quantize.md, Numerics) settles after the division."""
    frac, exp = math.frexp(numerator)  # numerator = num_mant * 2**num_exp, num_mant 24 bits
    num_mant, num_exp = int(frac * (1 << 24)), exp - 24
    if num_mant * 2.0 ** num_exp != numerator or not 1 << 23 <= num_mant < 1 << 24:
        raise ValueError(f"divide: numerator {numerator!r} is not a normal float32 constant")

    den = jnp.asarray(den, jnp.float32)
    bits = lax.bitcast_convert_type(den, jnp.uint32)
    biased = (bits >> _MANT_BITS).astype(jnp.int32)  # sign bit set means den < 0: falls back
    den_mant = (bits & _u32((1 << _MANT_BITS) - 1)) | _u32(1 << _MANT_BITS)

    # Restoring division of the significands: quot = floor(num_mant / den_mant * 2^25).
    rem, quot = jnp.full_like(den_mant, num_mant), jnp.zeros_like(den_mant)
    for _ in range(_QUOTIENT_BITS):
        take = rem >= den_mant
        quot = (quot << 1) | take.astype(jnp.uint32)
        rem = jnp.where(take, rem - den_mant, rem) << 1
    sticky = rem != 0

    big = quot >= _u32(1 << (_QUOTIENT_BITS - 1))  # num_mant/den_mant >= 1: one more integer bit
    shift = jnp.where(big, _u32(2), _u32(1))
    mant = quot >> shift
    round_bit = ((quot >> (shift - 1)) & 1) == 1
    sticky = sticky | ((quot & ((_u32(1) << (shift - 1)) - 1)) != 0)
    mant = mant + (round_bit & (sticky | ((mant & 1) == 1))).astype(jnp.uint32)  # ties to even
    carry = mant >= _u32(1 << (_MANT_BITS + 1))  # rounding carried into a new bit
    mant = jnp.where(carry, mant >> 1, mant)

    den_exp = biased - 127 - _MANT_BITS
    out_biased = num_exp - den_exp - jnp.where(big, 0, 1) + carry.astype(jnp.int32) + 127
    quotient = lax.bitcast_convert_type(
        (jnp.clip(out_biased, 1, 254).astype(jnp.uint32) << _MANT_BITS)
        | (mant & _u32((1 << _MANT_BITS) - 1)), jnp.float32)
    quotient = jnp.where(out_biased >= 255, jnp.float32(jnp.inf), quotient)
    fallback = (biased <= 0) | (biased >= 255) | (out_biased <= 0)
    # Materialized: fused into a consumer (a dequantization, a dot), XLA:CPU took 4-10 minutes to
    # compile this chain of 26 steps, e.g. jit(matmul(x, quantize(w))) on a 256 x 512 weight
    # (2026-11-28, jax 0.11.2); behind the barrier it compiles in under a second.
    return lax.optimization_barrier(jnp.where(fallback, jnp.float32(numerator) / den, quotient))
