"""Shared fixtures: device selection, SASS of the built extension, host C++ programs."""

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_SRC = REPO / "cuda"

# CI sets this: the CUDA extension must have been built, so tests that inspect it fail
# instead of skipping when it is missing.
REQUIRE_CUDA_BUILD = os.environ.get("JAX_NVFP4_REQUIRE_CUDA_BUILD") == "1"


def _missing(what):
    if REQUIRE_CUDA_BUILD:
        pytest.fail(f"{what} (JAX_NVFP4_REQUIRE_CUDA_BUILD=1)")
    pytest.skip(what)


@pytest.fixture
def gpu():
    """Skips unless a CUDA GPU is visible to JAX; returns its jax.Device."""
    import jax

    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        devices = []
    if not devices:
        pytest.skip("no CUDA GPU")
    return devices[0]


@pytest.fixture
def on_cpu():
    """Runs the test with the CPU as JAX's default device, also on GPU machines: for checks of
    the reference path at float32 tolerances (GPU kernels round float32 activations to bf16)."""
    import jax

    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def gpu_kernels(gpu):
    """gpu_kernels(*targets) skips unless every FFI target has a kernel built for the GPU, and
    returns the GPU's jax.Device."""
    from jax_nvfp4 import _extension

    def require(*targets):
        for target in targets:
            if not _extension.kernel_available(target):
                pytest.skip(f"{target} is not built for {gpu.device_kind}")
        return gpu

    return require


def _nvidia_tool(name):
    """cuobjdump/nvdisasm from the nvidia-cuda-* wheels, else from PATH."""
    try:
        import nvidia

        for root in nvidia.__path__:
            for sub in ("cu13", "cuda_cuobjdump", "cuda_nvdisasm"):
                cand = Path(root) / sub / "bin" / name
                if cand.exists():
                    return str(cand)
    except ImportError:
        pass
    return shutil.which(name)


@functools.lru_cache(maxsize=None)
def _extension_sass(arch):
    from jax_nvfp4 import _extension

    path = _extension.extension_path()
    if path is None:
        return None
    cuobjdump = _nvidia_tool("cuobjdump")
    if cuobjdump is None:
        pytest.fail("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    env = dict(os.environ)
    nvdisasm = _nvidia_tool("nvdisasm")
    if nvdisasm:  # cuobjdump finds nvdisasm on PATH for newer archs
        env["PATH"] = str(Path(nvdisasm).parent) + os.pathsep + env.get("PATH", "")
    out = subprocess.run(
        [cuobjdump, "--dump-sass", "--gpu-architecture", arch, path],
        capture_output=True, text=True, env=env, check=True,
    ).stdout
    return out


def _split_functions(sass):
    funcs, name, lines = {}, None, []
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                funcs[name] = "\n".join(lines)
            name, lines = m.group(1), []
        elif name:
            lines.append(line)
    if name:
        funcs[name] = "\n".join(lines)
    return funcs


@pytest.fixture
def kernel_sass():
    """kernel_sass(arch, pattern) -> {mangled name: SASS text} of the built extension's kernels
    for arch ("sm_90a" or "sm_100a") whose mangled name matches the regex pattern."""

    def get(arch, pattern):
        sass = _extension_sass(arch)
        if sass is None:
            _missing("the CUDA extension is not built")
        from jax_nvfp4 import _extension

        if arch not in _extension.cuda_archs():  # e.g. JAX_NVFP4_CUDA_ARCHS=90a
            _missing(f"the CUDA extension is built without {arch}")
        funcs = {n: s for n, s in _split_functions(sass).items() if re.search(pattern, n)}
        if not funcs:
            pytest.fail(f"no {arch} kernel matching {pattern!r} in the extension")
        return funcs

    return get


def _cutlass_include():
    try:
        import cutlass_library
    except ImportError:
        return None
    inc = Path(cutlass_library.__file__).parent / "source" / "include"
    return inc if inc.exists() else None


def _cuda_includes():
    """The CUDA toolkit's include dirs; CUDA 13 keeps CCCL (cuda/std, which CUTLASS needs) in
    include/cccl. nvcc on PATH may be a wrapper script, so also try CUDA_HOME and /usr/local/cuda."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.insert(0, str(Path(nvcc).resolve().parents[1]))
    for root in filter(None, roots):
        inc = Path(root) / "include"
        if (inc / "cuda_runtime.h").exists():
            return [str(inc)] + ([str(inc / "cccl")] if (inc / "cccl").exists() else [])
    return []


@pytest.fixture(scope="session")
def host_program(tmp_path_factory):
    """host_program(source, *, cutlass=False, ffi=False, cudart=False, args=()) compiles a host
    C++17 program with cuda/ (and the CUTLASS headers, XLA's FFI headers) on the include path,
    runs it and returns its stdout. With cudart, nvcc compiles it and links the CUDA runtime."""
    build = tmp_path_factory.mktemp("host_cxx")
    cache = {}

    def run(source, *, cutlass=False, ffi=False, cudart=False, args=()):
        cxx = shutil.which("nvcc") if cudart else shutil.which("g++") or shutil.which("c++")
        if cxx is None:
            _missing("no nvcc on PATH" if cudart else "no host C++ compiler")
        source = Path(source)
        if source not in cache:
            includes = ["-I", str(CUDA_SRC)]
            if cutlass:
                inc = _cutlass_include()
                if inc is None:
                    _missing("CUTLASS headers not installed (pip install nvidia-cutlass)")
                includes += ["-isystem", str(inc)]
                includes += [f"-isystem{d}" for d in _cuda_includes()]
            if ffi:
                import jax.ffi

                includes += ["-isystem", jax.ffi.include_dir()]
            exe = build / source.stem
            subprocess.run([cxx, "-std=c++17", "-O1", *includes, str(source), "-o", str(exe)],
                           check=True, capture_output=True, text=True)
            cache[source] = exe
        return subprocess.run([str(cache[source]), *map(str, args)], check=True,
                              capture_output=True, text=True).stdout

    return run


@pytest.fixture(scope="session")
def nvcc_sm90_object():
    """nvcc_sm90_object(source, out) compiles one CUDA translation unit for sm_90a with cuda/,
    bench/ and the CUTLASS headers on the include path; returns the CompletedProcess."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        _missing("no nvcc on PATH")
    inc = _cutlass_include()
    if inc is None:
        _missing("CUTLASS headers not installed (pip install nvidia-cutlass)")

    def compile_(source, out):
        return subprocess.run(
            [nvcc, "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "--expt-relaxed-constexpr",
             "-I", str(CUDA_SRC), "-I", str(REPO / "bench"), "-isystem", str(inc),
             "-isystem", str(inc.parent / "tools" / "util" / "include"), "-c", str(source), "-o", str(out)],
            capture_output=True, text=True)

    return compile_
