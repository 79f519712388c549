"""S_enc = 6*448 / amax, correctly rounded on every backend.

The partitioned quantize forms S_enc from the all-reduced amax in XLA and hands it to the
quantize kernel, which must then produce the bytes of a one-device run, where the kernel divides
itself (IEEE, round to nearest even). XLA:GPU lowers float32 division to `div.full.f32`, which is
not correctly rounded, so the quotient is computed here by integer long division instead."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_NUM_MANT = 11010048  # 6*448 = 2688 = 11010048 * 2**-12, a 24-bit significand
_NUM_EXP = -12
_MANT_BITS = 23
_QUOTIENT_BITS = 26  # 24 kept, a round bit, one more for quotients >= 1


def _u32(v):
    return jnp.uint32(v)


def encode_scale(amax):
    """float32 S_enc = 2688 / amax rounded to nearest even, or 1 where amax is 0 or the quotient
    overflows (DESIGN.md §2). `amax` is a float32 array of finite values >= 0."""
    amax = jnp.asarray(amax, jnp.float32)
    bits = lax.bitcast_convert_type(amax, jnp.uint32)
    biased = (bits >> _MANT_BITS).astype(jnp.int32)
    den = (bits & _u32((1 << _MANT_BITS) - 1)) | _u32(1 << _MANT_BITS)  # normal: in [2^23, 2^24)

    # Restoring division of the significands: q = floor(num / den * 2^25), r the remainder.
    rem, quot = jnp.full_like(den, _NUM_MANT), jnp.zeros_like(den)
    for _ in range(_QUOTIENT_BITS):
        take = rem >= den
        quot = (quot << 1) | take.astype(jnp.uint32)
        rem = (jnp.where(take, rem - den, rem)) << 1
    sticky = rem != 0

    big = quot >= _u32(1 << (_QUOTIENT_BITS - 1))  # num/den >= 1: one more integer bit
    shift = jnp.where(big, _u32(2), _u32(1))
    mant = quot >> shift
    round_bit = ((quot >> (shift - 1)) & 1) == 1
    sticky = sticky | ((quot & ((_u32(1) << (shift - 1)) - 1)) != 0)
    odd = (mant & 1) == 1
    mant = mant + (round_bit & (sticky | odd)).astype(jnp.uint32)  # ties to even
    carry = mant >= _u32(1 << (_MANT_BITS + 1))  # rounding overflowed into a new bit
    mant = jnp.where(carry, mant >> 1, mant)

    # num/den * 2^(NUM_EXP - amax_exp), amax_exp = biased - 127 - 23, quotient exponent 0 or -1.
    exp = (_NUM_EXP - (biased - 127 - _MANT_BITS) - jnp.where(big, 0, 1) + carry.astype(jnp.int32))
    out_biased = exp + 127
    s_enc = lax.bitcast_convert_type(
        (out_biased.astype(jnp.uint32) << _MANT_BITS) | (mant & _u32((1 << _MANT_BITS) - 1)),
        jnp.float32)
    # amax 0 gives 1; subnormal amax, or a quotient past float32 max, would be +inf: also 1.
    bad = (biased == 0) | (out_biased >= 255)
    return jnp.where(bad, jnp.float32(1.0), s_enc)
