"""The NVFP4 GEMM primitive (docs/gemm_hopper.md, docs/gemm_blackwell.md).

matmul_p.bind(a, [a_scales, a_s_dec,] b_codes, b_scales, b_s_dec, [bias,] [out_s_enc,]
              a_nvfp4=..., has_bias=..., out_nvfp4=..., out_dtype=..., activation=...)
    a        float [M, K] (W4A16) or float4 codes [M, K] (W4A4, then a_scales/a_s_dec follow)
    b_*      the weight [N, K] as codes, tiled scales, scalar s_dec
    bias     optional [N], any float dtype
    out      float [M, C] of out_dtype; or, with out_nvfp4, the result quantized with the scalar
             out_s_enc: (codes [M, C], tiled scales, s_dec). C = N, or N / 2 with a gated
             activation (format.output_columns)

out = act(s_dec_a * s_dec_b * sum_k a(m, k) * b(n, k) + bias), in float32; act is "none" or one
of format.ACTIVATIONS (reference.activation).

FFI targets (cuda/gemm/): "jax_nvfp4_gemm" (float output) and "jax_nvfp4_gemm_nvfp4_out" (NVFP4
output) both take 8 operands in this order, absent ones as placeholders:
    a, a_scales (e4m3; f8[0] for W4A16), a_s_dec (f32 scalar; 1.0 for W4A16),
    b_codes, b_scales, b_s_dec, bias (f32[0] if none), out_s_enc (f32[0] if float output)
The kernel tells W4A16 from W4A4 by a's element type. Attributes: path (forced_path; on sm_90a an
auto path is lowered as the kernel it picks on the lowering GPU, _extension.settled_attrs) and
activation (ACTIVATION_CODES).

stacked_matmul_p (vmap with the weight batched) takes the same operands and parameters plus
`stacked` (a bool per operand: which carry a leading stack dimension E); its results are stacked.
Its FFI targets "jax_nvfp4_gemm_stacked" / "jax_nvfp4_gemm_nvfp4_out_stacked" take the 8 operands
above and the attribute `stacked` (bit i: FFI operand i is stacked).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching

from jax_nvfp4 import reference
from jax_nvfp4.format import CODE_DTYPE, SCALE_DTYPE, output_columns, tiled_scales_shape
from jax_nvfp4.primitives._base import (ShapedArray, define_primitive, empty_f32, env_choice,
                                        ffi_kernel_call, map_batcher, merge_leading)
from jax_nvfp4.primitives._stacking import (element_aval, register_stacked_rules,
                                            stacked_abstract_eval, stacked_batcher)

GEMM_TARGET = "jax_nvfp4_gemm"
GEMM_NVFP4_OUT_TARGET = "jax_nvfp4_gemm_nvfp4_out"
GEMM_STACKED_TARGET = "jax_nvfp4_gemm_stacked"  # stacked_matmul_p's
GEMM_NVFP4_OUT_STACKED_TARGET = "jax_nvfp4_gemm_nvfp4_out_stacked"

# JAX_NVFP4_GEMM_SM90_PATH=decode|fused|fused_ws|fused_ws_wide|prefill forces one of the Hopper kernel
# families (tests and benchmarks run each on one shape); fused_ws_wide is fused_ws on its 256-row tiles,
# prefill_cutlass prefill with CUTLASS's GEMM where it would take cuBLASLt's. It is read when a call is
# lowered: set it before jit compiles the function (jax.clear_caches() drops compiled ones).
PATH_ENV = "JAX_NVFP4_GEMM_SM90_PATH"
# The FFI attribute of each activation (cuda/gemm/gemm_problem.h, enum Activation).
ACTIVATION_CODES = {"none": 0, "relu": 1, "gelu": 2, "silu": 3, "swiglu": 4, "geglu": 5}
_PATHS = {"": 0, "auto": 0, "decode": 1, "prefill": 2, "fused": 3, "fused_ws": 4, "prefill_cutlass": 5,
          "fused_ws_wide": 6}


def forced_path() -> int:
    """The kernel-family attribute of the FFI call (0: the launcher's choice), from PATH_ENV."""
    return env_choice(PATH_ENV, _PATHS)


def _unpack(args, a_nvfp4, has_bias, out_nvfp4):
    """Names the variadic operands: returns a dict with None for the absent ones."""
    it = iter(args)
    a = next(it)
    a_scales, a_s_dec = (next(it), next(it)) if a_nvfp4 else (None, None)
    b_codes, b_scales, b_s_dec = next(it), next(it), next(it)
    bias = next(it) if has_bias else None
    out_s_enc = next(it) if out_nvfp4 else None
    return dict(a=a, a_scales=a_scales, a_s_dec=a_s_dec, b_codes=b_codes, b_scales=b_scales,
                b_s_dec=b_s_dec, bias=bias, out_s_enc=out_s_enc)


def _out_avals(m, n, out_nvfp4, out_dtype):
    if out_nvfp4:
        return (ShapedArray((m, n), CODE_DTYPE), ShapedArray(tiled_scales_shape((m, n)), SCALE_DTYPE),
                ShapedArray((), jnp.float32))
    return (ShapedArray((m, n), out_dtype),)


def _abstract(*args, a_nvfp4, has_bias, out_nvfp4, out_dtype, activation):
    ops = _unpack(args, a_nvfp4, has_bias, out_nvfp4)
    # The tiled scales of each NVFP4 operand, as its [rows, K] codes need them: the kernels and
    # the reference read them by position.
    for name, codes in (("a", ops["a"] if a_nvfp4 else None), ("b", ops["b_codes"])):
        if codes is not None and tuple(ops[f"{name}_scales"].shape) != tiled_scales_shape(codes.shape):
            raise ValueError(f"nvfp4_matmul: {name}_scales has shape {ops[name + '_scales'].shape}; "
                             f"codes of shape {codes.shape} need {tiled_scales_shape(codes.shape)}")
    cols = output_columns(ops["b_codes"].shape[0], activation)
    return _out_avals(ops["a"].shape[0], cols, out_nvfp4, out_dtype)


def _reference(*args, a_nvfp4, has_bias, out_nvfp4, out_dtype, activation):
    ops = _unpack(args, a_nvfp4, has_bias, out_nvfp4)
    out = reference.matmul(ops["a"], ops["b_codes"], ops["b_scales"], ops["b_s_dec"],
                           a_scales=ops["a_scales"], a_s_dec=ops["a_s_dec"], bias=ops["bias"],
                           activation_name=activation,
                           out_dtype=jnp.float32 if out_nvfp4 else out_dtype)
    if out_nvfp4:  # quantize the float32 epilogue value, as the fused kernels do
        return reference.quantize(out, ops["out_s_enc"])
    return (out,)


FFI_OPERANDS = ("a", "a_scales", "a_s_dec", "b_codes", "b_scales", "b_s_dec", "bias", "out_s_enc")


def _ffi_operands(ops, a_nvfp4, has_bias, out_nvfp4):
    """The 8 operands of the FFI targets, placeholders for the absent ones."""
    return (
        ops["a"],
        ops["a_scales"] if a_nvfp4 else jnp.zeros((0,), SCALE_DTYPE),
        ops["a_s_dec"] if a_nvfp4 else jnp.ones((), jnp.float32),
        ops["b_codes"], ops["b_scales"], ops["b_s_dec"],
        ops["bias"] if has_bias else empty_f32(),
        ops["out_s_enc"] if out_nvfp4 else empty_f32(),
    )


def gemm_kernel(*args, a_nvfp4, has_bias, out_nvfp4, out_dtype, activation="none"):
    """The FFI call of matmul_p's CUDA lowering (also the GEMM that pointwise convs lower to)."""
    ops = _unpack(args, a_nvfp4, has_bias, out_nvfp4)
    m, cols = ops["a"].shape[0], output_columns(ops["b_codes"].shape[0], activation)
    outs = _out_avals(m, cols, out_nvfp4, out_dtype)
    target = GEMM_NVFP4_OUT_TARGET if out_nvfp4 else GEMM_TARGET
    return ffi_kernel_call(target, [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs],
                           *_ffi_operands(ops, a_nvfp4, has_bias, out_nvfp4),
                           path=np.int64(forced_path()),
                           activation=np.int64(ACTIVATION_CODES[activation]))


matmul_p = define_primitive(
    "nvfp4_matmul", abstract_eval=_abstract, reference=_reference, kernel=gemm_kernel,
    ffi_target=lambda out_nvfp4, **_: GEMM_NVFP4_OUT_TARGET if out_nvfp4 else GEMM_TARGET)

def matmul_batcher(prim, fallback=None):
    """vmap rule for `prim` (matmul_p or a wrapper of it with the same operands and params): a
    batched float activation with shared weights folds into M; any other combination goes to
    `fallback` (a batching rule; by default `prim` once per batch element)."""
    others = fallback or map_batcher(prim)

    def rule(args, dims, **params):
        # Common case: a float activation batched, weights shared -> fold the batch into M.
        only_a = dims[0] is not None and all(d is None for d in dims[1:])
        if only_a and not params["a_nvfp4"] and not params["out_nvfp4"]:
            a = jnp.moveaxis(args[0], dims[0], 0)
            b, m, k = a.shape
            (out,) = prim.bind(merge_leading(a, 2), *args[1:], **params)
            return (out.reshape(b, m, out.shape[-1]),), (0,)  # sizes given: b or m may be 0
        return others(args, dims, **params)

    return rule


# --------------------------------------------------------------------------- stacked form
# vmap with the weight batched too (a stack of experts or layers) binds stacked_matmul_p once:
# the CUDA lowering is one FFI call whose handler runs each element's GEMM in turn on the stream,
# reading it in place. A lax.map of matmul_p copied each element's weight out of the stack first
# (XLA materializes a dynamic slice that feeds a custom call): 2.5x the time of the GEMMs at decode.

def _stacked_params(params):
    return {k: v for k, v in params.items() if k != "stacked"}


def _stacked_reference(*args, stacked, **params):
    return jax.vmap(functools.partial(_reference, **params),
                    in_axes=tuple(0 if s else None for s in stacked))(*args)


def _stacked_kernel(*args, stacked, a_nvfp4, has_bias, out_nvfp4, out_dtype, activation):
    ops = _unpack(args, a_nvfp4, has_bias, out_nvfp4)
    flags = _unpack(stacked, a_nvfp4, has_bias, out_nvfp4)
    element = [element_aval(jax.typeof(a)) if s else jax.typeof(a) for a, s in zip(args, stacked)]
    outs = _abstract(*element, a_nvfp4=a_nvfp4, has_bias=has_bias, out_nvfp4=out_nvfp4,
                     out_dtype=out_dtype, activation=activation)
    size = next(a.shape[0] for a, s in zip(args, stacked) if s)
    target = GEMM_NVFP4_OUT_STACKED_TARGET if out_nvfp4 else GEMM_STACKED_TARGET
    return ffi_kernel_call(target, [jax.ShapeDtypeStruct((size, *o.shape), o.dtype) for o in outs],
                           *_ffi_operands(ops, a_nvfp4, has_bias, out_nvfp4),
                           path=np.int64(forced_path()),
                           activation=np.int64(ACTIVATION_CODES[activation]),
                           stacked=np.int64(sum(1 << i for i, name in enumerate(FFI_OPERANDS)
                                                if flags[name])))


stacked_matmul_p = define_primitive(
    "nvfp4_matmul_stacked_inner", abstract_eval=stacked_abstract_eval(matmul_p, _stacked_params),
    reference=_stacked_reference, kernel=_stacked_kernel,
    ffi_target=lambda out_nvfp4, **_: (GEMM_NVFP4_OUT_STACKED_TARGET if out_nvfp4
                                       else GEMM_STACKED_TARGET))
register_stacked_rules(stacked_matmul_p, matmul_p, _stacked_params)

batching.primitive_batchers[matmul_p] = matmul_batcher(matmul_p, stacked_batcher(stacked_matmul_p))
