"""The sm_90a convolution kernels on a GPU against float64, and under compute-sanitizer.

The library picks the kernel (register-A or warp-specialized) by problem; the warp-specialized
ones are also forced (JAX_NVFP4_CONV_SM90_KERNEL) on every case they take."""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_nvfp4 as jn
from jax_nvfp4.primitives import conv as conv_primitive
from jax_nvfp4.primitives._base import ffi_kernel_call

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("conv_cases", HERE / "conv_cases.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)

# Shapes big enough to take the 256-pixel tiles (one and two warpgroups) and ResNet-like ones.
GPU_CASES = {
    **cc.CASES,
    "wide_tiles_k64": (20, 64, 64, 64, 64, 3, 3, (1, 1), "SAME", (1, 1)),
    "wide_tiles_k192_tail": (20, 64, 64, 80, 200, 3, 3, (1, 1), "SAME", (1, 1)),
    "resnet_stage4_b32": (32, 7, 7, 512, 512, 3, 3, (1, 1), "SAME", (1, 1)),
    "7x7_stride2_stem_like": (4, 40, 40, 16, 64, 7, 7, (2, 2), ((3, 3), (3, 3)), (1, 1)),
    "3x3_stride2_k136": (3, 17, 19, 48, 136, 3, 3, (2, 2), "SAME", (1, 1)),
    # More 128 x 256 tiles (203) than SMs: the warp-specialized kernel's CTAs loop over tiles.
    "persistent_56x56_k128": (16, 56, 56, 64, 128, 3, 3, (1, 1), "SAME", (1, 1)),
    # TMA loads: a channel chunk half past C (zero-filled), rows past K, VALID, dilated rows.
    "tma_c96_k136_valid": (3, 13, 17, 96, 136, 3, 3, (1, 1), "VALID", (1, 1)),
    "tma_dil_pads_k128": (2, 15, 23, 32, 128, 3, 3, (1, 1), ((3, 1), (0, 4)), (2, 2)),
    # Other filter widths with TMA loads: 1x7 (one stage), 7x7 over a channel chunk half past C,
    # 5x5 dilated along W to the widest halo the second box holds (8), 1x1 and 7x1.
    "tma_1x7_k136": (4, 9, 17, 64, 136, 1, 7, (1, 1), "SAME", (1, 1)),
    "tma_7x7_c96_k128": (2, 14, 14, 96, 128, 7, 7, (1, 1), "SAME", (1, 1)),
    "tma_5x5_dil2_k200": (2, 11, 19, 64, 200, 5, 5, (1, 1), "SAME", (1, 2)),
    "tma_1x1_c128_k200": (3, 7, 9, 128, 200, 1, 1, (1, 1), "VALID", (1, 1)),
    "tma_7x1_k128": (2, 12, 10, 32, 128, 7, 1, (1, 1), "SAME", (1, 1)),
    # Strided TMA loads (a walk per phase array): 3x3 / 2, 5x5 / 2 over a channel chunk half past
    # C, strides (2, 1) with dilation along W, and a ResNet-like 3x3 / 2.
    "tma_3x3_stride2_k136": (3, 17, 19, 64, 136, 3, 3, (2, 2), "SAME", (1, 1)),
    "tma_5x5_stride2_c96_k128": (2, 13, 15, 96, 128, 5, 5, (2, 2), "SAME", (1, 1)),
    "tma_stride21_dil12_k128": (2, 11, 17, 32, 128, 3, 3, (2, 1), "VALID", (1, 2)),
    "tma_resnet_3x3_stride2_b4": (4, 28, 28, 128, 128, 3, 3, (2, 2), "SAME", (1, 1)),
    # Strided convs whose taps read phase 0 only (one phase array): 1x1 / 2, and 3x3 / 2 dilated 2.
    "tma_1x1_stride2_k136": (2, 15, 17, 64, 136, 1, 1, (2, 2), "VALID", (1, 1)),
    "tma_3x3_stride2_dil2_k128": (2, 13, 15, 32, 128, 3, 3, (2, 2), "SAME", (2, 2)),
    # Enough 1x7 tiles for the library to pick the warp-specialized kernel itself.
    "1x7_inception_b16": (16, 17, 17, 192, 192, 1, 7, (1, 1), "SAME", (1, 1)),
    # A pointwise conv the library runs as the NVFP4 GEMM (where the build has cuBLASLt; forced
    # kernels still take it): 1568 pixels of 256 channels, 200 outputs.
    "pointwise_gemm_c256_k200": (2, 28, 28, 256, 200, 1, 1, (1, 1), "VALID", (1, 1)),
    # With a stride it stays on the conv kernels (strided TMA loads): 2 x 28 x 29 pixels.
    "pointwise_stride2_k136": (2, 55, 57, 256, 136, 1, 1, (2, 2), "VALID", (1, 1)),
    # Grids too small for one wave (small_grid_choice): 8 stages of one tap, which the stage
    # split's consumers run 4 each, unsplit on 64-pixel tiles; 32, which a cluster of 4 such CTAs
    # runs 8 each (16-pixel epilogue passes; the register-A kernel splits them over 8 CTAs).
    "small_grid_1x1_c512_k200": (1, 14, 14, 512, 200, 1, 1, (1, 1), "VALID", (1, 1)),
    "small_grid_1x1_c2048_k512": (1, 7, 7, 2048, 512, 1, 1, (1, 1), "VALID", (1, 1)),
    # ResNet-50's last 3x3 stage at batch 4: 24 stages of 3 taps, over a cluster of 4 stage-split
    # CTAs (64 in all; 128 in clusters of 8 would not fit in one wave).
    "small_grid_3x3_c512_b4": (4, 7, 7, 512, 512, 3, 3, (1, 1), "SAME", (1, 1)),
}

# What the warp-specialized kernels take: S in {1, 3, 5, 7} and K % 8 == 0 (bf16 activations and
# output).
WS_CASES = sorted(name for name, case in GPU_CASES.items()
                  if case[6] in (1, 3, 5, 7) and case[4] % 8 == 0)
# Those they load with TMA: C % 32 == 0 (every stride here is at most the traversal's 8).
TMA_CASES = sorted(name for name in WS_CASES if GPU_CASES[name][3] % 32 == 0)


@pytest.fixture
def forced_kernel(request, monkeypatch):
    """Sets JAX_NVFP4_CONV_SM90_KERNEL to request.param for the test (read at lowering)."""
    monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", request.param)
    jax.clear_caches()
    yield request.param
    jax.clear_caches()


def operands(case, seed, x_dtype=jnp.bfloat16):
    n, h, w, c, k, r, s, *_ = case
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (n, h, w, c), jnp.float32).astype(x_dtype)
    wq = jn.quantize_conv_weight(jax.random.normal(kw, (r, s, c, k), jnp.float32) * 0.1)
    return x, wq


def conv_fn(case, **kw):
    *_, strides, padding, dilation = case
    return jax.jit(lambda x, w, *b: jn.conv(x, w, window_strides=strides, padding=padding,
                                            rhs_dilation=dilation, bias=b[0] if b else None, **kw))


def test_lowers_to_the_kernel(gpu):
    case = cc.CASES["3x3_same"]
    x, w = operands(case, 0)
    assert jn._extension.kernel_available("jax_nvfp4_conv")
    assert "jax_nvfp4_conv" in conv_fn(case).lower(x, w).as_text()


@pytest.mark.parametrize("change, message", [
    (dict(stride_w=0), "strides and dilations must be >= 1 and the padding >= 0"),
    (dict(dil_h=0), "strides and dilations must be >= 1 and the padding >= 0"),
    (dict(bias=jnp.ones((7,), jnp.float32)), "bias must hold K = 24 values"),
    (dict(w_scales=jnp.zeros((10,), jnp.float8_e4m3fn)), "w's scales must be its tiled e4m3 scales"),
    (dict(w_s_dec=jnp.ones((2,), jnp.float32)), "w's scales must be .* s_dec a float32 scalar"),
    (dict(x_scales=jnp.zeros((10,), jnp.float8_e4m3fn)), "x's scales must be its tiled e4m3 scales"),
])
def test_the_ffi_handler_refuses_malformed_operands(gpu, change, message):
    """The conv FFI target checks its attributes and the operands whose sizes the shapes do not
    fix (a direct caller of jax.ffi skips the primitive's checks): a zero stride would divide by
    zero on the host, short scales or bias would be read past their end."""
    if not jn._extension.kernel_available(conv_primitive.CONV_TARGET):
        pytest.skip("no conv kernel for this GPU")
    xq = jn.quantize(jnp.ones((2, 8, 8, 32), jnp.float32))
    w = jn.quantize_conv_weight(jnp.ones((3, 3, 32, 24), jnp.float32))
    ops = dict(x=xq.codes, x_scales=xq.scales, x_s_dec=xq.s_dec, w_codes=w.codes,
               w_scales=w.scales, w_s_dec=w.s_dec, bias=jnp.zeros((0,), jnp.float32))
    attrs = dict(stride_h=1, stride_w=1, pad_h=1, pad_w=1, dil_h=1, dil_w=1, kernel=0, splits=0)
    for key, value in change.items():
        (ops if key in ops else attrs)[key] = value
    out = jax.ShapeDtypeStruct((2, 8, 8, 24), jnp.bfloat16)
    call = jax.jit(lambda *o: ffi_kernel_call(conv_primitive.CONV_TARGET, [out], *o,
                                              **{k: np.int64(v) for k, v in attrs.items()}))
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(call(*ops.values()))


def test_strided_pointwise_conv_stays_on_the_conv_kernels(gpu):
    case = GPU_CASES["pointwise_stride2_k136"]
    x, w = operands(case, 0)
    text = conv_fn(case).lower(x, w).as_text()
    assert "jax_nvfp4_conv" in text and "jax_nvfp4_gemm" not in text


def test_pointwise_conv_lowers_to_the_gemm(gpu, monkeypatch):
    case = GPU_CASES["pointwise_gemm_c256_k200"]
    x, w = operands(case, 0)
    text = conv_fn(case).lower(x, w).as_text()
    # Hopper, and a build with cuBLASLt's GEMM (the one it was timed with)
    if jn._extension.visible_cuda_arch() == "sm_90a" and jn._extension.cublaslt_gemm_calls() is not None:
        assert "jax_nvfp4_gemm" in text and "jax_nvfp4_conv" not in text
    else:
        assert "jax_nvfp4_conv" in text and "jax_nvfp4_gemm" not in text
    for forced in ("register_a", "conv_launcher"):
        monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", forced)
        jax.clear_caches()
        assert "jax_nvfp4_conv" in conv_fn(case).lower(x, w).as_text()
    jax.clear_caches()


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_kernel_matches_float64(gpu, name):
    case = GPU_CASES[name]
    x, w = operands(case, seed=len(name))
    f = conv_fn(case, out_dtype=jnp.float32)
    got = np.asarray(f(x, w))
    want = cc.oracle(x, w, case)
    assert got.shape == want.shape
    assert cc.rel_err(got, want) < 1e-4
    np.testing.assert_array_equal(got, np.asarray(f(x, w)))  # a race would move the result


def check_with_bias_against_float64(name, out_dtype):
    """The forced kernel (or the library's choice) on GPU_CASES[name] with a bias, 2-byte output,
    against float64; a second call must give the same bits (a race would move them)."""
    case = GPU_CASES[name]
    x, w = operands(case, seed=len(name))
    bias = jax.random.normal(jax.random.key(4), (case[4],), jnp.float32)
    f = conv_fn(case, out_dtype=out_dtype)
    got = np.asarray(f(x, w, bias).astype(jnp.float32))
    want = cc.oracle(x, w, case, bias=bias)
    assert got.shape == want.shape
    assert cc.rel_err(got, want) < 1e-2  # the 2-byte output rounding
    np.testing.assert_array_equal(got, np.asarray(f(x, w, bias).astype(jnp.float32)))


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_library_choice_with_bf16_output_matches_float64(gpu, name):
    """With a bf16 output the warp-specialized kernel is a candidate: where the library picks it
    and its stages do not fit in shared memory, the register-A kernel must take over."""
    check_with_bias_against_float64(name, jnp.bfloat16)


@pytest.mark.parametrize("forced_kernel", ["ws128x128", "ws128x256", "ws128x128_cpasync"], indirect=True)
@pytest.mark.parametrize("name", WS_CASES)
def test_warp_specialized_kernel_matches_float64(gpu, forced_kernel, name):
    check_with_bias_against_float64(name, jnp.bfloat16)


# The tilings that need TMA loads (C % 32 == 0).
TMA_ONLY_KERNELS = ["ws128x64", "ws128x112", "ws128x208", "ws64x256", "ws64x416"]


def phase_arrays(name):
    """Phase arrays of a stage of GPU_CASES[name] (conv_sm90_schedule.h): 1 + the largest phase,
    (s * dil_w) mod stride_w, that a tap reads."""
    _, _, _, _, _, _, s, (_, stride_w), _, (_, dil_w) = GPU_CASES[name]
    return 1 + max(tap * dil_w % stride_w for tap in range(s))


def tma_only_takes(kernel, name):
    """Whether TMA-only tiling `kernel` takes GPU_CASES[name]: two 424-slot phase arrays make a
    stage of the 416-pixel split too large for two in shared memory."""
    return kernel != "ws64x416" or phase_arrays(name) == 1


TMA_ONLY_RUNS = [(kernel, name) for kernel in TMA_ONLY_KERNELS for name in TMA_CASES
                 if tma_only_takes(kernel, name)]


@pytest.mark.parametrize("forced_kernel, name", TMA_ONLY_RUNS, indirect=["forced_kernel"])
def test_tma_only_tilings_match_float64(gpu, forced_kernel, name):
    check_with_bias_against_float64(name, jnp.float16)


def stages(name):
    """Pipeline stages of a tile of GPU_CASES[name]: filter rows x 64-channel chunks."""
    _, _, _, c, _, r, *_ = GPU_CASES[name]
    return r * -(-c // 64)


# The 64-channel tilings whose two consumers split the stages (TMA loads).
STAGE_SPLIT_KERNELS = ["ws64x64ks", "ws64x128ks", "ws64x224ks", "ws64x256ks"]


def stage_split_takes(kernel, name, sms, max_smem=227 * 1024):
    """Whether stage-split tiling `kernel` takes GPU_CASES[name]: a mirror of its launcher's
    shared-memory check (ws_layout, ws_min_stages and ws_partial_bytes in conv_sm90_ws_kernel.cuh).
    Four stages of TMA loads (per phase array, the tile's slots and an 8-pixel halo box; the codes
    and scale tiles of S taps), two epilogue tiles, and the partial sums, which share the stage
    ring where every CTA runs one tile."""
    n, h, w, c, k, r, s, strides, padding, dilation = GPU_CASES[name]
    bn = int(kernel.removeprefix("ws64x").removesuffix("ks"))
    (pt, pb), (pl, pr) = cc.explicit_pads((n, h, w, c), r, s, strides, padding, dilation)
    p = (h + pt + pb - (r - 1) * dilation[0] - 1) // strides[0] + 1
    q = (w + pl + pr - (s - 1) * dilation[1] - 1) // strides[1] + 1
    virtual_row = jn._extension._ext.conv_sm90_virtual_row_width(q, w, s, strides[1], pl, dilation[1])
    tiles = -(-(n * p * virtual_row) // bn) * -(-k // 64)
    stage = phase_arrays(name) * (bn + 8) * 128 + s * 64 * 32 + s * 512
    ring = 4 * (stage + -stage % 1024)  # whole swizzle atoms
    partials = bn // 2 * 128 * 4
    separate = 0 if tiles <= sms and partials <= ring else partials
    return ring + 2 * 64 * 72 * 2 + separate + 2 * 4 * 8 <= max_smem


# Every stage-split tiling unsplit on every TMA case, and each split over a cluster (of 4, 2, 3 or
# 4 CTAs) on the cases with a stage per CTA.
STAGE_SPLIT_RUNS = ([(kernel, name) for kernel in STAGE_SPLIT_KERNELS for name in TMA_CASES]
                    + [(f"{kernel}/s{splits}", name) for kernel, splits in zip(STAGE_SPLIT_KERNELS, (4, 2, 3, 4))
                       for name in TMA_CASES if splits <= stages(name)])


@pytest.mark.parametrize("kernel, name", STAGE_SPLIT_RUNS)
def test_stage_split_tilings_match_float64_or_reject(gpu, monkeypatch, kernel, name):
    """Where its stages fit, against float64; where they do not, the forced kernel's error."""
    monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", kernel)
    jax.clear_caches()
    if stage_split_takes(kernel.split("/")[0], name, jax.devices()[0].core_count):
        check_with_bias_against_float64(name, jnp.bfloat16)
    else:
        x, w = operands(GPU_CASES[name], seed=2)
        with pytest.raises(Exception, match="forced warp-specialized"):
            np.asarray(conv_fn(GPU_CASES[name])(x, w))
    jax.clear_caches()


@pytest.mark.parametrize("splits", [1, 2, 3])
@pytest.mark.parametrize("name", TMA_CASES)
def test_stage_split_tilings_give_identical_outputs(gpu, monkeypatch, name, splits):
    """Consumer w sums stages w, w + 2, ... of its CTA's range whatever the tile width, the two
    sums are added once, and (split-K) the CTAs' sums in rank order, so the stage-split tilings
    with the same split agree bit for bit (not with the others, whose float32 sums run in another
    order)."""
    if splits > stages(name):
        pytest.skip("fewer stages than CTAs")
    case = GPU_CASES[name]
    x, w = operands(case, seed=len(name) + 3)
    outs = {}
    suffix = f"/s{splits}" if splits > 1 else ""
    for kernel in STAGE_SPLIT_KERNELS:
        if stage_split_takes(kernel, name, jax.devices()[0].core_count):
            monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", kernel + suffix)
            jax.clear_caches()
            outs[kernel] = np.asarray(conv_fn(case, out_dtype=jnp.bfloat16)(x, w).astype(jnp.float32))
    jax.clear_caches()
    first = outs["ws64x128ks"]
    assert cc.rel_err(first, cc.oracle(x, w, case)) < 1e-2  # the bf16 output rounding
    for kernel, out in outs.items():
        np.testing.assert_array_equal(out, first, err_msg=kernel)


@pytest.mark.parametrize("name", TMA_CASES)
def test_every_warp_specialized_tiling_gives_identical_outputs(gpu, monkeypatch, name):
    """TMA and cp.async producers fill the same stage contents, and every tiling sums a pixel's
    products in the same order (taps, then 16-channel steps), so the outputs match bit for bit."""
    case = GPU_CASES[name]
    x, w = operands(case, seed=len(name) + 1)
    outs = {}
    tma_only = [kernel for kernel in TMA_ONLY_KERNELS if tma_only_takes(kernel, name)]
    for kernel in ["ws128x256_cpasync", "ws128x128", "ws128x256", *tma_only]:
        monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", kernel)
        jax.clear_caches()
        outs[kernel] = np.asarray(conv_fn(case, out_dtype=jnp.bfloat16)(x, w).astype(jnp.float32))
    jax.clear_caches()
    for kernel, out in outs.items():
        np.testing.assert_array_equal(out, outs["ws128x256_cpasync"], err_msg=kernel)


# Split-K over a cluster (the 128-channel TMA tilings), on every TMA case with a stage per CTA.
SPLIT_KERNELS = ["ws128x128/s2", "ws128x256/s2", "ws128x64/s3", "ws128x112/s2", "ws128x208/s4"]
SPLIT_RUNS = [(kernel, name) for kernel in SPLIT_KERNELS for name in TMA_CASES
              if int(kernel.split("/s")[1]) <= stages(name)]


@pytest.mark.parametrize("forced_kernel, name", SPLIT_RUNS, indirect=["forced_kernel"])
def test_split_k_tilings_match_float64(gpu, forced_kernel, name):
    check_with_bias_against_float64(name, jnp.bfloat16)


@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("name", TMA_CASES)
def test_split_k_tilings_give_identical_outputs(gpu, monkeypatch, name, splits):
    """Every CTA of a cluster sums the same stages whatever the tile width, and the partial sums
    meet in rank order, so the split tilings agree bit for bit (not with the unsplit ones, whose
    float32 sums run in another order)."""
    if splits > stages(name):
        pytest.skip("fewer stages than CTAs")
    case = GPU_CASES[name]
    x, w = operands(case, seed=len(name) + 2)
    outs = {}
    for width in (64, 112, 128, 208, 256):
        kernel = f"ws128x{width}/s{splits}"
        monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", kernel)
        jax.clear_caches()
        outs[kernel] = np.asarray(conv_fn(case, out_dtype=jnp.bfloat16)(x, w).astype(jnp.float32))
    jax.clear_caches()
    first = outs[f"ws128x64/s{splits}"]
    assert cc.rel_err(first, cc.oracle(x, w, case)) < 1e-2  # the bf16 output rounding
    for kernel, out in outs.items():
        np.testing.assert_array_equal(out, first, err_msg=kernel)


@pytest.mark.parametrize("name, kernel", [("small_grid_1x1_c512_k200", "ws64x64ks"),
                                          ("small_grid_1x1_c2048_k512", "ws64x64ks/s4"),
                                          ("small_grid_3x3_c512_b4", "ws64x128ks/s4"),
                                          ("resnet_stage4_b32", "ws64x256ks/s2")])
def test_library_picks_the_stage_split_tilings(gpu, monkeypatch, name, kernel):
    """The library's choice (choose_kernel and, for grids too small for one wave,
    small_grid_choice in cuda/conv/sm90/conv_sm90.cu), seen through the summation order: its
    output matches `kernel` forced bit for bit, and the register-A kernel's differs (so the check
    can tell them apart)."""
    case = GPU_CASES[name]
    x, w = operands(case, seed=len(name) + 4)
    outs = {}
    for forced in ("", kernel, "register_a"):
        monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", forced)
        jax.clear_caches()
        outs[forced] = np.asarray(conv_fn(case)(x, w).astype(jnp.float32))
    jax.clear_caches()
    assert cc.rel_err(outs[""], cc.oracle(x, w, case)) < 1e-2  # the bf16 output rounding
    np.testing.assert_array_equal(outs[""], outs[kernel])
    assert not np.array_equal(outs[kernel], outs["register_a"])


# Grids of more tiles than SMs, where choose_kernel weighs every tiling by its busiest SM's
# stages and tiles: 28x28x192 at batch 64 (H100: the pixel split, 64-channel tiles, as K = 192
# would leave a 128-channel tile half empty) and 14x14x384 at batch 64 (the stage split on
# persistent CTAs, its partial sums beside the ring).
@pytest.mark.parametrize("case", [(64, 28, 28, 192, 192, 3, 3, (1, 1), "SAME", (1, 1)),
                                  (64, 14, 14, 384, 384, 3, 3, (1, 1), "SAME", (1, 1))],
                         ids=["28x28x192_b64", "14x14x384_b64"])
def test_library_choice_past_one_wave(gpu, monkeypatch, case):
    """The library's choice on this GPU (conv_sm90_kernel_choice with its SM count) gives the
    bits of that tiling forced, and matches float64."""
    n, h, w_, c, k, r, s, *_ = case
    kernel, splits, *_ = jn._extension._ext.conv_sm90_kernel_choice(
        n, h, w_, c, k, r, s, 1, h, w_, 1, 1, sms=jax.devices()[0].core_count)
    name = next(key for key, value in conv_primitive._KERNELS.items() if value == kernel and key)
    x, w = operands(case, seed=n + c)
    outs = {}
    for forced in ("", name + (f"/s{splits}" if splits > 1 else "")):
        monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", forced)
        jax.clear_caches()
        outs[forced] = np.asarray(conv_fn(case)(x, w).astype(jnp.float32))
    jax.clear_caches()
    auto, forced_out = outs.values()
    assert name.startswith("ws")
    np.testing.assert_array_equal(auto, forced_out)
    assert cc.rel_err(auto, cc.oracle(x, w, case)) < 1e-2  # the bf16 output rounding


# (N, H = W, C, K, R = S) with 'SAME' padding, a forced tiling, and whether its launch pushes.
_PUSH_PLANS = [
    ((32, 7, 512, 512, 3), "ws64x224ks/s2", True),  # ResNet 7x7x512 b32: the library's choice
    ((32, 7, 512, 512, 3), "ws64x128ks/s2", True),
    ((32, 7, 512, 512, 3), "ws64x224ks", False),  # unsplit
    ((32, 7, 512, 512, 3), "ws64x224ks/s4", False),  # over four CTAs: the cluster reads
    ((32, 7, 512, 512, 3), "ws128x128/s2", False),  # 128-channel split-K: the cluster reads
    ((8, 7, 512, 512, 1), "ws64x224ks/s2", True),  # a 1x1 filter
    ((8, 7, 512, 512, 1), "ws64x256ks/s2", False),  # 1-wide, 256 pixels: compiled out (it spilled)
]


@pytest.mark.parametrize("shape, kernel, pushes", _PUSH_PLANS,
                         ids=[f"{k}_{r}x{r}" for (*_, r), k, _ in _PUSH_PLANS])
def test_split_k_pushes_sums_where_the_inbox_fits(gpu, shape, kernel, pushes):
    """Split over two CTAs with the stage split, each CTA pushes its sums into the owner's
    shared memory where the launcher finds room for the inbox; elsewhere the owners read them
    through the cluster window. Both give the same bits, so the launcher's plan is what tells
    them apart (from 48bb566 to a569deb no launch got an inbox)."""
    n, hw, c, k, r = shape
    name, _, splits = kernel.partition("/s")
    smem, stages, pushed = jn._extension._ext.conv_sm90_ws_plan(
        n, hw, hw, c, k, r, r, 1, hw, hw, (r - 1) // 2, (r - 1) // 2, conv_primitive._KERNELS[name],
        int(splits or 1))
    assert pushed == pushes
    assert stages == 4  # four stages fit at every tiling here
    assert 0 < smem <= 232448  # an H100's or H200's opt-in shared memory a block


@pytest.mark.parametrize("forced_kernel", ["ws128x128/s4"], indirect=True)
def test_split_k_rejects_more_ctas_than_stages(gpu, forced_kernel):
    case = GPU_CASES["wide_tiles_k64"]  # 3 filter rows x 1 channel chunk
    x, w = operands(case, seed=2)
    with pytest.raises(Exception, match="forced warp-specialized"):
        np.asarray(conv_fn(case)(x, w))


@pytest.mark.parametrize("forced_kernel", TMA_ONLY_KERNELS + STAGE_SPLIT_KERNELS, indirect=True)
def test_tma_only_tilings_reject_problems_without_tma_loads(gpu, forced_kernel):
    case = GPU_CASES["3x3_stride2_k136"]  # C = 48: code rows of 24 bytes, not TMA's 16-byte units
    x, w = operands(case, seed=2)
    with pytest.raises(Exception, match="forced warp-specialized"):
        np.asarray(conv_fn(case)(x, w))


@pytest.mark.parametrize("forced_kernel", ["ws64x416"], indirect=True)
def test_wide_pixel_split_rejects_two_phase_arrays(gpu, forced_kernel):
    """Its stages would not fit in shared memory (tma_only_takes); the library's own choice takes
    the 256-pixel split there."""
    assert phase_arrays("tma_3x3_stride2_k136") == 2
    case = GPU_CASES["tma_3x3_stride2_k136"]
    x, w = operands(case, seed=2)
    with pytest.raises(Exception, match="forced warp-specialized"):
        np.asarray(conv_fn(case)(x, w))


@pytest.mark.parametrize("forced_kernel", ["ws128x256"], indirect=True)
def test_warp_specialized_kernel_rejects_what_it_does_not_take(gpu, forced_kernel):
    case = cc.CASES["3x3_same"]
    x, w = operands(case, seed=2)
    with pytest.raises(Exception, match="forced warp-specialized"):
        np.asarray(conv_fn(case, out_dtype=jnp.float32)(x, w))  # float32 output
    case = (2, 9, 9, 32, 24, 2, 2, (1, 1), "SAME", (1, 1))  # S = 2: no compiled tap loop
    x, w = operands(case, seed=3)
    with pytest.raises(Exception, match="forced warp-specialized"):
        np.asarray(conv_fn(case)(x, w))


def test_unknown_forced_kernel_is_rejected_at_trace_time(gpu, monkeypatch):
    monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", "fastest")
    case = cc.CASES["3x3_same"]
    x, w = operands(case, seed=2)
    with pytest.raises(ValueError, match="JAX_NVFP4_CONV_SM90_KERNEL.*'fastest'"):
        conv_fn(case).lower(x, w)


@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.float16, "nvfp4"])
@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_activation_and_output_dtypes_with_bias(gpu, x_dtype, out_dtype):
    case = cc.CASES["5x5_c_k_tails"]
    x, w = operands(case, seed=11, x_dtype=jnp.float32 if x_dtype == "nvfp4" else x_dtype)
    if x_dtype == "nvfp4":
        x = jn.quantize(x)
    bias = jax.random.normal(jax.random.key(3), (case[4],), jnp.float32)
    got = conv_fn(case, out_dtype=out_dtype)(x, w, bias)
    assert got.dtype == out_dtype
    want = cc.oracle(x, w, case, bias=bias)
    # float32/float16 activations are rounded to bf16 for the tensor cores.
    tol = 1e-4 if x_dtype == "nvfp4" and out_dtype == jnp.float32 else 1e-2
    assert cc.rel_err(got, want) < tol


@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, "nvfp4"])
def test_empty_batch(gpu, x_dtype):
    w = jn.quantize_conv_weight(jax.random.normal(jax.random.key(4), (3, 3, 32, 48), jnp.float32))
    x = jnp.zeros((0, 9, 9, 32), jnp.bfloat16)
    got = jax.jit(lambda a: jn.conv(a, w, padding="SAME"))(jn.quantize(x) if x_dtype == "nvfp4" else x)
    assert got.shape == (0, 9, 9, 48)


def test_vmap_on_gpu(gpu):
    case = cc.CASES["many_small_images"]
    x, w = operands(case, seed=5)
    xs = jnp.stack([x, 2 * x])
    *_, strides, padding, dilation = case
    got = jax.jit(jax.vmap(lambda a: jn.conv(a, w, window_strides=strides, padding=padding,
                                             rhs_dilation=dilation, out_dtype=jnp.float32)))(xs)
    assert cc.rel_err(got[1], cc.oracle(xs[1], w, case)) < 1e-4


MEMCHECK_PROGRAM = textwrap.dedent("""
    import os
    import jax, jax.numpy as jnp, numpy as np
    import jax_nvfp4 as jn
    x = jax.random.normal(jax.random.key(0), (3, 5, 7, 48), jnp.float32).astype(jnp.bfloat16)
    w = jn.quantize_conv_weight(jax.random.normal(jax.random.key(1), (5, 3, 48, 70)))
    for xi in (x, jn.quantize(x.astype(jnp.float32))):
        y = jn.conv(xi, w, window_strides=(2, 1), padding=((2, 1), (1, 2)), rhs_dilation=(1, 2),
                    bias=jnp.ones((70,)), out_dtype=jnp.float32)
        assert np.isfinite(np.asarray(y)).all()
    # The warp-specialized kernel on channel and pixel tails (K = 200, C = 80).
    os.environ["JAX_NVFP4_CONV_SM90_KERNEL"] = "ws128x128"
    x = jax.random.normal(jax.random.key(2), (3, 11, 13, 80), jnp.float32).astype(jnp.bfloat16)
    w = jn.quantize_conv_weight(jax.random.normal(jax.random.key(3), (3, 3, 80, 200)))
    y = jn.conv(x, w, window_strides=(2, 1), padding="SAME", bias=jnp.ones((200,)))
    assert np.isfinite(np.asarray(y.astype(jnp.float32))).all()
    # Its TMA loads (stride 1, C = 96: a channel chunk half past C), every TMA tiling.
    x = jax.random.normal(jax.random.key(4), (3, 11, 13, 96), jnp.float32).astype(jnp.bfloat16)
    w = jn.quantize_conv_weight(jax.random.normal(jax.random.key(5), (3, 3, 96, 200)))
    for kernel in ("ws128x128", "ws128x64", "ws128x208", "ws64x256", "ws64x416", "ws128x128/s2",
                   "ws128x256/s3", "ws64x128ks", "ws64x224ks"):
        os.environ["JAX_NVFP4_CONV_SM90_KERNEL"] = kernel
        jax.clear_caches()
        y = jn.conv(x, w, padding="SAME", rhs_dilation=(2, 1), bias=jnp.ones((200,)))
        assert np.isfinite(np.asarray(y.astype(jnp.float32))).all()
    # Other filter widths: 7x7 and 1x7, and 5x5 and 3x3 with stride 2 (TMA loads).
    os.environ["JAX_NVFP4_CONV_SM90_KERNEL"] = "ws128x128"
    for r, s, stride in ((7, 7, 1), (1, 7, 1), (5, 5, 2), (3, 3, 2)):
        w = jn.quantize_conv_weight(jax.random.normal(jax.random.key(6), (r, s, 96, 136)))
        jax.clear_caches()
        y = jn.conv(x, w, window_strides=(stride, stride), padding="SAME", bias=jnp.ones((136,)))
        assert np.isfinite(np.asarray(y.astype(jnp.float32))).all()
    print("MEMCHECK-DONE")
""")


def test_compute_sanitizer_memcheck_tail_heavy_shape(gpu, tmp_path):
    sanitizer = shutil.which("compute-sanitizer") or (
        "/usr/local/cuda/bin/compute-sanitizer"
        if os.path.exists("/usr/local/cuda/bin/compute-sanitizer") else None)
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found")
    script = tmp_path / "memcheck_conv.py"
    script.write_text(MEMCHECK_PROGRAM)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    res = subprocess.run([sanitizer, "--tool", "memcheck", "--kernel-name", "kns=conv_sm90",
                          "--error-exitcode", "3", sys.executable, "-P", str(script)],
                         capture_output=True, text=True, env=env, timeout=400)
    assert "MEMCHECK-DONE" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.returncode == 0, res.stdout[-3000:]
    assert "ERROR SUMMARY: 0 errors" in res.stdout
