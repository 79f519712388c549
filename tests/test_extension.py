"""Which path a CUDA lowering takes: the FFI kernel where one is compiled for the GPU, else the
XLA reference with a warning. Lowered for the 'cuda' platform with jax.export, so it runs on CPU."""

import types
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_nvfp4 as jn
from jax_nvfp4 import _extension

HOST = Path(__file__).resolve().parent / "host"


@pytest.mark.parametrize("cc,arch", [("9.0", "sm_90a"), ("10.0", "sm_100a"), ("10.3", None),
                                     ("12.0", None), ("8.0", None), ("", None)])
def test_device_arch_maps_exact_compute_capabilities(cc, arch):
    # "a" targets run on exactly their own chip: sm_100a is not B300 (10.3) nor RTX 50 (12.0).
    assert _extension.device_arch(types.SimpleNamespace(compute_capability=cc)) == arch


def test_device_arch_of_a_device_without_compute_capability():
    assert _extension.device_arch(jax.devices("cpu")[0]) is None


def _cuda_module_text(fn, *args):
    jax.clear_caches()  # the lowering path is chosen at lowering time, which jax caches
    allow = [jax.export.DisabledSafetyCheck.custom_call(t) for t in _TARGETS]  # ours, unversioned
    return jax.export.export(jax.jit(fn), platforms=["cuda"],
                             disabled_checks=allow)(*args).mlir_module()


_TARGETS = ("jax_nvfp4_quantize", "jax_nvfp4_dequantize", "jax_nvfp4_gemm",
            "jax_nvfp4_gemm_nvfp4_out", "jax_nvfp4_gemm_stacked", "jax_nvfp4_gemm_nvfp4_out_stacked",
            "jax_nvfp4_conv")


def _ops():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 128)), jnp.bfloat16)
    w = jn.quantize(jnp.asarray(np.random.default_rng(1).standard_normal((48, 128)), jnp.float32))
    return [("jax_nvfp4_quantize", jn.quantize, (x,)),
            ("jax_nvfp4_dequantize", jn.dequantize, (w,)),
            ("jax_nvfp4_gemm", jn.matmul, (x, w)),
            ("jax_nvfp4_gemm_nvfp4_out", lambda a, b: jn.matmul(a, b, out_s_enc=1.0), (x, w)),
            ("jax_nvfp4_gemm_stacked", jax.vmap(jn.matmul), _stack_of_two(x, w))]


def _stack_of_two(x, w):
    """x and w stacked twice (vmap over both: the stacked GEMM)."""
    return jax.tree.map(lambda a: jnp.stack([a, a]), (x, w))


@pytest.mark.parametrize("target,fn,args", _ops(), ids=lambda v: v if isinstance(v, str) else "")
def test_without_a_kernel_for_the_gpu_the_reference_runs_with_a_warning(monkeypatch, target, fn,
                                                                       args):
    monkeypatch.setattr(_extension, "visible_cuda_arch", lambda: "sm_80")  # e.g. an A100
    _extension.warn_reference_fallback.cache_clear()
    with pytest.warns(RuntimeWarning, match=f"{target} runs as XLA reference code"):
        text = _cuda_module_text(fn, *args)
    assert f"@{target}" not in text


@pytest.mark.parametrize("ccs,why", [
    (None, "no CUDA GPU is visible while lowering, so no kernel can be chosen (built for sm_90a)"),
    (["8.0"], "no kernel is compiled for this GPU (compute capability 8.0; built for sm_90a)"),
    (["9.0", "8.0"], "GPUs of several kinds are visible (compute capabilities 8.0, 9.0; built for "
                     "sm_90a)")])
def test_the_fallback_warning_says_why_no_kernel_runs(monkeypatch, ccs, why):
    def devices(backend=None):
        if ccs is None:
            raise RuntimeError("no cuda backend")  # as jax.devices("cuda") without a GPU
        return [types.SimpleNamespace(compute_capability=cc) for cc in ccs]

    monkeypatch.setattr(_extension, "_ext", types.SimpleNamespace(cuda_archs=lambda: ["sm_90a"]))
    monkeypatch.setattr(_extension, "_TARGETS", {"jax_nvfp4_gemm": None})
    monkeypatch.setattr(jax, "devices", devices)
    _extension.warn_reference_fallback.cache_clear()
    with pytest.warns(RuntimeWarning) as record:
        _extension.warn_reference_fallback("jax_nvfp4_gemm")
    _extension.warn_reference_fallback.cache_clear()
    assert str(record[0].message) == (
        f"jax_nvfp4: jax_nvfp4_gemm runs as XLA reference code on the GPU: {why}.")


def _empty_ops():
    w = jn.quantize(jnp.ones((48, 128), jnp.float32))
    x0 = jnp.zeros((0, 128), jnp.bfloat16)
    w_conv = jn.quantize_conv_weight(jnp.ones((3, 3, 16, 32), jnp.float32))
    return [("quantize", jn.quantize, (x0,)),
            ("dequantize", jn.dequantize, (jn.quantize(x0),)),
            ("matmul, no rows", jn.matmul, (x0, w)),
            ("matmul, NVFP4 output", lambda a, b: jn.matmul(a, b, out_s_enc=4.0), (x0, w)),
            ("matmul, no weight rows", jn.matmul, (jnp.ones((4, 128), jnp.bfloat16),
                                                   jn.quantize(jnp.ones((0, 128), jnp.float32)))),
            ("conv, empty batch", lambda a, b: jn.conv(a, b, padding="SAME"),
             (jnp.zeros((0, 8, 8, 16), jnp.bfloat16), w_conv))]


@pytest.mark.parametrize("name,fn,args", _empty_ops(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_call_without_elements_lowers_to_the_reference(monkeypatch, name, fn, args):
    """Nothing to launch: the reference computes what an empty call still returns (s_dec)."""
    monkeypatch.setattr(_extension, "kernel_available", lambda name: True)
    monkeypatch.setattr(_extension, "_cuda_compute_capability", lambda: (9, 0))
    text = _cuda_module_text(fn, *args)
    assert not any(f"@{t}" in text for t in _TARGETS), name


@pytest.mark.parametrize("target,fn,args", _ops(), ids=lambda v: v if isinstance(v, str) else "")
def test_with_a_kernel_the_cuda_lowering_calls_the_ffi_target(monkeypatch, target, fn, args):
    monkeypatch.setattr(_extension, "kernel_available", lambda name: True)
    monkeypatch.setattr(_extension, "_cuda_compute_capability", lambda: (9, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        text = _cuda_module_text(fn, *args)
    assert f"@{target}" in text


@pytest.mark.parametrize("filter_rs, strides, forced, target", [
    ((1, 1), 1, "", "jax_nvfp4_gemm"),  # 2 x 28 x 28 pixels of 256 channels: a GEMM
    ((1, 1), 1, "ws64x256", "jax_nvfp4_conv"),  # a forced conv kernel
    ((1, 1), 1, "conv_launcher", "jax_nvfp4_conv"),  # the conv kernels, their launcher's choice
    ((3, 3), 1, "", "jax_nvfp4_conv"),
    ((1, 1), 2, "", "jax_nvfp4_conv"),  # a stride: the conv kernels
])
def test_pointwise_conv_lowers_to_the_gemm_on_sm90(monkeypatch, filter_rs, strides, forced, target):
    monkeypatch.setattr(_extension, "kernel_available", lambda name: True)
    monkeypatch.setattr(_extension, "_cuda_compute_capability", lambda: (9, 0))
    monkeypatch.setattr(_extension, "cublaslt_gemm_calls", lambda: 0)
    monkeypatch.setenv("JAX_NVFP4_CONV_SM90_KERNEL", forced)
    x = jnp.zeros((2, 28, 28, 256), jnp.bfloat16)
    w = jn.quantize_conv_weight(jnp.ones((*filter_rs, 256, 64), jnp.float32))
    text = _cuda_module_text(lambda a, b: jn.conv(a, b, window_strides=(strides, strides),
                                                  padding="SAME"), x, w)
    other = ({"jax_nvfp4_gemm", "jax_nvfp4_conv"} - {target}).pop()
    assert f"@{target}(" in text and f"@{other}(" not in text


needs_extension = pytest.mark.skipif(_extension.extension_path() is None,
                                     reason="package built without the CUDA extension")


def _built(entry_point: str):
    """Skips unless the extension has `entry_point`, which it defines only where the op's sm_90a
    kernels are built (JAX_NVFP4_OPS and JAX_NVFP4_CUDA_ARCHS choose them)."""
    return pytest.mark.skipif(not hasattr(_extension._ext, entry_point),
                              reason=f"no sm_90a {entry_point.split('_')[0]} kernels built")


def _spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def _gemm_query(cc, m, n, k, *, out=None, x_dtype=jnp.bfloat16, path=0, activation="none"):
    """The arguments of the extension's lowering-time queries about a GEMM call."""
    from jax_nvfp4.primitives.matmul import ACTIVATION_CODES
    f4, f8, f32 = jnp.float4_e2m1fn, jnp.float8_e4m3fn, jnp.float32
    operands = [_spec((m, k), x_dtype), _spec((0,), f8), _spec((), f32), _spec((n, k), f4),
                _spec((1,), f8), _spec((), f32), _spec((0,), f32), _spec((0,) if out is None else (), f32)]
    results = [_spec((m, jn.format.output_columns(n, activation)), jnp.bfloat16)] if out is None else out
    target = "jax_nvfp4_gemm" if out is None else "jax_nvfp4_gemm_nvfp4_out"
    return (target, cc, [(o.shape, np.dtype(o.dtype).name) for o in operands],
            [(r.shape, np.dtype(r.dtype).name) for r in results],
            {"path": path, "activation": ACTIVATION_CODES[activation]})


def _gemm_workspace(cc, m, n, k, **kwargs):
    return _extension._ext.workspace_bytes(*_gemm_query(cc, m, n, k, **kwargs))


def _ragged_workspace(cc, m, groups, n, k, *, path=0, x_dtype=jnp.bfloat16):
    f4, f8, f32, i32 = jnp.float4_e2m1fn, jnp.float8_e4m3fn, jnp.float32, jnp.int32
    operands = [_spec((m, k), x_dtype), _spec((0,), f8), _spec((), f32), _spec((groups, n, k), f4),
                _spec((groups, 1), f8), _spec((groups,), f32), _spec((groups, n), f32), _spec((0,), f32),
                _spec((groups,), i32), _spec((), i32)]
    return _extension._ext.workspace_bytes(
        "jax_nvfp4_gemm_ragged", cc, [(o.shape, np.dtype(o.dtype).name) for o in operands],
        [((m, n), "bfloat16")], {"path": path, "activation": 0})


@needs_extension
@_built("gemm_sm90_path")
def test_ragged_workspace_holds_fused_ws_staged_rows():
    """The decode kernel needs none; fused_ws stages x in 64-row tiles from 16 rows a group (or
    forced: path 7), in 128-row ones from 64 (path 4), in 256-row ones from 144 (path 6), each
    group from a tile boundary: ceil(M / rows) + min(G, M) tiles. No other device runs the
    target."""
    pad = 256  # the workspace's alignment
    assert _ragged_workspace(90, 127, 8, 4096, 1024) == 0
    assert _ragged_workspace(90, 60, 8, 4096, 1024, path=4) == (1 + 8) * 128 * 1024 * 2 + pad
    assert _ragged_workspace(90, 60, 8, 4096, 1024, path=7) == (1 + 8) * 64 * 1024 * 2 + pad
    assert _ragged_workspace(90, 60, 8, 4096, 1024, path=6) == (1 + 8) * 256 * 1024 * 2 + pad
    assert _ragged_workspace(90, 5, 8, 4096, 1024, path=7) == (1 + 5) * 64 * 1024 * 2 + pad  # G > M
    assert _ragged_workspace(90, 128, 8, 4096, 1024) == (2 + 8) * 64 * 1024 * 2 + pad  # 64-row tiles
    assert _ragged_workspace(90, 511, 8, 4096, 1024) == (8 + 8) * 64 * 1024 * 2 + pad
    assert _ragged_workspace(90, 512, 8, 4096, 1024) == (4 + 8) * 128 * 1024 * 2 + pad  # 128-row tiles
    assert _ragged_workspace(90, 1151, 8, 4096, 1024) == (9 + 8) * 128 * 1024 * 2 + pad
    assert _ragged_workspace(90, 1152, 8, 4096, 1024) == (5 + 8) * 256 * 1024 * 2 + pad  # 256-row tiles
    assert _ragged_workspace(90, 4100, 8, 4096, 1024) == (17 + 8) * 256 * 1024 * 2 + pad
    # float32 x: a bf16 hi and lo row per row of x
    assert (_ragged_workspace(90, 300, 8, 4096, 1024, x_dtype=jnp.float32)
            == (10 + 8) * 64 * 1024 * 2 + pad)
    assert _ragged_workspace(90, 300, 8, 4096, 1024, path=1) == 0
    assert _ragged_workspace(120, 300, 8, 4096, 1024) == 0


@needs_extension
@pytest.mark.skipif(_extension._ext is None or "sm_100a" not in _extension.cuda_archs(),
                    reason="no sm_100a kernels built")
def test_ragged_workspace_on_sm100_holds_its_plan():
    """sm_100a's grouped GEMM (cuda/gemm/sm100/ragged_sm100_plan.h): x quantized (W4A16), A's
    scales in tiles of each group's own (ceil(M / 128) + G row tiles), the float32 D, then a few
    KB: the groups' CUTLASS arguments, the quantizer's scratch and CUTLASS's own, which takes 640
    bytes an SM (CUTLASS 4.2), sized for the most SMs an sm_100a GPU may have (160: the call may
    run on another GPU than the one it was lowered on). None without rows, or where the kernel
    takes no such K."""
    m, g, n, k = 300, 8, 4096, 1024
    k_tiles = k // 64  # 512 bytes a tile of 128 rows x 4 scales
    regions = m * k // 2 + 3 * k_tiles * 512 + (3 + g) * k_tiles * 512 + m * n * 4
    bf16_x = _ragged_workspace(100, m, g, n, k)
    assert regions + 160 * 640 < bf16_x < regions + 160 * 640 + 16 * 1024
    nvfp4_x = _ragged_workspace(100, m, g, n, k, x_dtype=jnp.float4_e2m1fn)
    assert nvfp4_x < bf16_x - m * k // 2  # an NVFP4 x is not quantized again
    assert _ragged_workspace(100, 0, g, n, k) == 0
    assert _ragged_workspace(100, m, g, n, 48) == 0


@needs_extension
@_built("gemm_sm90_path")
def test_gemm_workspace_follows_the_sm90_path():
    assert _gemm_workspace(90, 1, 4096, 4096) == 0  # decode: split-K through shared memory
    # ... but W4A4 at M <= 4 on more than 32M weights stages x there as bf16
    f4 = jnp.float4_e2m1fn
    assert 0 <= _gemm_workspace(90, 4, 14336, 4096, x_dtype=f4) - 4 * 4096 * 2 < 1024
    assert _gemm_workspace(90, 5, 14336, 4096, x_dtype=f4) == 0
    assert _gemm_workspace(90, 1, 6144, 4096, x_dtype=f4) == 0
    # prefill: the weights dequantized to bf16 in the workspace
    assert _gemm_workspace(90, 4096, 4096, 4096) >= 4096 * 4096 * 2
    # 128 < M <= 512: fused_ws (only the bf16 activations staged) while its 128 x 128 output tiles
    # number more than half the SMs; up to M = 1024 while they fit one wave, prefill beyond
    # (the sizing runs without a GPU here: 132 SMs, an H100/H200). With K > 1024 and more than 8M
    # weights, fused_ws on 256-row tiles to M = 2048 where those number more than half the SMs
    # (from M = 192 with K > 2048, 30%: it splits K over a cluster where they are few): x staged
    # in 256-row tiles.
    device = jax.devices()[0]
    sms = device.core_count if device.platform == "gpu" else 132
    def staged_rows(m, n, k):  # the workspace is the staged tiles (and an alignment pad)
        ws = _gemm_workspace(90, m, n, k)
        assert ws % (k * 2) < 1024, ws
        return ws // (k * 2)

    assert staged_rows(300, 4096, 2048) == 384  # 32 x 3 tiles of 128 rows (8M weights: no wide tiles)
    if sms >= 128:
        assert staged_rows(300, 4096, 4096) == 512  # 32 x 2 tiles of 256 rows
        assert 1024 * 2048 * 2 <= _gemm_workspace(90, 1024, 2048, 2048) < 2048 * 2048 * 2  # 16 x 8, one wave
        assert staged_rows(300, 14336, 4096) == 512  # 112 x 2 tiles of 256 rows
        assert staged_rows(1900, 14336, 4096) == 2048
    assert _gemm_workspace(90, 768, 4096, 2048) >= 4096 * 2048 * 2  # 32 x 6 tiles: prefill
    # Small weights (N x K elements): past decode's M, prefill (up to 512 x 512); decode to M = 64,
    # then prefill (up to 1024 x 1024); decode to M = 32 (up to 2048 x 4096, or 8192 x 4096 with
    # K > 1024); prefill rather than the fused kernel on few tiles past M = 128 (up to 2048 x 2048).
    assert _gemm_workspace(90, 24, 512, 512) >= 512 * 512 * 2
    assert _gemm_workspace(90, 64, 1024, 1024) == 0
    assert _gemm_workspace(90, 65, 1024, 1024) >= 1024 * 1024 * 2
    assert _gemm_workspace(90, 32, 2048, 4096) == 0
    assert 0 < _gemm_workspace(90, 33, 2048, 4096) < 2048 * 4096 * 2  # fused: x staged
    assert _gemm_workspace(90, 32, 4096, 4096) == 0  # 16.7M weights, K > 1024: decode
    assert _gemm_workspace(90, 32, 14336, 4096) > 0  # 58.7M weights: fused
    assert _gemm_workspace(90, 256, 2048, 2048) >= 2048 * 2048 * 2  # 16 x 2 tiles: prefill
    assert _gemm_workspace(90, 256, 2048, 4096) < 2048 * 4096 * 2  # 8M weights: fused, as before
    assert _gemm_workspace(90, 512, 2048, 4096) >= 2048 * 4096 * 2  # narrow and long: prefill
    nvfp4_out = [_spec((1, 256), jnp.float4_e2m1fn), _spec((128 * 4,), jnp.float8_e4m3fn),
                 _spec((), jnp.float32)]
    assert _gemm_workspace(90, 1, 256, 4096, out=nvfp4_out) >= 256 * 4  # the float32 result
    assert _gemm_workspace(80, 1024, 4096, 4096) == 0  # no kernel for an A100: nothing to size


# (m, n, k) -> the sm_90a path, one case per branch of gemm_sm90_path (docs/gemm_hopper.md has
# the timings behind each), on 132 SMs (an H100/H200, or no GPU).
_SM90_PATHS = [
    ((16, 14336, 4096), "decode"),
    ((17, 512, 512), "prefill"),        # up to 512 x 512 weights
    ((64, 1024, 1024), "decode"),       # up to 1024 x 1024: decode to M = 64
    ((65, 1024, 1024), "prefill"),
    ((32, 8192, 1024), "decode"),       # up to 2048 x 4096: decode to M = 32
    ((32, 8192, 4096), "decode"),       # ... with K > 1024 up to 8192 x 4096
    ((33, 8192, 4096), "fused"),
    ((32, 14336, 4096), "fused"),
    ((32, 4096, 14336), "decode"),      # larger with K > 1024 and N <= 4096: decode to M = 32
    ((33, 4096, 14336), "fused"),
    ((32, 4352, 14336), "fused"),
    ((32, 16384, 1024), "fused"),       # K <= 1024, N >= 4096: the fused kernel to M = 64,
    ((33, 8192, 1024), "fused"),
    ((48, 4096, 512), "fused"),
    ((65, 4096, 1024), "fused_ws"),     # then fused_ws to M = 512
    ((512, 16384, 512), "fused_ws"),
    ((64, 4096, 1024), "decode"),       # ... but decode to M = 64 on 2M-4M weights with K > 512
    ((33, 3072, 1024), "decode"),
    ((48, 2048, 1024), "prefill"),      # K <= 1024, N < 4096: prefill
    ((96, 2048, 1024), "prefill"),
    ((1024, 4096, 1024), "prefill"),    # past M = 512: the tiles rule (256 tiles)
    ((257, 2048, 4096), "prefill"),     # narrow and long weights past M = 256
    ((256, 2048, 4096), "fused"),
    ((1024, 1024, 8192), "prefill"),
    ((64, 14336, 4096), "fused"),       # the fused kernel's 64-row activation tile
    ((65, 14336, 4096), "fused_ws"),    # past it, fused_ws where its tiles cover half the SMs (112)
    ((128, 4096, 4096), "fused"),       # few tiles (32) and long K: the fused kernel's split-K
    ((128, 4096, 2048), "prefill"),     # few tiles, K <= 2048 and up to 8M weights: prefill
    ((128, 8192, 2048), "fused_ws"),    # larger weights: fused_ws
    ((72, 6144, 1536), "fused_ws"),
    ((256, 4096, 2048), "prefill"),
    ((256, 1024, 4096), "prefill"),     # few tiles past M = 128, up to 2048 x 2048 weights
    ((128, 1024, 4096), "fused"),
    ((128, 14336, 4096), "fused_ws"),
    ((129, 14336, 4096), "fused_ws_wide"),  # past M = 128 with K > 1024: 256-row tiles where they
    ((2048, 14336, 4096), "fused_ws_wide"),  # cover half the SMs (112 to 896 tiles), to M = 2048
    ((2049, 14336, 4096), "prefill"),
    ((1024, 4096, 4096), "fused_ws_wide"),   # 128 tiles
    ((512, 6144, 4096), "fused_ws_wide"),    # 96 tiles
    ((512, 4096, 4096), "fused_ws_wide"),    # from M = 192 with K > 2048, more than 30% of the SMs
    ((192, 6144, 4096), "fused_ws_wide"),    # (here 64, 48 and 40 tiles): K split over a cluster
    ((256, 5120, 4096), "fused_ws_wide"),
    ((191, 6144, 4096), "fused_ws"),
    ((256, 4096, 4096), "fused"),            # 32 wide tiles: the fused kernel's split-K
    ((256, 4096, 14336), "fused"),
    ((512, 4096, 14336), "fused_ws_wide"),
    ((256, 8192, 2048), "fused_ws"),         # K = 2048: 128 tiles of 128 rows
    ((512, 8192, 2048), "fused_ws_wide"),    # K > 1024 and more than 8M weights (here 16M)
    ((1024, 4096, 2048), "prefill"),         # 8M weights: no wide tiles
    ((1024, 3072, 4096), "prefill"),         # nor on narrow, long weights
    ((768, 16384, 1024), "prefill"),         # nor with K <= 1024
    ((768, 4096, 2048), "prefill"),     # 192 tiles: more than one wave
    ((1024, 2048, 2048), "fused_ws"),   # 128 tiles: one wave
    ((1025, 2048, 2048), "prefill"),
]


@needs_extension
@_built("gemm_sm90_path")
@pytest.mark.parametrize("mnk, path", _SM90_PATHS, ids=[f"{m}x{n}x{k}" for (m, n, k), _ in _SM90_PATHS])
def test_gemm_sm90_path_rule(mnk, path):
    device = jax.devices()[0]
    if device.platform == "gpu" and device.core_count != 132:
        pytest.skip(f"the cases are for 132 SMs; this GPU has {device.core_count}")
    assert _extension._ext.gemm_sm90_path(*mnk) == path


@needs_extension
@_built("gemm_sm90_path")
@pytest.mark.parametrize("mnk, path", _SM90_PATHS, ids=[f"{m}x{n}x{k}" for (m, n, k), _ in _SM90_PATHS])
def test_an_auto_sm90_gemm_is_lowered_with_the_path_it_picks(mnk, path):
    """The pick depends on the SM count, so the call is lowered with the path attribute that
    forces it: run on a Hopper with another SM count (a jax.export artifact), it runs the kernel
    its workspace was sized for."""
    from jax_nvfp4.primitives.matmul import _PATHS
    device = jax.devices()[0]
    if device.platform == "gpu" and device.core_count != 132:
        pytest.skip(f"the cases are for 132 SMs; this GPU has {device.core_count}")
    m, n, k = mnk
    nvfp4_out = [_spec((m, n), jnp.float4_e2m1fn), _spec(jn.format.tiled_scales_shape((m, n)), jnp.float8_e4m3fn),
                 _spec((), jnp.float32)]
    for kwargs in ({}, {"activation": "swiglu"}, {"out": nvfp4_out}, {"x_dtype": jnp.float32}):
        settled = _extension._ext.settled_attrs(*_gemm_query(90, m, n, k, **kwargs))
        # (a float32 x is staged as a bf16 pair, which moves the bounds: the cases are bf16's)
        assert settled == {"path": _PATHS[path]} or "x_dtype" in kwargs and settled["path"] > 0, kwargs
        # ... with the workspace the auto path takes here
        assert _gemm_workspace(90, m, n, k, path=settled["path"], **kwargs) == _gemm_workspace(90, m, n, k, **kwargs)
    forced = _gemm_query(90, *mnk, path=_PATHS["prefill_cutlass"])
    assert _extension._ext.settled_attrs(*forced) == {}  # a forced path stays
    assert _extension._ext.settled_attrs(*_gemm_query(100, *mnk)) == {}  # sm_100a: one kernel family


@needs_extension
@_built("gemm_sm90_path")
def test_the_sm90_prefill_workspace_holds_cutlass_stream_k_on_any_hopper():
    """CUTLASS's stream-K scratch depends on the SM count: for 2048 x 4096 x 4096 it takes none on
    132 SMs and 18.6 MB on an H100 PCIe's 114 (CUTLASS 4.2). The workspace of the prefill path
    forced to CUTLASS (no cuBLASLt scratch) holds the most any Hopper needs after the bf16 weights."""
    weights = 4096 * 4096 * 2
    ws = _gemm_workspace(90, 2048, 4096, 4096, path=5)
    assert weights + 18_613_376 <= ws < weights + 32 * 2**20


@needs_extension
@_built("gemm_sm90_path")
def test_the_sm90_prefill_workspace_holds_cublaslt_scratch_only_where_it_may_run():
    """cuBLASLt takes no f16 output, no odd N and no bias of another type than a bf16 output's."""
    if _extension.cublaslt_gemm_calls() is None:
        pytest.skip("built without cuBLASLt's header")
    lt = 32 * 2**20
    weights = 4096 * 4096 * 2
    assert _gemm_workspace(90, 8192, 4096, 4096) >= weights + lt
    assert _gemm_workspace(90, 8192, 4096, 4096, path=5) < weights + lt  # forced to CUTLASS
    f16_out = list(_gemm_query(90, 8192, 4096, 4096))
    f16_out[3] = [((8192, 4096), "float16")]
    assert _extension._ext.workspace_bytes(*f16_out) < weights + lt
    f32_bias = list(_gemm_query(90, 8192, 4096, 4096))  # with a bf16 output
    f32_bias[2] = [*f32_bias[2][:6], ((4096,), "float32"), f32_bias[2][7]]
    assert _extension._ext.workspace_bytes(*f32_bias) < weights + lt
    odd = 4095
    assert _gemm_workspace(90, 8192, odd, 4096) < odd * 4096 * 2 + 8192 * 4096 * 2 + lt


# 3x3 'SAME' convs, (n, hw, c, k, stride) -> conv_sm90's choice on an H100 (132 SMs, 227 KB), one
# case per branch the ResNet-like grids take (docs/conv.md "The library's choice"; kernel-alone
# timings: bench/results/conv_decode_prmt_h100_2026-11-27.md).
_CONV_CHOICES = [
    ((32, 56, 64, 64, 1), "ws64x416", 1),     # K <= 64: the pixel split
    ((32, 28, 128, 128, 1), "ws128x208", 1),  # one wave, 128 channels
    ((32, 14, 256, 256, 1), "ws64x224ks", 1),  # one wave, stage split
    ((32, 7, 512, 512, 1), "ws64x224ks", 2),  # one wave, stage split over a cluster of two
    ((32, 28, 256, 256, 2), "ws128x112", 1),  # the refitted estimate (was ws128x208/s2)
    ((22, 28, 128, 128, 1), "ws128x208", 1),  # short of 2/3 of the SMs (86 CTAs), too big for a small grid
    ((24, 7, 512, 512, 1), "ws64x224ks", 2),  # one wave from 2/3 of the SMs on (96 CTAs)
    ((8, 7, 512, 512, 1), "ws64x128ks", 3),   # a small grid (small_grid_choice)
    ((1, 7, 512, 512, 1), "ws64x64ks", 4),
    ((32, 28, 192, 192, 1), "ws64x224ks", 1),  # none in one wave: the least busiest-SM work
    ((48, 28, 128, 128, 1), "ws64x224ks", 1),
    ((128, 28, 128, 128, 1), "ws128x208", 1),
    ((64, 28, 192, 192, 1), "ws64x416", 1),    # past one wave, K = 192: the pixel split (no K tile half empty)
    ((128, 7, 512, 512, 1), "ws128x256", 1),   # one wave of 112 CTAs against two of ws64x224ks
]


@needs_extension
@_built("conv_sm90_kernel_choice")
@pytest.mark.parametrize("shape, kernel, splits", _CONV_CHOICES,
                         ids=[f"b{n}_{hw}x{hw}x{c}_k{k}_s{st}" for (n, hw, c, k, st), _, _ in _CONV_CHOICES])
def test_conv_sm90_kernel_choice(shape, kernel, splits):
    from jax_nvfp4.primitives import conv as conv_primitive
    n, hw, c, k, stride = shape
    out = -(-hw // stride)
    pad = max((out - 1) * stride + 3 - hw, 0) // 2  # 'SAME'
    got = _extension._ext.conv_sm90_kernel_choice(n, hw, hw, c, k, 3, 3, stride, out, out, pad, pad)
    assert got[:2] == (conv_primitive._KERNELS[kernel], splits)
    channels, pixels = (int(v) for v in kernel[2:].removesuffix("ks").split("x"))
    assert got[2:] == (channels, pixels)  # the kernel's CTA tile


@needs_extension
@_built("conv_sm90_kernel_choice")
@pytest.mark.parametrize("n, c, tile", [(32, 128, (64, 128)), (1, 512, (64, 64)), (160, 128, (128, 256))])
def test_conv_sm90_kernel_choice_reports_the_register_a_tile(n, c, tile):
    """K = 96 (neither the pixel split's K <= 64 nor the 128-channel tiles): the register-A
    kernel, one warpgroup (64 channels) while its 128-channel tiles would not give every SM two
    CTAs, 64-pixel tiles where 128-pixel ones fill at most half the SMs, 256 where those still
    give every SM two."""
    from jax_nvfp4.primitives import conv as conv_primitive
    hw = 7 if c == 512 else 28
    got = _extension._ext.conv_sm90_kernel_choice(n, hw, hw, c, 96, 3, 3, 1, hw, hw, 1, 1)
    assert got == (conv_primitive._KERNELS["register_a"], 1, *tile)


@needs_extension
def test_quantize_workspace_only_for_the_amax_pass():
    def size(s_enc_shape):
        return _extension._ext.workspace_bytes(
            "jax_nvfp4_quantize", 90, [((64, 128), "bfloat16"), (s_enc_shape, "float32")], [])
    assert size((0,)) > 0  # S_enc from the tensor's amax, reduced in the workspace
    assert size(()) == 0


@needs_extension
def test_targets_without_workspace_are_not_sized():
    sized = {"jax_nvfp4_quantize", "jax_nvfp4_gemm", "jax_nvfp4_gemm_nvfp4_out",
             "jax_nvfp4_gemm_stacked", "jax_nvfp4_gemm_nvfp4_out_stacked", "jax_nvfp4_gemm_ragged"}
    assert set(_extension._ext.workspace_targets()) == sized & set(_extension.ffi_targets())
    with pytest.raises(ValueError, match="takes no workspace"):
        _extension._ext.workspace_bytes("jax_nvfp4_conv", 90, [], [])


@needs_extension
def test_every_target_registers_its_initialize_stage():
    """Each target hands XLA an execute handler, an initialize one, which loads the call's
    kernels before the program launches (cuda/common/initialize_stage.h), and an instantiate one,
    which gives each call the state that lets a warm initialize skip hashing its key."""
    stages = _extension._ext.targets()
    assert set(stages) == set(_extension.ffi_targets())
    assert all(set(bundle) == {"execute", "instantiate", "initialize"} for bundle in stages.values()), stages


def test_initialize_stage_warms_a_call_up_once_per_kernel_choice(host_program):
    """The warm-up runs once per key (cuda/common/call_key.h): the key changes with the device,
    an operand's dtype, shape or address alignment, and any attribute's name or value; it stays
    for other addresses of the same alignment."""
    got = dict(line.split() for line in host_program(HOST / "call_key.cc", ffi=True).splitlines())
    assert got.pop("unchanged") == "same" and got.pop("other_addresses_same_alignment") == "same"
    assert len(got) == 11 and set(got.values()) == {"differs"}, got


def test_initialize_stage_runs_the_handler_captured_once_per_key(host_program):
    """instantiate_handler and initialize_handler around a stub execute handler: metadata queries
    reach the stub, other stages do nothing; the instantiate stage gives a call its state once the
    state's type is registered. On a GPU the first initialize of a key runs the stub as the execute
    stage, flagged as a warm-up, inside a capture that is ended after, and a key seen before does
    not run it again. A call without state hashes its key every time; a call with state only when
    its buffers' alignment differs from the last one it was warmed with. Without a GPU nothing
    runs."""
    lines = host_program(HOST / "initialize_stage.cc", ffi=True, cudart=True).splitlines()
    got = dict(line.split(" ", 1) for line in lines)
    assert got.pop("metadata") == "ok [metadata]"
    assert got.pop("instantiate_metadata") == "ok [metadata]"
    assert got.pop("execute_stage") == "ok -"
    assert got.pop("instantiate_unregistered") == "ok -"
    assert got.pop("instantiate_registered") == "ok -"
    assert got.pop("states") == "1 stateful"
    if "no_device" in got:
        assert got == {"no_device": "ok -"}
        return
    captured = "ok [3 warm capturing] keyed"
    assert got == {"first_initialize": captured, "same_call_again": "ok - keyed", "other_shape": captured,
                   "other_alignment": captured, "stateful_first": "ok - keyed", "stateful_again": "ok -",
                   "stateful_other_alignment": captured, "stateful_other_alignment_again": "ok -",
                   "stateful_alignment_back": "ok - keyed", "stream_left_capturing": "no"}


# XLA's default, and command buffers off: then every call is a thunk of its own, initialized
# before each execution.
@pytest.mark.parametrize("options", [{}, {"xla_gpu_enable_command_buffer": ""}], ids=["default", "no_command_buffers"])
def test_warm_calls_of_a_compiled_program_do_not_hash_their_keys(gpu_kernels, options):
    """XLA keeps each call's state from the instantiate stage and hands it to the initialize
    stage: the program's first execution hashes its calls' keys (and warms them up), later
    executions do not."""
    from jax_nvfp4.primitives.matmul import GEMM_TARGET
    from jax_nvfp4.primitives.quantize import QUANTIZE_TARGET

    gpu_kernels(GEMM_TARGET, QUANTIZE_TARGET)
    if not hasattr(jax.ffi, "register_ffi_type"):
        pytest.skip(f"jax {jax.__version__} has no jax.ffi.register_ffi_type: no per-call state")
    assert _extension._ext.warm_call_type_id() > 0
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((4, 256)), jnp.bfloat16)
    w = jn.quantize(jnp.asarray(rng.standard_normal((384, 256)), jnp.float32))
    program = jax.jit(lambda x, w: jn.quantize(jn.matmul(x, w, out_dtype=jnp.float32))).lower(x, w)
    program = program.compile(options)
    before = _extension._ext.keyed_initializations()
    jax.block_until_ready(program(x, w))
    first = _extension._ext.keyed_initializations()
    for _ in range(5):
        jax.block_until_ready(program(x, w))
    assert first > before  # the initialize stage ran
    assert _extension._ext.keyed_initializations() == first


@needs_extension
def test_only_the_dense_gemm_targets_settle_attributes():
    """Their sm_90a kernel choice depends on the SM count; the ragged GEMM's does not."""
    settled = {"jax_nvfp4_gemm", "jax_nvfp4_gemm_nvfp4_out", "jax_nvfp4_gemm_stacked",
               "jax_nvfp4_gemm_nvfp4_out_stacked"}
    assert set(_extension._ext.settled_targets()) == settled & set(_extension.ffi_targets())
    with pytest.raises(ValueError, match="settles no attributes"):
        _extension._ext.settled_attrs("jax_nvfp4_gemm_ragged", 90, [], [])


@needs_extension
@pytest.mark.parametrize("x_stacked", [True, False], ids=["x_stacked", "x_shared"])
def test_the_stacked_gemm_call_flags_its_stacked_operands(monkeypatch, x_stacked):
    """vmap over stacked weights lowers to one stacked FFI call: its `stacked` attribute flags
    the operands that carry the stack (a: bit 0, b's codes, scales, s_dec: bits 3-5) and its
    workspace is that of one element's GEMM (the elements run in turn)."""
    monkeypatch.setattr(_extension, "kernel_available", lambda name: True)
    monkeypatch.setattr(_extension, "_cuda_compute_capability", lambda: (9, 0))
    x, w = _stack_of_two(jnp.zeros((1024, 256), jnp.bfloat16), jn.quantize(jnp.ones((512, 256))))
    if not x_stacked:
        x = x[0]
    text = _cuda_module_text(jax.vmap(jn.matmul, in_axes=(0 if x_stacked else None, 0)), x, w)
    flags = (1 if x_stacked else 0) | 0b111000
    assert "@jax_nvfp4_gemm_stacked" in text and f"stacked = {flags} : i64" in text
    assert "@jax_nvfp4_gemm(" not in text and "stablehlo.while" not in text
    nbytes = _gemm_workspace(90, 1024, 512, 256)
    assert nbytes > 0 and f"tensor<{nbytes}xui8>" in text
    assert "path = 2 : i64" in text  # the element's pick, prefill, settled


@needs_extension
def test_the_lowered_gemm_call_carries_its_workspace_as_a_result(monkeypatch):
    monkeypatch.setattr(_extension, "kernel_available", lambda name: True)
    monkeypatch.setattr(_extension, "_cuda_compute_capability", lambda: (9, 0))
    x = jnp.zeros((1024, 256), jnp.bfloat16)
    w = jn.quantize(jnp.ones((512, 256), jnp.float32))
    text = _cuda_module_text(jn.matmul, x, w)
    nbytes = _gemm_workspace(90, 1024, 512, 256)
    assert nbytes > 0 and f"tensor<{nbytes}xui8>" in text
    assert "path = 2 : i64" in text  # the pick on this shape, prefill, settled


@needs_extension
@_built("gemm_sm90_path")
@pytest.mark.parametrize("forced, code", [("", 1), ("fused", 3)])
def test_the_lowered_gemm_call_carries_the_settled_or_forced_path(monkeypatch, forced, code):
    monkeypatch.setattr(_extension, "kernel_available", lambda name: True)
    monkeypatch.setattr(_extension, "_cuda_compute_capability", lambda: (9, 0))
    monkeypatch.setenv("JAX_NVFP4_GEMM_SM90_PATH", forced)
    x = jnp.zeros((4, 256), jnp.bfloat16)  # decode's M
    w = jn.quantize(jnp.ones((512, 256), jnp.float32))
    assert f"path = {code} : i64" in _cuda_module_text(jn.matmul, x, w)
