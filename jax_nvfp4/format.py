"""The NVFP4 storage format: `NVFP4Array` and its scale layouts (docs/quantize.md).

An NVFP4 tensor of logical shape [..., R, K] (contracting axis last, K a multiple of 16) is
  codes   float4_e2m1fn [..., R, K]      (XLA packs two per byte, element 2i in the low nibble)
  scales  float8_e4m3fn [..., ceil(R/128), ceil(K/64), 32, 4, 4]   the tiled layout
  s_dec   float32, shape = a prefix of the leading dims (usually a scalar)
and its value is e2m1(code) * e4m3(scale of the code's 16-block) * s_dec.

The tiled layout: element [rt, kt, i, j, l] is the scale of row rt*128 + j*32 + i and 16-block
kt*4 + l; its row-major bytes are those CUTLASS's Sm1xxBlockScaledConfig<16> reads, padding is
zero. A rank-1 tensor [K] has one row: its scales are [1, ceil(K/64), 32, 4, 4].
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_dtypes
from jax import export
import numpy as np

BLOCK = 16
TILE_ROWS = 128
TILE_K_BLOCKS = 4

CODE_DTYPE = jnp.float4_e2m1fn
SCALE_DTYPE = jnp.float8_e4m3fn
FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
FIELDS = ("codes", "scales", "s_dec")  # NVFP4Array's arrays, in pytree order


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def rows_and_lead(shape) -> tuple[tuple[int, ...], int, int]:
    """Splits a logical shape into (leading dims, rows R, contracting size K)."""
    shape = tuple(shape)
    if len(shape) == 1:
        return (), 1, shape[0]
    return shape[:-2], shape[-2], shape[-1]


def tiled_scales_shape(shape) -> tuple[int, ...]:
    """Shape of the tiled scales of a tensor of logical shape `shape`."""
    lead, rows, k = rows_and_lead(shape)
    return (*lead, _ceil_div(rows, TILE_ROWS), _ceil_div(k // BLOCK, TILE_K_BLOCKS), 32, 4, 4)


def plain_to_tiled(plain):
    """[..., R, K/16] scales -> tiled [..., ceil(R/128), ceil(K/64), 32, 4, 4] (zero padding).

    Works on jax and NumPy arrays. `plain` must have rank >= 2 (use [1, K/16] for one row)."""
    xp = np if isinstance(plain, np.ndarray) else jnp
    *lead, rows, kb = plain.shape
    rt, kt = _ceil_div(rows, TILE_ROWS), _ceil_div(kb, TILE_K_BLOCKS)
    pad = [(0, 0)] * len(lead) + [(0, rt * TILE_ROWS - rows), (0, kt * TILE_K_BLOCKS - kb)]
    padded = xp.pad(plain, pad)
    t = padded.reshape(*lead, rt, 4, 32, kt, 4)  # row = rt*128 + j*32 + i ; block = kt*4 + l
    n = len(lead)
    return t.transpose(*range(n), n, n + 3, n + 2, n + 1, n + 4)  # -> [.., rt, kt, i, j, l]


def tiled_to_plain(tiled, rows: int, k_blocks: int):
    """Tiled scales -> [..., rows, k_blocks] (the padding dropped)."""
    *lead, rt, kt, _, _, _ = tiled.shape
    n = len(lead)
    t = tiled.transpose(*range(n), n, n + 3, n + 2, n + 1, n + 4)  # [.., rt, j, i, kt, l]
    t = t.reshape(*lead, rt * TILE_ROWS, kt * TILE_K_BLOCKS)
    return t[..., :rows, :k_blocks]


_NOT_AN_ARRAY = ("an NVFP4Array is not {what}: read its values with q.dequantize(dtype) (or "
                 "jax_nvfp4.dequantize), its fields with q.codes, q.scales, q.s_dec or q.to_numpy()")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class NVFP4Array:
    """An NVFP4-quantized tensor (a pytree: jit, vmap, device_put and sharding see its fields).

    Make one with `jax_nvfp4.quantize`, `NVFP4Array.from_plain_scales` or
    `NVFP4Array.from_packed`; read it back with `dequantize`."""

    codes: jax.Array
    scales: jax.Array
    s_dec: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape [..., R, K]."""
        return tuple(self.codes.shape)

    @property
    def ndim(self) -> int:
        return len(self.codes.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Storage bytes: 4-bit codes + tiled scales (padding included) + s_dec."""
        return self.size // 2 + math.prod(self.scales.shape) + 4 * math.prod(self.s_dec.shape)

    def validate(self, name: str = "NVFP4Array") -> None:
        """Raises ValueError/TypeError (naming `name`) unless the fields are consistent."""
        for field in FIELDS:
            if not hasattr(getattr(self, field), "dtype"):
                raise TypeError(f"{name}.{field} must be an array, got "
                                f"{type(getattr(self, field)).__name__}")
        if self.codes.dtype != CODE_DTYPE:
            raise TypeError(f"{name}.codes must be float4_e2m1fn, got {self.codes.dtype}")
        if self.scales.dtype != SCALE_DTYPE:
            raise TypeError(f"{name}.scales must be float8_e4m3fn, got {self.scales.dtype}")
        if self.s_dec.dtype != jnp.float32:
            raise TypeError(f"{name}.s_dec must be float32, got {self.s_dec.dtype}")
        check_logical_shape(self.shape, name)
        if tuple(self.scales.shape) != tiled_scales_shape(self.shape):
            raise ValueError(f"{name}.scales has shape {tuple(self.scales.shape)}; codes of shape "
                             f"{self.shape} need tiled scales {tiled_scales_shape(self.shape)}")
        lead, _, _ = rows_and_lead(self.shape)
        g = len(self.s_dec.shape)
        if tuple(self.s_dec.shape) != tuple(lead[:g]) or g > len(lead):
            raise ValueError(f"{name}.s_dec has shape {tuple(self.s_dec.shape)}; it must be a "
                             f"scalar or a prefix of the leading dims {lead}")

    def __array__(self, dtype=None, copy=None):
        # Without this NumPy wraps the dataclass in a 0-d object array, which fails far from here.
        raise TypeError(_NOT_AN_ARRAY.format(what="a NumPy array"))

    def __jax_array__(self):
        raise TypeError(_NOT_AN_ARRAY.format(what="a JAX array"))

    def __eq__(self, other):
        # Field-wise, as the dataclass's own: trees of shapes (jax.tree.map(jnp.shape, params))
        # compare by value. Between arrays that would ask an array for its truth value and fail
        # with "ambiguous", far from the cause: refused here by name.
        if not isinstance(other, NVFP4Array):
            return NotImplemented
        mine, theirs = (tuple(getattr(a, f) for f in FIELDS) for a in (self, other))
        if any(isinstance(v, (jax.Array, np.ndarray)) for v in mine + theirs):
            raise TypeError("NVFP4Array == NVFP4Array is not defined for arrays: compare the "
                            "fields (q.codes, q.scales, q.s_dec, e.g. with jnp.array_equal) or "
                            "the dequantized values")
        return mine == theirs

    def __hash__(self):
        return hash(tuple(getattr(self, f) for f in FIELDS))

    def dequantize(self, dtype=jnp.bfloat16) -> jax.Array:
        """The tensor's values in `dtype` (see `jax_nvfp4.dequantize`)."""
        from jax_nvfp4.quantization import dequantize

        return dequantize(self, dtype)

    def plain_scales(self):
        """Scales in the plain [..., R, K/16] layout (that of jax.nn.scaled_matmul)."""
        lead, rows, k = rows_and_lead(self.shape)
        plain = tiled_to_plain(self.scales, rows, k // BLOCK)
        return plain.reshape(self.shape[:-1] + (k // BLOCK,))

    @classmethod
    def from_plain_scales(cls, codes, scales, s_dec) -> "NVFP4Array":
        """Builds an NVFP4Array from codes [..., K], plain scales [..., K/16] (float8_e4m3fn) and
        s_dec."""
        xp = np if isinstance(scales, np.ndarray) else jnp
        name = "NVFP4Array.from_plain_scales"
        _check_is_array(codes, f"{name}: codes", "float4_e2m1fn")
        _check_is_array(scales, f"{name}: scales", "float8_e4m3fn")
        check_logical_shape(codes.shape, f"{name}: codes")
        if scales.dtype != SCALE_DTYPE:  # converting by value would misread raw scale bytes
            raise TypeError(
                f"{name}: scales must be float8_e4m3fn, got {scales.dtype}; raw scale bytes "
                "(uint8) are reinterpreted with .view(ml_dtypes.float8_e4m3fn) in NumPy or "
                "jax.lax.bitcast_convert_type(scales, jnp.float8_e4m3fn)")
        want = tuple(codes.shape[:-1]) + (codes.shape[-1] // BLOCK,)
        if tuple(scales.shape) != want:  # the tiled check alone would pass a mismatch within a tile
            raise ValueError(f"{name}: codes of shape {tuple(codes.shape)} need plain scales of "
                             f"shape {want}, got {tuple(scales.shape)}")
        plain = scales.reshape(1, -1) if scales.ndim == 1 else scales
        q = cls(codes, plain_to_tiled(plain), xp.asarray(s_dec, xp.float32))
        q.validate()
        return q

    def packed_codes(self):
        """Codes as uint8 [..., K/2]: element 2i in the low nibble, 2i+1 in the high nibble."""
        xp = np if isinstance(self.codes, np.ndarray) else jnp
        if xp is np:
            bits = self.codes.view(np.uint8) & 0xF
        else:
            bits = jax.lax.bitcast_convert_type(self.codes, jnp.uint4).astype(jnp.uint8)
        pairs = bits.reshape(*bits.shape[:-1], bits.shape[-1] // 2, 2)
        return pairs[..., 0] | (pairs[..., 1] << 4)

    @classmethod
    def from_packed(cls, packed, scales, s_dec) -> "NVFP4Array":
        """Inverse of `packed_codes`: packed uint8 codes [..., K/2], plain scales [..., K/16]
        (float8_e4m3fn)."""
        xp = np if isinstance(packed, np.ndarray) else jnp
        _check_is_array(packed, "NVFP4Array.from_packed: packed codes", "uint8")
        if packed.dtype != np.uint8:  # a signed byte's shift would carry its sign into the codes
            raise TypeError(f"NVFP4Array.from_packed: packed codes must be uint8, got {packed.dtype}")
        nibbles = xp.stack([packed & 0xF, packed >> 4], axis=-1).reshape(
            *packed.shape[:-1], 2 * packed.shape[-1])  # sizes given: an empty array has no -1
        if xp is np:
            codes = nibbles.astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
        else:
            codes = jax.lax.bitcast_convert_type(nibbles.astype(jnp.uint4), CODE_DTYPE)
        return cls.from_plain_scales(codes, scales, s_dec)

    def to_numpy(self) -> "NVFP4Array":
        """The same array with NumPy (ml_dtypes) fields, on the host."""
        return NVFP4Array(np.asarray(self.codes), np.asarray(self.scales), np.asarray(self.s_dec))


# jax.export serializes the pytree structure of an exported function's arguments and results.
# A dataclass pytree's auxiliary data is its tuple of static fields: NVFP4Array has none.
export.register_pytree_node_serialization(
    NVFP4Array, serialized_name="jax_nvfp4.NVFP4Array",
    serialize_auxdata=lambda aux: b"", deserialize_auxdata=lambda data: ())


def _check_is_array(value, name: str, dtype: str) -> None:
    """The byte-level constructors read fields by dtype: a list has none to read."""
    if not (hasattr(value, "dtype") and hasattr(value, "shape")):
        raise TypeError(f"{name} must be a NumPy or JAX array of {dtype}, got {type(value).__name__}")


def check_logical_shape(shape, name: str) -> None:
    """Trace-time check that `shape` can be NVFP4: rank >= 1, K a positive multiple of 16."""
    shape = tuple(shape)
    if len(shape) < 1:
        raise ValueError(f"{name} must have rank >= 1 (contracting axis last), got shape {shape}")
    if shape[-1] <= 0 or shape[-1] % BLOCK:
        raise ValueError(f"{name} has contracting (last) dimension {shape[-1]} in shape {shape}; "
                         f"NVFP4 needs a positive multiple of {BLOCK}")


def _dtype_named(dtype, name: str, allowed: str):
    """jnp.dtype(dtype), or a TypeError naming `name` for None or what is not a dtype at all."""
    try:
        if dtype is None:
            raise TypeError
        return jax.dtypes.canonicalize_dtype(dtype)  # as jnp does: `float` is float32 without x64
    except TypeError:
        raise TypeError(f"{name} must be {allowed}, got {dtype!r}") from None


def check_float_dtype(dtype, name: str):
    """`dtype` as JAX canonicalizes it, if it is float32, bfloat16 or float16; else TypeError."""
    dtype = _dtype_named(dtype, name, "float32, bfloat16 or float16")
    if dtype not in [jnp.dtype(d) for d in FLOAT_DTYPES]:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {dtype}")
    return dtype


def as_float_array(value):
    """`value` as a JAX array; a (nested) list of Python numbers is float32, with or without x64
    (as NumPy float64 arrays are without it)."""
    if not hasattr(value, "dtype"):
        return jnp.asarray(value, jnp.float32)
    return jnp.asarray(value)


def output_dtype(out_dtype, op: str):
    """The float dtype an op returns: `out_dtype`, bfloat16 by default."""
    return check_float_dtype(jnp.bfloat16 if out_dtype is None else out_dtype, f"{op}: out_dtype")


# Activations the GEMM epilogue applies after alpha and the bias (reference.activation). The
# gated ones (GLU variants: swiglu = silu(gate) * up, geglu = gelu(gate) * up) take the weight's
# rows in interleaved pairs, 2j the gate and 2j + 1 the up projection of output column j.
GATED_ACTIVATIONS = ("swiglu", "geglu")
ACTIVATIONS = ("relu", "gelu", "silu", *GATED_ACTIVATIONS)


def output_columns(n: int, activation: str) -> int:
    """Columns of an op's output from its weight's N rows: N / 2 with a gated activation."""
    return n // 2 if activation in GATED_ACTIVATIONS else n


def activation_of(activation, op: str) -> str:
    """An op's epilogue activation: one of ACTIVATIONS, or "none" for None."""
    if activation is None:
        return "none"
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be None or one of {ACTIVATIONS}, got "
                         f"{activation!r}")
    return activation


def checked_output(out_dtype, out_s_enc, n: int, activation: str, op: str):
    """An op's output arguments: (the float dtype, bfloat16 by default; None, or with an NVFP4
    output `out_s_enc` as a float32 scalar). An NVFP4 output is quantized from the float32
    epilogue value, so out_dtype has no effect with it, and its columns (N, or N / 2 with a gated
    activation) must be a multiple of BLOCK."""
    dtype = output_dtype(out_dtype, op)
    if out_s_enc is None:
        return dtype, None
    if out_dtype is not None:
        raise ValueError(f"{op}: out_dtype={dtype} has no effect with out_s_enc (the output is "
                         "then an NVFP4Array); pass one of them")
    out_s_enc = checked_s_enc(out_s_enc, f"{op}: out_s_enc")
    if out_s_enc.shape != ():
        raise ValueError(f"{op}: out_s_enc must be a scalar, got shape {out_s_enc.shape}")
    cols = output_columns(n, activation)
    if cols % BLOCK:
        got = f"N / 2 = {cols} (activation={activation!r}, N={n})" if cols != n else f"N={n}"
        raise ValueError(f"{op}: NVFP4 output needs its columns a multiple of {BLOCK}, got {got}")
    return dtype, out_s_enc


def reduce_dtype_of(reduce_dtype, op: str):
    """The dtype a K-sharded op sums its partial products in across devices: `reduce_dtype`,
    float32 by default, or bfloat16 (half the bytes on the links)."""
    dtype = _dtype_named(jnp.float32 if reduce_dtype is None else reduce_dtype, f"{op}: reduce_dtype",
                         "float32 or bfloat16")
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise TypeError(f"{op}: reduce_dtype must be float32 or bfloat16, got {dtype}")
    return dtype


def checked_s_enc(s_enc, name: str):
    """`s_enc` as a float32 array. A host value (Python number, NumPy array or scalar, list or
    tuple) must be real and finite and positive everywhere, else TypeError or ValueError:
    quantizing with it would give NaN (zero, NaN), all zeros (inf) or negative block scales (a
    negative s_enc; Blackwell's MMA reads scales as unsigned). A jax array is not read back (that
    would sync the host with the device): a traced or device-resident scale is the caller's to
    keep positive; only its dtype is checked."""
    def not_real(what):
        what = what if len(what) <= 80 else what[:77] + "..."
        return TypeError(f"{name} must be a real number or float array, got {what}")

    if isinstance(s_enc, jax.Array):
        if not (jnp.issubdtype(s_enc.dtype, jnp.floating) or jnp.issubdtype(s_enc.dtype, jnp.integer)):
            raise not_real(f"a jax array of dtype {s_enc.dtype}")
        return jnp.asarray(s_enc, jnp.float32)
    if isinstance(s_enc, (str, bytes)):
        raise not_real(repr(s_enc))
    try:
        given = np.asarray(s_enc)
        host = given.astype(np.float64) if given.dtype.kind in "iuf" else None
    except (TypeError, ValueError, OverflowError) as err:
        raise not_real(f"{s_enc!r} ({err})") from err
    if host is None:  # bool, complex, object, string
        raise not_real(repr(s_enc))
    # Checked as the float32 it becomes, and its reciprocal (s_dec) too: 1e39 rounds to inf,
    # 1e-50 to 0, and below ~2.9e-39 the reciprocal overflows.
    with np.errstate(over="ignore", divide="ignore"):
        f32 = host.astype(np.float32)
        bad = ~(np.isfinite(f32) & (f32 > 0) & np.isfinite(np.float32(1) / np.where(f32 > 0, f32, 1)))
    if bad.any():
        value = host[bad].flat[0]
        raise ValueError(
            f"{name} must be finite and positive, got {float(value)}"
            + (f" (in an array of shape {host.shape})" if host.ndim else "")
            + ("; it is used as a float32 whose reciprocal (s_dec) must be finite too"
               if np.isfinite(value) and value > 0 else ""))
    return jnp.asarray(f32)


def check_not_nvfp4(value, name: str, hint: str, expected: str = "a float array") -> None:
    """TypeError naming `name` when `expected` (a plain array) is wanted and an NVFP4Array is
    given (JAX would otherwise fail deep inside on its repr)."""
    if isinstance(value, NVFP4Array):
        raise TypeError(f"{name} must be {expected}, got an NVFP4Array of shape {value.shape}; "
                        f"{hint}")


def checked_bias(bias, n: int, op: str):
    """None, or `bias` as a float array of shape (n,) (trace-time errors name the problem)."""
    if bias is None:
        return None
    check_not_nvfp4(bias, f"{op}: bias", "biases stay float")
    bias = as_float_array(bias)
    check_float_dtype(bias.dtype, f"{op}: bias")
    if bias.shape != (n,):
        raise ValueError(f"{op}: bias must have shape ({n},), got {tuple(bias.shape)}")
    return bias


def checked_weight(w, op: str, layout: str, hint: str) -> None:
    """Checks that `w` is a valid NVFP4Array of len(layout) axes (e.g. "[N, K]") with a scalar
    s_dec; `hint` names the function that makes one."""
    if not isinstance(w, NVFP4Array):
        raise TypeError(f"{op}: w must be an NVFP4Array {layout} (see {hint}), got "
                        f"{type(w).__name__}")
    w.validate(f"{op}: w")
    ndim = layout.count(",") + 1
    if w.ndim != ndim or w.s_dec.ndim:
        raise ValueError(f"{op}: w must be a {ndim}-D {layout} NVFP4Array with a scalar s_dec, "
                         f"got shape {w.shape} with s_dec shape {tuple(w.s_dec.shape)}")


def checked_activation(x, op: str):
    """(x, is_nvfp4): `x` as a float array, or an NVFP4Array with a scalar s_dec (both checked)."""
    if isinstance(x, NVFP4Array):
        x.validate(f"{op}: x")
        if x.s_dec.ndim:
            raise ValueError(f"{op}: an NVFP4 x needs a scalar s_dec, got shape {x.s_dec.shape}")
        return x, True
    x = as_float_array(x)
    check_float_dtype(x.dtype, f"{op}: x")
    if x.ndim < 1:
        raise ValueError(f"{op}: x must have rank >= 1 (contracting axis last), got a scalar")
    return x, False
