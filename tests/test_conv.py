"""jax_nvfp4.conv on the CPU (reference path), its trace-time checks, batching, the sm_90a tile
schedule emulated on the host, and the sm_90a kernel's SASS."""

import collections
import importlib.util
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_nvfp4 as jn

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("conv_cases", HERE / "conv_cases.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)

SCHEDULE = HERE / "host" / "conv_sm90_schedule_test.cc"


# Float32 tolerances on the CPU reference path; the kernel's own tests are test_conv_gpu.py.
pytestmark = pytest.mark.usefixtures("on_cpu")


def make_operands(case, seed=0, x_dtype=jnp.float32):
    n, h, w, c, k, r, s, *_ = case
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (n, h, w, c), jnp.float32).astype(x_dtype)
    wq = jn.quantize_conv_weight(jax.random.normal(kw, (r, s, c, k), jnp.float32) * 0.1)
    return x, wq


def run_conv(x, w, case, **kw):
    *_, strides, padding, dilation = case
    return jn.conv(x, w, window_strides=strides, padding=padding, rhs_dilation=dilation, **kw)


@pytest.mark.parametrize("name", sorted(cc.CASES))
def test_conv_matches_float64_direct_convolution(name):
    case = cc.CASES[name]
    x, w = make_operands(case, seed=len(name))
    got = run_conv(x, w, case, out_dtype=jnp.float32)
    want = cc.oracle(x, w, case)
    assert got.shape == want.shape
    assert cc.rel_err(got, want) < 1e-5


@pytest.mark.parametrize("padding", ["SAME", "VALID", "SAME_LOWER", ((3, 1), (0, 2))])
@pytest.mark.parametrize("strides,dilation", [((1, 1), (1, 1)), ((2, 2), (1, 1)), ((1, 2), (2, 1))])
def test_padding_and_shape_like_lax(padding, strides, dilation):
    case = (2, 11, 10, 16, 8, 3, 5, strides, padding, dilation)
    x, w = make_operands(case, seed=3)
    got = run_conv(x, w, case, out_dtype=jnp.float32)
    w_hwio = jnp.transpose(jn.dequantize(w, jnp.float32), (0, 1, 3, 2))
    want = lax.conv_general_dilated(x, w_hwio, strides, padding, rhs_dilation=dilation,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    precision=lax.Precision.HIGHEST)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_nvfp4_activations_bias_and_out_dtype():
    case = cc.CASES["5x5_c_k_tails"]
    x, w = make_operands(case, seed=5)
    xq = jn.quantize(x)
    bias = jax.random.normal(jax.random.key(9), (case[4],), jnp.float32)
    got = run_conv(xq, w, case, bias=bias.astype(jnp.bfloat16), out_dtype=jnp.float16)
    assert got.dtype == jnp.float16
    want = cc.oracle(xq, w, case, bias=np.asarray(bias.astype(jnp.bfloat16), np.float64))
    assert cc.rel_err(got, want) < 2e-3


def test_default_output_is_bfloat16_and_float_inputs_of_every_dtype():
    case = cc.CASES["3x3_same"]
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        x, w = make_operands(case, seed=1, x_dtype=dtype)
        got = run_conv(x, w, case)
        assert got.dtype == jnp.bfloat16
        assert cc.rel_err(got, cc.oracle(x, w, case)) < 1e-2


def test_jit_matches_eager():
    case = cc.CASES["7x7_stride2"]
    x, w = make_operands(case, seed=2)
    f = jax.jit(lambda a, b: run_conv(a, b, case, out_dtype=jnp.float32))
    np.testing.assert_array_equal(f(x, w), run_conv(x, w, case, out_dtype=jnp.float32))


def test_vmap_over_activations_folds_into_images():
    case = cc.CASES["3x3_dilation2_explicit"]
    x, w = make_operands(case, seed=4)
    xs = jnp.stack([x, -2 * x, x[::-1]], axis=1)  # batch axis 1
    got = jax.vmap(lambda a: run_conv(a, w, case, out_dtype=jnp.float32), in_axes=1)(xs)
    for i in range(3):
        want = cc.oracle(xs[:, i], w, case)
        assert cc.rel_err(got[i], want) < 1e-5
    jaxpr = str(jax.make_jaxpr(jax.vmap(lambda a: run_conv(a, w, case), in_axes=1))(xs))
    assert "while" not in jaxpr  # folded into N, not a loop


def test_vmap_over_nvfp4_activations_and_over_weights():
    case = cc.CASES["3x3_same"]
    x, w = make_operands(case, seed=6)
    xq = jax.vmap(jn.quantize)(jnp.stack([x, 3 * x]))  # per-element s_dec: runs per element
    got = jax.vmap(lambda a: run_conv(a, w, case, out_dtype=jnp.float32))(xq)
    for i in range(2):
        one = jax.tree_util.tree_map(lambda leaf: leaf[i], xq)
        assert cc.rel_err(got[i], cc.oracle(one, w, case)) < 1e-5
    ws = jax.vmap(jn.quantize_conv_weight)(jnp.stack([jnp.ones((3, 3, 32, 24)), -jnp.ones((3, 3, 32, 24))]))
    got = jax.vmap(lambda b: run_conv(x, b, case, out_dtype=jnp.float32))(ws)
    np.testing.assert_allclose(got[0], -got[1], rtol=1e-6)
    assert cc.rel_err(got[0], cc.oracle(x, jax.tree_util.tree_map(lambda l: l[0], ws), case)) < 1e-5


def test_vmap_with_an_empty_batch():
    w = jn.quantize_conv_weight(jnp.ones((3, 3, 32, 24)))
    f = lambda a: jn.conv(a, w, out_dtype=jnp.float32)  # noqa: E731
    assert jax.vmap(f)(jnp.zeros((0, 1, 4, 4, 32))).shape == (0, 1, 4, 4, 24)
    assert jax.vmap(f)(jnp.zeros((2, 0, 4, 4, 32))).shape == (2, 0, 4, 4, 24)


def test_quantize_conv_weight_with_a_given_scale_and_its_errors():
    w_hwio = jax.random.normal(jax.random.key(8), (3, 3, 16, 8))
    q = jn.quantize_conv_weight(w_hwio, s_enc=300.0)
    want = jn.quantize(jnp.transpose(w_hwio, (0, 1, 3, 2)), s_enc=300.0)
    for field in ("codes", "scales", "s_dec"):
        assert np.asarray(getattr(q, field)).tobytes() == np.asarray(getattr(want, field)).tobytes()
    assert float(q.s_dec) == pytest.approx(1 / 300.0)
    with pytest.raises(ValueError, match=r"w_hwio must be \[R, S, C, K\], got shape \(3, 16, 8\)"):
        jn.quantize_conv_weight(w_hwio[0])
    with pytest.raises(ValueError, match="s_enc must be finite and positive, got -1.0"):
        jn.quantize_conv_weight(w_hwio, s_enc=-1.0)


def test_quantize_conv_weight_layout():
    w_hwio = jax.random.normal(jax.random.key(7), (3, 5, 32, 12))
    q = jn.quantize_conv_weight(w_hwio)
    assert q.shape == (3, 5, 12, 32) and q.s_dec.shape == ()
    # the filter transposed to [R, S, K, C] and quantized along C as one tensor: the same bytes
    want = jn.quantize(jnp.transpose(w_hwio, (0, 1, 3, 2)))
    for field in ("codes", "scales", "s_dec"):
        assert np.asarray(getattr(q, field)).tobytes() == np.asarray(getattr(want, field)).tobytes()
    deq = jnp.transpose(jn.dequantize(q, jnp.float32), (0, 1, 3, 2))
    np.testing.assert_allclose(deq, w_hwio, rtol=0.3, atol=0.15 * float(jnp.abs(w_hwio).max()))


@pytest.mark.parametrize("kwargs,x_shape,error,match", [
    ({}, (2, 8, 8, 48), ValueError, r"input channels differ.*C=48.*C=32"),
    ({}, (8, 8, 32), ValueError, r"NHWC.*\(8, 8, 32\)"),
    ({"padding": "FULL"}, (1, 8, 8, 32), ValueError, r"padding must be.*'FULL'"),
    ({"padding": ((1, -1), (0, 0))}, (1, 8, 8, 32), ValueError, r"negative padding"),
    ({"padding": ((1, 1),)}, (1, 8, 8, 32), ValueError, r"explicit padding"),
    ({"padding": 1}, (1, 8, 8, 32), TypeError,
     r"padding must be a string or \(\(lo, hi\), \(lo, hi\)\), got 1"),
    ({"window_strides": (0, 1)}, (1, 8, 8, 32), ValueError, r"window_strides.*\(0, 1\)"),
    ({"rhs_dilation": 2}, (1, 8, 8, 32), TypeError, r"rhs_dilation must be a pair"),
    ({"padding": "VALID"}, (1, 2, 8, 32), ValueError, r"empty output \(0x6\)"),
    ({"bias": jnp.zeros((5,))}, (1, 8, 8, 32), ValueError, r"bias must have shape \(24,\), got \(5,\)"),
    ({"out_dtype": jnp.int32}, (1, 8, 8, 32), TypeError, r"out_dtype.*int32"),
])
def test_trace_time_errors_name_the_bad_value(kwargs, x_shape, error, match):
    w = jn.quantize_conv_weight(jnp.ones((3, 3, 32, 24)))
    with pytest.raises(error, match=match):
        jax.jit(lambda x: jn.conv(x, w, **kwargs)).lower(jax.ShapeDtypeStruct(x_shape, jnp.float32))


def test_weight_errors():
    x = jnp.ones((1, 8, 8, 32))
    with pytest.raises(TypeError, match="w must be an NVFP4Array"):
        jn.conv(x, jnp.ones((3, 3, 24, 32)))
    with pytest.raises(ValueError, match=r"4-D \[R, S, K, C\].*\(24, 32\)"):
        jn.conv(x, jn.quantize(jnp.ones((24, 32))))
    with pytest.raises(ValueError, match=r"C=24 .*multiple of 16"):
        jn.quantize_conv_weight(jnp.ones((3, 3, 24, 8)))
    with pytest.raises(TypeError, match="quantize_conv_weight: w_hwio must be float32.*int32"):
        jn.quantize_conv_weight(jnp.ones((3, 3, 32, 8), jnp.int32))
    with pytest.raises(TypeError, match="conv: x must be float32, bfloat16 or float16, got int32"):
        jn.conv(jnp.ones((1, 8, 8, 32), jnp.int32), jn.quantize_conv_weight(jnp.ones((3, 3, 32, 8))))
    for rs in ((0, 3), (3, 0)):  # not an XLA verifier error at lowering, nor a shape from eval_shape
        w = jn.quantize_conv_weight(jnp.ones((*rs, 32, 8)))
        with pytest.raises(ValueError, match=rf"spatial size R x S = {rs[0]} x {rs[1]} .* must be positive"):
            jax.eval_shape(lambda x: jn.conv(x, w), x)


@pytest.mark.parametrize("padding,strides,exports", [
    ("VALID", (1, 1), True), ("SAME", (1, 1), True), (((1, 1), (1, 1)), (2, 2), True),
    ("SAME", (2, 2), False),  # the pads depend on H and W modulo the stride
])
def test_export_with_symbolic_image_size(padding, strides, exports):
    """jax.export with symbolic H and W: paddings that stay constant export and run like the
    jitted call; a strided 'SAME', whose pads follow the size, is refused by name."""
    from jax import export
    w = jn.quantize_conv_weight(jax.random.normal(jax.random.key(0), (3, 3, 16, 8)))
    f = jax.jit(lambda x: jn.conv(x, w, padding=padding, window_strides=strides, out_dtype=jnp.float32))
    spec = jax.ShapeDtypeStruct((1, *export.symbolic_shape("h, w"), 16), jnp.float32)
    if not exports:
        with pytest.raises(ValueError, match=r"padding='SAME' with window_strides=\(2, 2\) depends on "
                                             r"the symbolic input size"):
            export.export(f)(spec)
        return
    x = jax.random.normal(jax.random.key(1), (1, 9, 7, 16))
    np.testing.assert_array_equal(export.export(f)(spec).call(x), f(x))


# The sm_90a tile loop, emulated on the host: (case, BN). Includes tiles that span several output
# rows and images, both tile widths, stride-2 phase arrays, dilation and wide padding.
SCHEDULE_CASES = {
    **{f"{name}_bn128": (case, 128) for name, case in cc.CASES.items()},
    "3x3_same_bn256": (cc.CASES["3x3_same"], 256),
    "7x7_stride2_bn256": (cc.CASES["7x7_stride2"], 256),
    "5x5_stride3_dil2": ((2, 17, 19, 16, 4, 5, 5, (3, 3), "SAME", (2, 2)), 128),
    "7x7_dil3_pad_wider": ((1, 12, 30, 16, 4, 7, 7, (1, 1), ((9, 9), (9, 9)), (3, 3)), 128),
    "7x7_tiles_end_with_the_rows": ((32, 7, 7, 16, 4, 3, 3, (1, 1), "SAME", (1, 1)), 128),
    "width1_images": ((5, 5, 1, 16, 4, 3, 3, (2, 2), "SAME", (1, 1)), 128),
    # Taps that read phase 0 only (one phase array): dilation 2 with stride 2.
    "3x3_stride2_dil2_one_phase": ((2, 13, 15, 16, 4, 3, 3, (2, 2), "SAME", (2, 2)), 128),
}


def schedule_args(case, bn):
    n, h, w, c, k, r, s, strides, padding, dilation = case
    pads = cc.explicit_pads((n, h, w, c), r, s, strides, padding, dilation)
    p = (h + sum(pads[0]) - (r - 1) * dilation[0] - 1) // strides[0] + 1
    q = (w + sum(pads[1]) - (s - 1) * dilation[1] - 1) // strides[1] + 1
    k = min(k, 8)  # the index math does not depend on K; keep the emulation fast
    c = min(c, 16)
    return (n, h, w, c, k, r, s, *strides, pads[0][0], pads[1][0], *dilation, p, q, bn), n * p * q * k


@pytest.mark.parametrize("name", sorted(SCHEDULE_CASES))
def test_sm90_schedule_emulation_matches_direct_convolution(host_program, name):
    args, outputs = schedule_args(*SCHEDULE_CASES[name])
    out = host_program(SCHEDULE, cutlass=True, args=args).split()
    assert out[0] == "OK", " ".join(out)
    assert int(out[1]) == outputs


@pytest.mark.skipif(not hasattr(jn._extension._ext, "conv_sm90_virtual_row_width"),
                    reason="no sm_90a conv kernels built")
@pytest.mark.parametrize("name", sorted(SCHEDULE_CASES))
def test_extension_virtual_row_width_sizes_the_schedule_tiles(host_program, name):
    # The GPU tests and the benchmark size the kernels' grids with the extension's row width.
    args, _ = schedule_args(*SCHEDULE_CASES[name])
    out = host_program(SCHEDULE, cutlass=True, args=args).split()
    n, _, w, _, _, _, s, _, stride_w, _, pad_w, _, dil_w, p, q, bn = args
    wv = jn._extension._ext.conv_sm90_virtual_row_width(q, w, s, stride_w, pad_w, dil_w)
    assert int(out[2]) == -(-(n * p * wv) // bn)


# Problems the warp-specialized kernel loads with TMA im2col copies: padding on one side only,
# VALID, dilation in both axes, images that end inside a tile, width 1, the other filter widths
# it takes (1, 5, 7; a halo of exactly the second box's 8 pixels), and strides (one walk per
# phase array the taps read, stepping by the stride: 2 and 3, unequal strides, with dilation,
# 1x1 and a dilated 3x3 that read phase 0 only).
IM2COL_CASES = {
    **{f"{name}_im2col": (case, 128) for name, case in cc.CASES.items() if case[7] != (1, 1)},
    "7x7_stride2_bn256": (cc.CASES["7x7_stride2"], 256),
    "5x5_stride3_dil2": ((2, 17, 19, 16, 4, 5, 5, (3, 3), "SAME", (2, 2)), 128),
    "3x3_stride2_width1_images": ((5, 5, 1, 16, 4, 3, 3, (2, 2), "SAME", (1, 1)), 128),
    "resnet_3x3_stride2_b2": ((2, 14, 14, 16, 4, 3, 3, (2, 2), "SAME", (1, 1)), 208),
    "3x3_stride2_valid_odd": ((3, 11, 15, 16, 4, 3, 3, (2, 2), "VALID", (1, 1)), 112),
    "3x3_stride2_dil2_one_phase": ((2, 13, 15, 16, 4, 3, 3, (2, 2), "SAME", (2, 2)), 128),
    "1x7_same_bn128": ((2, 9, 17, 16, 4, 1, 7, (1, 1), "SAME", (1, 1)), 128),
    "7x7_same_bn256": ((3, 14, 14, 16, 4, 7, 7, (1, 1), "SAME", (1, 1)), 256),
    "5x5_dil2_halo8": ((2, 11, 19, 16, 4, 5, 5, (1, 1), "SAME", (1, 2)), 128),
    "7x1_same": ((2, 12, 10, 16, 4, 7, 1, (1, 1), "SAME", (1, 1)), 128),
    "1x1_valid": (cc.CASES["1x1_valid"], 128),
    "3x3_same_bn128": (cc.CASES["3x3_same"], 128),
    # The last tile ends where the last virtual row does (Q + 1 columns a row), so the last row's
    # last outputs read their right pad from the halo box, past the final virtual pixel.
    "7x7_tiles_end_with_the_rows": ((32, 7, 7, 16, 4, 3, 3, (1, 1), "SAME", (1, 1)), 128),
    "14x14_tiles_end_with_the_rows": ((16, 14, 14, 16, 4, 3, 3, (1, 1), "SAME", (1, 1)), 224),
    "3x3_same_bn256": (cc.CASES["3x3_same"], 256),
    "3x3_dilation2_explicit": (cc.CASES["3x3_dilation2_explicit"], 128),
    "many_small_images": (cc.CASES["many_small_images"], 128),
    "valid_tall": ((3, 21, 5, 16, 4, 3, 3, (1, 1), "VALID", (1, 1)), 128),
    "same_lower_wide": ((2, 4, 70, 16, 4, 3, 3, (1, 1), "SAME_LOWER", (1, 1)), 256),
    "dil4_pads": ((2, 9, 13, 16, 4, 3, 3, (1, 1), ((4, 0), (0, 8)), (2, 4)), 128),
    "width1_images": ((5, 5, 1, 16, 4, 3, 3, (1, 1), "SAME", (1, 1)), 128),
    "resnet_7x7_b4": ((4, 7, 7, 16, 4, 3, 3, (1, 1), "SAME", (1, 1)), 256),
}


@pytest.mark.parametrize("name", sorted(IM2COL_CASES))
def test_sm90_im2col_walk_emulation_matches_direct_convolution(host_program, name):
    args, outputs = schedule_args(*IM2COL_CASES[name])
    out = host_program(SCHEDULE, cutlass=True, args=(*args, "im2col")).split()
    assert out[0] == "OK", " ".join(out)
    assert int(out[1]) == outputs


def test_sm90_weight_decode_is_exact(host_program):
    """The conv kernels' E2M1 -> bf16 weight decode by byte permutes (conv/sm90/conv_weight_decode.h):
    every value of the 4 codes it reads gives their exact bf16 values, on the host."""
    out = host_program(HERE / "host" / "conv_sm90_weight_decode.cc")
    assert out.split() == ["checked", str(4 * 2**16)]


def test_sm90_kernels_use_hgmma(kernel_sass):
    kernels = kernel_sass("sm_90a", r"conv_sm90_kernel")
    assert len(kernels) >= 4
    for name, sass in kernels.items():
        assert "HGMMA.64x" in sass, name
        assert "LDL" not in sass and "STL" not in sass, f"{name} uses local memory"


# conv_sm90_ws_kernel<kBN, kTma, kBM, kSplitK, kS, kStageSplit> in a mangled name.
WS_KERNEL_ARGS = re.compile(r"conv_sm90_ws_kernelILi(\d+)ELb([01])ELi(\d+)ELb([01])ELi(\d+)ELb([01])E")


def test_sm90_warp_specialized_kernels_use_hgmma_and_mbarriers(kernel_sass):
    kernels = kernel_sass("sm_90a", r"conv_sm90_ws_kernel")
    args = {name: tuple(int(v) for v in WS_KERNEL_ARGS.search(name).groups()) for name in kernels}
    # For each filter width S in {1, 3, 5, 7}: 128- and 256-pixel tiles with TMA and cp.async
    # loads; 64-, 112- and 208-pixel tiles, the two 64-channel pixel-split tiles (256 and 416
    # pixels) and the four 64-channel stage-split ones (64, 128, 224, 256) with TMA loads; the five
    # 128-channel and the four stage-split TMA tilings again split-K.
    assert sorted(collections.Counter(a[4] for a in args.values()).items()) == [(s, 22) for s in (1, 3, 5, 7)]
    tma = {name for name, a in args.items() if a[1] == 1}
    split = {name for name, a in args.items() if a[3] == 1}
    stage_split = {name for name, a in args.items() if a[5] == 1}
    assert len(tma) == 4 * 20 and len(split) == 4 * 9
    assert stage_split <= tma and len(stage_split) == 4 * 8 and len(stage_split & split) == 4 * 4
    assert all(args[name][2] == 64 for name in stage_split)
    for name, sass in kernels.items():
        assert "HGMMA.64x" in sass, name
        assert "SYNCS.PHASECHK" in sass, f"{name} waits on no mbarrier"
        assert "LDL" not in sass and "STL" not in sass, f"{name} uses local memory"
        assert "USETMAXREG" in sass, f"{name}: the producers keep their registers"
        if name in tma:  # im2col and tiled tensor copies, bulk copies of the scale tiles
            assert "UTMALDG.4D.IM2COL" in sass and "UTMALDG.3D" in sass and "UBLKCP" in sass, name
            assert "LDGSTS" not in sass, f"{name} still issues cp.async"
        else:
            assert "LDGSTS" in sass, name
        # The split's partial sums meet across the cluster, after a cluster-wide barrier.
        assert ("UCGABAR_WAIT" in sass) == (name in split), name
        # Programmatic dependent launch: griddepcontrol.wait and .launch_dependents.
        assert "ACQBULK" in sass and "PREEXIT" in sass, name


@pytest.mark.parametrize("value, want", [
    ("", (0, 0)), ("auto", (0, 0)), ("conv_launcher", (0, 0)), ("ws128x256", (3, 0)), ("ws64x416", (10, 0)),
    ("ws64x224ks", (12, 0)), ("ws64x64ks", (14, 0)), ("ws64x64ks/s4", (14, 4)),
    ("ws128x128/s2", (2, 2)), ("ws128x64/s8", (6, 8)), ("ws64x128ks/s3", (11, 3)), ("ws64x256ks/s2", (13, 2)),
])
def test_forced_sm90_kernel_and_split_from_the_environment(monkeypatch, value, want):
    from jax_nvfp4.primitives import conv as conv_primitive
    monkeypatch.setenv(conv_primitive.KERNEL_ENV, value)
    assert conv_primitive.forced_kernel() == want


@pytest.mark.parametrize("value", ["fastest", "ws128x128/s1", "ws128x128/s9", "ws64x256/s2", "ws64x416/s2",
                                   "ws128x128_cpasync/s2", "register_a/s2", "ws128x128/sx"])
def test_unknown_forced_sm90_kernel_or_split_is_rejected(monkeypatch, value):
    from jax_nvfp4.primitives import conv as conv_primitive
    monkeypatch.setenv(conv_primitive.KERNEL_ENV, value)
    with pytest.raises(ValueError, match=f"JAX_NVFP4_CONV_SM90_KERNEL.*{re.escape(repr(value))}"):
        conv_primitive.forced_kernel()


# A 1x1 conv the sm_90a lowering hands to the NVFP4 GEMM, and one change at a time that keeps it
# on the conv kernels.
_POINTWISE = dict(x_shape=(2, 28, 28, 256), x_dtype=jnp.bfloat16, x_nvfp4=False, filter_rs=(1, 1),
                  window_strides=(1, 1), padding=((0, 0), (0, 0)), out_dtype=jnp.bfloat16,
                  arch="sm_90a", cublaslt=True, forced=False)


@pytest.mark.parametrize("change, want", [
    ({}, True),
    ({"out_dtype": jnp.float32}, True),
    ({"x_shape": (1, 32, 32, 256)}, False),  # 1024 pixels: the conv kernels
    ({"x_shape": (1, 41, 25, 256)}, True),  # 1025
    ({"x_shape": (2, 64, 64, 256)}, True),  # 8192
    ({"x_shape": (1, 8193, 1, 256)}, False),
    ({"x_shape": (2, 28, 28, 240)}, False),  # fewer than 256 channels
    ({"filter_rs": (1, 3)}, False),
    ({"x_shape": (32, 56, 56, 256)}, False),  # 100352
    # A stride: the conv kernels (their strided TMA loads), whatever the pixel count.
    ({"x_shape": (2, 56, 56, 256), "window_strides": (2, 2)}, False),  # 1568 output pixels
    ({"x_shape": (2, 57, 55, 256), "window_strides": (2, 1)}, False),  # 2 x 29 x 55
    ({"padding": ((0, 0), (0, 1))}, False),
    ({"x_dtype": jnp.float32}, False),
    ({"x_nvfp4": True}, False),
    ({"out_dtype": jnp.float16}, False),
    ({"arch": "sm_100a"}, False),
    ({"arch": None}, False),
    ({"cublaslt": False}, False),
    ({"forced": True}, False),
])
def test_which_pointwise_convs_lower_to_the_gemm(change, want):
    from jax_nvfp4.primitives.conv import pointwise_as_gemm
    kw = {**_POINTWISE, **change}
    arch, cublaslt, forced = kw.pop("arch"), kw.pop("cublaslt"), kw.pop("forced")
    assert pointwise_as_gemm(**kw, arch=arch, cublaslt=cublaslt, forced=forced) is want
