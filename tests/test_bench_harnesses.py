"""The kernel benchmarks in bench/*.cu compile against the current kernel entry points (CPU).

They are built and run only on a GPU machine, so nothing else would notice when a kernel's
signature moves under them (fused_gemm_bench.cu did not compile for a session after
fused_ws_gemm gained its tile width). Compiling a harness's own translation unit takes seconds;
the kernels it links are the extension's sources, compiled by the extension's build.
"""

from pathlib import Path

import pytest

HARNESSES = sorted((Path(__file__).resolve().parents[1] / "bench").glob("*.cu"))


def test_there_are_harnesses_to_compile():
    assert len(HARNESSES) >= 6, HARNESSES


@pytest.mark.parametrize("source", HARNESSES, ids=lambda p: p.name)
def test_bench_harness_compiles(source, nvcc_sm90_object, tmp_path):
    result = nvcc_sm90_object(source, tmp_path / "harness.o")
    assert result.returncode == 0, result.stderr[-4000:]
