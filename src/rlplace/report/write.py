"""`write_report(multirun_dir)`: the table (printed and in report.md) and the charts, next to the jobs."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlplace.report import charts
from rlplace.report.collect import JobResult, baseline_for, collect

COLUMNS = (
    "job",
    "mode",
    "stages",
    "env steps/s",
    "spread",
    "ideal",
    "vs collocated",
    "step s",
    "env s",
    "rollout s",
    "train s",
)


def rows(results: list[JobResult]) -> list[list[str]]:
    out = []
    for r in results:
        if r.skipped:
            out.append([r.job, "skipped", "", "", "", "", "", "", "", "", ""])
            continue
        base = baseline_for(r, results)
        speedup = r.median_throughput / base.median_throughput if base else math.nan
        m = r.medians
        out.append(
            [
                r.job,
                r.mode,
                str(r.stages),
                f"{r.median_throughput:.0f}",
                f"{min(r.throughput):.0f}-{max(r.throughput):.0f}",
                f"{r.ideal_throughput:.0f}",
                f"{speedup:.2f}x",
                f"{m['time/step']:.3f}",
                f"{m['time/env']:.3f}",
                f"{m['time/rollout']:.3f}",
                f"{m['time/training']:.3f}",
            ]
        )
    return out


def markdown_table(table: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    return "\n".join(lines)


def write_report(multirun_dir: Path, console: Console | None = None) -> Path:
    """Write report.md and the PNG charts into `multirun_dir`, print the table, and return report.md's path."""
    results = collect(multirun_dir)
    ran = [r for r in results if not r.skipped]
    table = rows(results)
    images = []
    if ran:
        images += [
            charts.throughput_chart(ran, multirun_dir / "throughput.png"),
            charts.speedup_chart(ran, multirun_dir / "speedup.png"),
            charts.time_breakdown_chart(ran, multirun_dir / "time_breakdown.png"),
            charts.utilization_chart(ran, multirun_dir / "utilization.png"),
        ]
        images += [charts.timeline_chart(r, multirun_dir / f"timeline_{r.job}.png") for r in ran]
    text = [
        f"# Placement sweep: {multirun_dir}",
        "",
        "Medians over the steps after warm-up; *spread* is min-max over those steps; *ideal* is the throughput if "
        "env and rollout overlapped perfectly (generation costing only the slower of the two, from the same run's "
        "stage times); *vs collocated* compares with the collocated run of the same pipeline stages.",
        "",
        markdown_table(table),
        "",
        *[f"- job {r.job} ({r.label}): skipped: {r.skipped}" for r in results if r.skipped],
        "",
        *[f"![{p.stem}]({p.name})" for p in images],
        "",
    ]
    report = multirun_dir / "report.md"
    report.write_text("\n".join(text))
    printed = Table(title=f"placement sweep ({len(ran)} of {len(results)} jobs ran)")
    for column in COLUMNS:
        printed.add_column(column)
    for row in table:
        printed.add_row(*row)
    if console is None:
        console = Console()
        console = console if console.is_terminal else Console(width=150)  # logs and CI: no wrapping
    console.print(printed)
    return report
