"""bench/bench_clocks.py's reading of a profiler trace and of nvidia-smi (CPU: no GPU needed).

Its figures go to bench/results/ and into the issues' closing notes; a miscount here (a kernel
launched twice a call read as two calls) halved a GEMM's time there once, before it was fixed.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_clocks  # noqa: E402

GEMM = "void jax_nvfp4::sm90::fused_ws_kernel<256, 16, false>(GemmProblem)"
STAGE = "void jax_nvfp4::sm90::stage_kernel<0, 256>(GemmProblem)"


def test_base_name_drops_xla_numbering_only():
    assert bench_clocks.base_name("gemm_fusion_dot_general_3") == "gemm_fusion_dot_general"
    assert bench_clocks.base_name("loop_add_fusion.12") == "loop_add_fusion"
    assert bench_clocks.base_name(GEMM) == GEMM


def test_a_kernel_launched_twice_a_call_counts_both_launches():
    # fused_ws runs its whole waves and its last partial wave as two launches; staging once.
    kernels = [(STAGE, 6.0), (GEMM, 80.0), (GEMM, 5.0)] * 3 + [("loop_reduce_fusion_2", 1.0)]
    total, each = bench_clocks.per_call(kernels, {bench_clocks.base_name(STAGE), GEMM})
    assert total == pytest.approx(91.0)
    assert each == {STAGE: pytest.approx(6.0), GEMM: pytest.approx(85.0)}


def test_a_kernel_missing_from_the_loop_reads_none():
    total, each = bench_clocks.per_call([("gemm_fusion_dot_7", 30.0)] * 4,
                                        {"gemm_fusion_dot", "Memset 3"})
    assert total == pytest.approx(30.0) and each == {"gemm_fusion_dot": 30.0, "Memset 3": None}
    with pytest.raises(RuntimeError, match="none of the op's kernels"):
        bench_clocks.per_call([("other", 1.0)], {"gemm_fusion_dot"})


def test_smi_samples_skip_unreported_fields_and_cut_lines_and_name_the_slowdowns(monkeypatch):
    lines = ["1980, 650.10, 55, 0x0000000000000004", "1755, 699.90, 57, 0x0000000000000000",
             "[N/A], 10.0, 50, 0x0", "1500, 640.0, 56, 0x0000000000000008", "1710, 6"]

    class FakeSmi:
        def __init__(self, *args, **kwargs):
            pass

        def terminate(self):
            pass

        def communicate(self):
            return "\n".join(lines) + "\n", ""

    monkeypatch.setattr(bench_clocks.subprocess, "Popen", FakeSmi)
    monkeypatch.setattr(bench_clocks.time, "sleep", lambda s: None)
    with bench_clocks.SmiSampler() as s:
        pass
    assert len(s.samples) == 3
    assert s.summary() == {"clock": 1755.0, "clock_min": 1500.0, "power": 650.1, "temp": 57.0,
                           "reasons": "sw power cap, hw slowdown"}
