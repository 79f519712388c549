"""Which path a CUDA lowering takes: the FFI kernel where one is compiled for the GPU, else the
XLA reference with a warning. Lowered for the 'cuda' platform with jax.export, so it runs on CPU."""

import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_nvfp4 as jn
from jax_nvfp4 import _extension


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
            "jax_nvfp4_gemm_nvfp4_out")


def _ops():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 128)), jnp.bfloat16)
    w = jn.quantize(jnp.asarray(np.random.default_rng(1).standard_normal((48, 128)), jnp.float32))
    return [("jax_nvfp4_quantize", jn.quantize, (x,)),
            ("jax_nvfp4_dequantize", jn.dequantize, (w,)),
            ("jax_nvfp4_gemm", jn.matmul, (x, w)),
            ("jax_nvfp4_gemm_nvfp4_out", lambda a, b: jn.matmul(a, b, out_s_enc=1.0), (x, w))]


@pytest.mark.parametrize("target,fn,args", _ops(), ids=lambda v: v if isinstance(v, str) else "")
def test_without_a_kernel_for_the_gpu_the_reference_runs_with_a_warning(monkeypatch, target, fn,
                                                                       args):
    monkeypatch.setattr(_extension, "_cuda_device_arch", lambda: "sm_80")  # e.g. an A100
    _extension.warn_reference_fallback.cache_clear()
    with pytest.warns(RuntimeWarning, match=f"{target} runs as XLA reference code"):
        text = _cuda_module_text(fn, *args)
    assert f"@{target}" not in text


@pytest.mark.parametrize("target,fn,args", _ops(), ids=lambda v: v if isinstance(v, str) else "")
def test_with_a_kernel_the_cuda_lowering_calls_the_ffi_target(monkeypatch, target, fn, args):
    monkeypatch.setattr(_extension, "kernel_available", lambda name: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        text = _cuda_module_text(fn, *args)
    assert f"@{target}" in text
