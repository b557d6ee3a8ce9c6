"""Keeps benchmarks/RESULTS.md current: each benchmark script replaces its own section when it finishes.

A section starts at a heading `## <script name>` and runs to the next `## ` heading. `write_section` replaces it (or
appends it) with the table the script printed, the machine it ran on and today's date; the rest of the file is left
as it is. Sections without a script (a `make` target, a sweep) are written by hand in the same form.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def _machine() -> str:
    """Platform, CPU count, torch version and GPU name (if any) of this process's machine."""
    parts = [platform.platform(terse=True), f"{os.cpu_count()} CPUs"]
    try:
        import torch
    except ImportError:
        return ", ".join(parts)
    parts.append(f"torch {torch.__version__}")
    if torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name(0))
    return ", ".join(parts)


def write_section(name: str, table_markdown: str, machine: str | None = None) -> Path:
    """Replace (or append) the section of benchmark `name` (its file name, e.g. "handoff.py") in RESULTS.md."""
    heading = f"## {name}"
    body = (
        f"{heading}\n\n"
        f"Machine: {machine or _machine()}. Date: {datetime.date.today().isoformat()}.\n\n"
        f"{table_markdown.strip()}\n"
    )
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        text = text.rstrip("\n") + "\n\n" + body
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        rest = "".join(lines[end:])
        text = "".join(lines[:start]) + body + ("\n" + rest if rest else "")
    RESULTS.write_text(text)
    return RESULTS


def publish(name: str, caption: str, lines: list[str]) -> None:
    """Print a benchmark's table (its markdown `lines`) and refresh its section of RESULTS.md, `caption` above it."""
    table = "\n".join(lines)
    print(table)
    write_section(name, f"{caption}\n\n{table}")
