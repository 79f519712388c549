"""Loads the compiled CUDA extension (if built) and registers its FFI targets with XLA.

The package works without it: every primitive then lowers to the pure-JAX reference.
"""

from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
from jaxlib import xla_client

try:
    from jax_nvfp4 import _nvfp4_cuda as _ext
except ImportError:  # CPU-only build or source checkout
    _ext = None

# Compute capability (major, minor) -> the compiled arch that runs on it. "a" targets run on
# exactly their own chip: sm_100a is B200/GB200 (10.0), not B300 (10.3) or consumer Blackwell.
_ARCH_OF_CC = {(9, 0): "sm_90a", (10, 0): "sm_100a"}


def _graph_safe_traits() -> dict:
    """The registration keyword that lets XLA capture our calls into CUDA graphs (command
    buffers): every handler launches the same work for the same shapes, with no host sync and its
    workspace as an XLA-allocated result (cuda/common/workspace_registry.h)."""
    traits = getattr(xla_client, "CustomCallTargetTraits", None)
    return {} if traits is None else {"traits": traits.COMMAND_BUFFER_COMPATIBLE}


def _register_warm_call_type() -> None:
    """Registers the per-call state of the initialize stage, so that a warm call skips hashing its
    key. jax releases without `jax.ffi.register_ffi_type` keep no state: every initialize then
    hashes the key (cuda/common/call_key.h), which costs host time but nothing else."""
    register = getattr(jax.ffi, "register_ffi_type", None)
    if register is not None:
        register("jax_nvfp4.warm_call", _ext.warm_call_type(), platform="CUDA")


def _register_targets() -> dict:
    """Registers each target's execute handler, its instantiate stage (the per-call state) and its
    initialize stage, which loads the call's kernels before XLA launches the program
    (cuda/common/initialize_stage.h: a kernel loaded lazily at its first launch can deadlock a
    multi-GPU program)."""
    if _ext is None:
        return {}
    _register_warm_call_type()
    targets = dict(_ext.targets())
    for name, stages in targets.items():
        jax.ffi.register_ffi_target(name, dict(stages), platform="CUDA", **_graph_safe_traits())
    return targets


_TARGETS = _register_targets()
_WORKSPACE_TARGETS = frozenset(_ext.workspace_targets()) if _ext is not None else frozenset()
_SETTLED_TARGETS = frozenset(_ext.settled_targets()) if _ext is not None else frozenset()


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
def _cuda_compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the visible CUDA GPUs, or None (no GPU, or GPUs of several kinds)."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return None
    ccs = {tuple(int(v) for v in str(d.compute_capability).split(".")) for d in devices}
    return ccs.pop() if len(ccs) == 1 else None


def visible_cuda_arch() -> str | None:
    """The compiled arch ("sm_90a", "sm_100a") of the visible CUDA GPUs, or None (no GPU, GPUs of
    several kinds, or a kind without kernels)."""
    cc = _cuda_compute_capability()
    return None if cc is None else _ARCH_OF_CC.get(cc)


def kernel_available(target: str) -> bool:
    """Whether FFI target `target` exists and was compiled for the visible CUDA GPUs."""
    arch = visible_cuda_arch()
    return target in _TARGETS and arch is not None and arch in cuda_archs()


def host_calls(target: str) -> int:
    """How many times FFI target `target`'s handler has run on the host in this process; a call
    XLA replays from a CUDA graph (command buffer) does not run it."""
    return 0 if _ext is None else int(_ext.host_calls(target))


def cublaslt_gemm_calls() -> int | None:
    """How many sm_90a prefill GEMMs this process has enqueued through cuBLASLt; None where the
    extension was built without cuBLASLt's header (its prefill GEMM is then always CUTLASS's)."""
    if _ext is None:
        return None
    calls = _ext.cublaslt_gemm_calls()
    return None if calls is None else int(calls)


def _query(target: str, what: str, operands, results, attrs):
    """The arguments of the extension's lowering-time queries about a call to `target`: the
    visible GPU's compute capability (major*10+minor), the (dims, dtype name) of the operands
    and results (anything with .shape and .dtype), and the integer attributes."""
    cc = _cuda_compute_capability()
    if cc is None:
        raise RuntimeError(f"jax_nvfp4: {what} of {target} needs one kind of CUDA GPU")
    major, minor = cc
    shapes = lambda xs: [(tuple(int(d) for d in x.shape), np.dtype(x.dtype).name) for x in xs]
    ints = {name: int(v) for name, v in (attrs or {}).items()}
    return target, 10 * major + minor, shapes(operands), shapes(results), ints


def workspace_bytes(target: str, operands, results, attrs=None) -> int | None:
    """Bytes of the workspace result that FFI target `target` takes as its last result, for a
    call with these operands, (other) results and integer attributes, lowered on the visible GPU;
    with the attributes settled (settled_attrs), enough on any GPU of its compute capability.
    None when the target takes no workspace."""
    if _ext is None or target not in _WORKSPACE_TARGETS:
        return None
    return int(_ext.workspace_bytes(*_query(target, "sizing the workspace", operands, results, attrs)))


def settled_attrs(target: str, operands, results, attrs: dict) -> dict:
    """`attrs` with the choices FFI target `target` settles when lowered on the visible GPU (on
    Hopper, the GEMM kernel an auto path picks there, which depends on the SM count): the call
    then runs the kernel its workspace was sized for on any GPU of that compute capability."""
    if _ext is None or target not in _SETTLED_TARGETS:
        return attrs
    settled = _ext.settled_attrs(*_query(target, "settling the attributes", operands, results, attrs))
    return {**attrs, **{name: np.int64(v) for name, v in settled.items()}}


@functools.cache
def warn_reference_fallback(target: str) -> None:
    """Says once per target why a CUDA lowering falls back to the XLA reference."""
    if _ext is None:
        why = "the package was built without CUDA"
    elif target not in _TARGETS:
        why = f"the extension has no '{target}' kernel (not built)"
    else:
        try:
            devices = jax.devices("cuda")
            kinds = sorted({str(getattr(d, "compute_capability", "?")) for d in devices})
        except RuntimeError:
            kinds = []
        built = f"built for {', '.join(cuda_archs()) or 'nothing'}"
        if not kinds:  # e.g. jax.export for "cuda" on a machine without a GPU
            why = f"no CUDA GPU is visible while lowering, so no kernel can be chosen ({built})"
        elif len(kinds) > 1:
            why = f"GPUs of several kinds are visible (compute capabilities {', '.join(kinds)}; " \
                  f"{built})"
        else:
            why = f"no kernel is compiled for this GPU (compute capability {kinds[0]}; {built})"
    warnings.warn(f"jax_nvfp4: {target} runs as XLA reference code on the GPU: {why}.",
                  RuntimeWarning, stacklevel=3)
