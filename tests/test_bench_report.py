"""bench/report.py, the helpers the benchmark scripts share (CPU)."""

import os
import sys
from pathlib import Path

import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import report  # noqa: E402

VARIABLE = "JAX_NVFP4_TEST_BENCH_FORCED"


def test_timer_forcing_lowers_with_the_variable_set_and_restores_it(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    seen = []

    def fn(a):  # traced while the timer is built: records what lowering would read
        seen.append(os.environ.get(VARIABLE))
        return a * 2.0

    timer = report.timer_forcing(VARIABLE, "kernel_b", fn, (jnp.ones((8, 8)),), rotate=False)
    assert timer is not None and timer() > 0.0
    assert seen and set(seen) == {"kernel_b"}
    assert VARIABLE not in os.environ


def test_timer_forcing_gives_none_for_a_refused_choice_and_says_why(monkeypatch, capsys):
    monkeypatch.delenv(VARIABLE, raising=False)

    def refuses(a):
        raise ValueError(f"{VARIABLE}={os.environ[VARIABLE]} does not take shape {a.shape}")

    assert report.timer_forcing(VARIABLE, "decode", refuses, (jnp.ones((4, 4)),)) is None
    assert f"{VARIABLE}=decode: ValueError" in capsys.readouterr().out
    assert VARIABLE not in os.environ


def test_host_loop_times_reads_one_positive_time_per_round():
    calls = []

    def fn(a):
        calls.append(1)
        return a + 1.0

    times = report.host_loop_times(fn, (jnp.ones(4),), calls=5, rounds=3)
    assert len(times) == 3 and all(t > 0.0 for t in times)
    assert len(calls) == 1 + 5 * 3  # a warm-up call, then calls x rounds


def test_tables_are_named_by_stem_and_device_kind(tmp_path, capsys):
    path = report.write_table(["| a |", "|---|"], tmp_path / "new", "matmul", "NVIDIA H200")
    assert path == tmp_path / "new" / "matmul_NVIDIA_H200.md"
    assert path.read_text() == "| a |\n|---|\n"
    assert str(path) in capsys.readouterr().out
    assert report.table_path(tmp_path, "matmul", "NVIDIA H200", ".csv").name == "matmul_NVIDIA_H200.csv"


def test_tables_go_outside_the_kept_results_unless_told(tmp_path):
    """bench/results/ holds dated files cited by the docs: a run without --out must not write there."""
    assert report.table_parser("doc").parse_args([]).out == report.DEFAULT_OUT
    assert "results" not in report.DEFAULT_OUT.parts
    assert report.table_parser("doc").parse_args(["--out", str(tmp_path)]).out == tmp_path


def test_nvfp4_bytes_per_element_is_the_arrays_own():
    from jax_nvfp4 import quantize
    q = quantize(jnp.ones((256, 1024), jnp.float32))  # whole scale tiles: no padding
    assert q.nbytes == 256 * 1024 * report.NVFP4_BYTES_PER_ELEMENT + 4  # + s_dec, a float32
