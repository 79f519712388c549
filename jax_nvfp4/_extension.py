"""Loads the compiled CUDA extension (if built) and registers its FFI targets with XLA.

The package works without it: every primitive then lowers to the pure-JAX reference.
"""

from __future__ import annotations

import functools
import warnings

import jax

try:
    from jax_nvfp4 import _nvfp4_cuda as _ext
except ImportError:  # CPU-only build or source checkout
    _ext = None

# Compute capability (major, minor) -> the compiled arch that runs on it. "a" targets run on
# exactly their own chip: sm_100a is B200/GB200 (10.0), not B300 (10.3) or consumer Blackwell.
_ARCH_OF_CC = {(9, 0): "sm_90a", (10, 0): "sm_100a"}


def _register_targets() -> dict:
    if _ext is None:
        return {}
    targets = dict(_ext.targets())
    for name, capsule in targets.items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
    return targets


_TARGETS = _register_targets()


def extension_path() -> str | None:
    """File of the compiled extension, or None when the package has no CUDA build."""
    return None if _ext is None else _ext.__file__


def cuda_archs() -> tuple[str, ...]:
    """GPU targets compiled into the extension, e.g. ("sm_90a", "sm_100a")."""
    return () if _ext is None else tuple(_ext.cuda_archs())


def ffi_targets() -> tuple[str, ...]:
    """Names of the FFI targets the extension registered."""
    return tuple(sorted(_TARGETS))


def device_arch(device) -> str | None:
    """The compiled arch that runs on `device` ("sm_90a", "sm_100a"), or None."""
    cc = getattr(device, "compute_capability", None)
    if not cc:
        return None
    major, minor = (int(v) for v in str(cc).split("."))
    return _ARCH_OF_CC.get((major, minor))


@functools.cache
def _cuda_device_arch() -> str | None:
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return None
    archs = {device_arch(d) for d in devices}
    return archs.pop() if len(archs) == 1 else None  # mixed GPUs: no kernel path


def kernel_available(target: str) -> bool:
    """Whether FFI target `target` exists and was compiled for the visible CUDA GPUs."""
    arch = _cuda_device_arch()
    return target in _TARGETS and arch is not None and arch in cuda_archs()


@functools.cache
def warn_reference_fallback(target: str) -> None:
    """Says once per target why a CUDA lowering falls back to the XLA reference."""
    if _ext is None:
        why = "the package was built without CUDA"
    elif target not in _TARGETS:
        why = f"the extension has no '{target}' kernel (not built)"
    else:
        try:
            kinds = sorted({getattr(d, "compute_capability", "?") for d in jax.devices("cuda")})
        except RuntimeError:
            kinds = []
        why = (f"no kernel is compiled for this GPU (compute capability {', '.join(kinds)}; "
               f"built for {', '.join(cuda_archs()) or 'nothing'})")
    warnings.warn(f"jax_nvfp4: {target} runs as XLA reference code on the GPU: {why}.",
                  RuntimeWarning, stacklevel=3)
