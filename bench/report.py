"""What the bench scripts that write one markdown table share: their command line (--out,
--rounds) and writing the table to <out>/<stem>_<device kind>.md."""

from __future__ import annotations

import argparse
from pathlib import Path


def table_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of `doc`, with --out and --rounds."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--rounds", type=int, default=5)
    return parser


def write_table(lines: list[str], out_dir: Path, stem: str, device_kind: str) -> Path:
    """Writes the table's lines to out_dir/<stem>_<device_kind>.md, prints it and its path."""
    text = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}_{device_kind.replace(' ', '_')}.md"
    path.write_text(text)
    print(text)
    print(f"wrote {path}")
    return path
