"""jax_nvfp4.timing: the device-side timer of the demo and the benchmarks (CPU)."""

import itertools
import time

import jax.numpy as jnp
import pytest

from jax_nvfp4.timing import (ATTEMPTS, COPIES, COPIES_BYTES, IDLE_S, LoopTimer, bytes_a_device,
                               interleaved_times, loop_time, rotation_copies)


@pytest.mark.parametrize("rotate,chain", [(True, 1), (False, 3)])
def test_loop_timer_reads_a_positive_time_per_call(rotate, chain):
    x = jnp.arange(4096, dtype=jnp.float32).reshape(64, 64)
    timer = LoopTimer(lambda a: a @ a + 1.0, (x,), rotate=rotate, chain=chain)
    readings = [timer() for _ in range(3)]
    assert all(0.0 < t < 0.1 for t in readings), readings


def test_loop_time_of_more_work_is_longer():
    small = jnp.ones((32, 32), jnp.float32)
    big = jnp.ones((512, 512), jnp.float32)
    assert loop_time(lambda a: a @ a, (big,)) > loop_time(lambda a: a @ a, (small,))


def test_interleaved_times_takes_each_timers_median_round_robin():
    calls = []

    def fake(name, values):
        values = itertools.cycle(values)
        return lambda: calls.append(name) or next(values)

    got = interleaved_times({"a": fake("a", [3.0, 1.0, 2.0]), "b": fake("b", [5.0])}, rounds=3)
    assert got == {"a": 2.0, "b": 5.0}
    assert calls == ["a", "b"] * 3


def test_interleaved_times_idles_before_every_reading(monkeypatch):
    events = []
    monkeypatch.setattr(time, "sleep", lambda s: events.append(("idle", s)))
    timers = {name: (lambda name=name: events.append(("read", name)) or 1.0) for name in "ab"}
    interleaved_times(timers, rounds=2)
    assert events == [("idle", IDLE_S), ("read", "a"), ("idle", IDLE_S), ("read", "b")] * 2
    assert IDLE_S > 0


@pytest.mark.parametrize("warm_s", [0.0, 0.05])
def test_loop_timer_runs_the_loop_untimed_for_warm_s_first(warm_s):
    """A reading runs the n-iteration loop untimed until warm_s has passed (none for 0), then the
    two timed runs (again, as a pair, where a busy host stalled the first pair)."""
    x = jnp.ones((64, 64), jnp.float32)
    timer = LoopTimer(lambda a: a @ a, (x,), rotate=False)
    short, long = timer._runs
    runs = []
    timer._runs = (lambda s: runs.append("n") or short(s), lambda s: runs.append("2n") or long(s))
    t0 = time.perf_counter()
    timer(warm_s)
    assert time.perf_counter() - t0 >= warm_s
    untimed = runs.index("2n") - 1
    assert runs[:untimed] == ["n"] * untimed and (untimed > 0) == (warm_s > 0)
    timed = runs[untimed:]
    assert timed == ["n", "2n"] * (len(timed) // 2)


def _stalled_runs(timer, stalls):
    """timer's two runs, each first sleeping the next of `stalls` seconds (a stalled host)."""
    stalls = iter(stalls)
    short, long = timer._runs
    stall = lambda run: lambda s: time.sleep(next(stalls)) or run(s)  # noqa: E731
    return stall(short), stall(long)


def test_loop_timer_times_again_a_pair_that_a_stalled_host_spoiled():
    """A stall in the n-run (as long as the whole 2n-run) would make the difference negative:
    that pair is timed again."""
    timer = LoopTimer(lambda a: a @ a, (jnp.ones((64, 64), jnp.float32),), rotate=False)
    timer._runs = _stalled_runs(timer, [0.5, 0.0, 0.0, 0.0])
    assert 0.0 < timer(0.0) < 0.1


def test_loop_timer_gives_up_when_every_pair_is_spoiled():
    timer = LoopTimer(lambda a: a @ a, (jnp.ones((64, 64), jnp.float32),), rotate=False)
    timer._runs = _stalled_runs(timer, [0.5, 0.0] * ATTEMPTS)
    with pytest.raises(RuntimeError, match=f"no longer than .* in {ATTEMPTS} tries"):
        timer(0.0)


def test_rotation_copies_grow_with_the_split_and_stop_at_the_memory_bound():
    mb = 10**6
    assert rotation_copies(9_400_000, 9_400_000) == COPIES  # one device: always COPIES
    assert rotation_copies(10 * mb, 10 * mb // 4) == 4 * COPIES  # split over 4: 4x the sets
    assert rotation_copies(10 * mb + 1, 10 * mb // 4) == 5 * COPIES  # a partly split set: rounded up
    assert rotation_copies(COPIES_BYTES // 2, COPIES_BYTES // 2) == 2  # huge: what fits a device
    assert rotation_copies(8 * COPIES_BYTES, COPIES_BYTES) == 1


def test_a_rotating_timer_on_one_device_makes_copies_sets():
    x = jnp.ones((64, 64), jnp.float32)
    assert bytes_a_device(x) == x.nbytes
    assert len(LoopTimer(lambda a: a + 1.0, (x,))._sets) == COPIES
