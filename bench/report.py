"""What the bench scripts share: their command line (--out, --rounds), writing a table to
<out>/<stem>_<device kind>.md, timing an op with one of the library's environment choices forced,
timing host-dispatched calls, and the NVFP4 storage cost of an element."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import jax

from jax_nvfp4.timing import LoopTimer

NVFP4_BYTES_PER_ELEMENT = 0.5 + 1 / 16  # codes, plus one e4m3 scale a 16-element block
# Where tables go without --out: ignored by git. Results kept in bench/results/ carry a date in
# their name, so a run cannot overwrite them.
DEFAULT_OUT = Path("bench_out")


def table_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of `doc`, with --out and --rounds."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--rounds", type=int, default=5)
    return parser


def table_path(out_dir: Path, stem: str, device_kind: str, suffix: str = ".md") -> Path:
    """out_dir/<stem>_<device kind><suffix>, out_dir created."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir / f"{stem}_{device_kind.replace(' ', '_')}{suffix}"


def write_table(lines: list[str], out_dir: Path, stem: str, device_kind: str) -> Path:
    """Writes the table's lines to out_dir/<stem>_<device_kind>.md, prints it and its path."""
    text = "\n".join(lines) + "\n"
    path = table_path(out_dir, stem, device_kind)
    path.write_text(text)
    print(text)
    print(f"wrote {path}")
    return path


def timer_forcing(variable: str, value: str, fn, args, **timer_kwargs) -> LoopTimer | None:
    """A LoopTimer of fn(*args) lowered with the environment variable `variable` set to `value`.

    The library reads its path and kernel choices when a call is lowered: JAX's caches are
    cleared around the build so that it lowers afresh, while timers built already keep their
    executables. A forced choice that refuses the shape gives None, its reason printed, so a
    table reads nan there instead of the whole run ending."""
    os.environ[variable] = value
    jax.clear_caches()
    try:
        return LoopTimer(fn, args, **timer_kwargs)
    except Exception as e:  # noqa: BLE001 (any refusal: the table marks it, the run goes on)
        print(f"  {variable}={value}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return None
    finally:
        os.environ.pop(variable, None)
        jax.clear_caches()


def host_loop_times(fn, args, calls: int, rounds: int) -> list[float]:
    """Seconds per call of `calls` calls of fn(*args) enqueued back to back from the host, once
    per round after a warm-up call (so host dispatch is in the reading: for ops long enough to
    hide it, or for measuring it)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return times
