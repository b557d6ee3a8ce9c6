"""`write_report(multirun_dir)`: the table (printed and in report.md), the charts next to the jobs, and a one-line
recommendation at the end."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlplace.metrics.logger import WARMUP_STEPS
from rlplace.report import charts
from rlplace.report.collect import HANDOFF_WAIT, STAGES, JobResult, collect, speedup

Column = tuple[str, Callable[[JobResult], str]]
"""A table column: its header and how a job that ran fills it."""


def _number(value: float, spec: str = ".0f", missing: str = "-") -> str:
    """A number as the table shows it, or `missing` for nan (a job with nothing to compare or measure)."""
    return missing if math.isnan(value) else format(value, spec)


def _ratio(value: float) -> str:
    """A speedup, 1.30x, or n/a without a collocated run to compare with."""
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def _count(value: float) -> str:
    """A large count, short: 4.53M, 812k."""
    if math.isnan(value):
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _n(result: JobResult) -> str:
    return f"{result.n}{'' if result.warmup or not result.n else '*'}"


def _spread(result: JobResult) -> str:
    return f"{min(result.throughput):.0f}-{max(result.throughput):.0f}" if result.n > 1 else "-"


def _seconds(key: str) -> Callable[[JobResult], str]:
    """A median in seconds, or "-" for a metric the job does not log (time/overlap of a synchronous run)."""
    return lambda r: f"{r.medians[key]:.3f}" if key in r.medians else "-"


def columns(results: list[JobResult]) -> list[Column]:
    """The table's columns; the unit and the stage columns follow the family of the jobs that ran (env steps and
    env/rollout for embodied runs, tokens and rollout/reward/inference for reasoning runs)."""
    ran = [r for r in results if not r.skipped]
    unit = ran[0].unit if ran else "env steps"
    stages = [key for key in STAGES if any(key in r.medians for r in ran)]
    adaptive = any(r.replaced for r in ran)
    return [
        ("job", lambda r: r.job),
        ("mode", lambda r: r.mode + (" (re-placed)" if r.replaced else "")),
        ("stages", lambda r: str(r.stages)),
        ("K", lambda r: str(r.staleness)),
        ("devices", lambda r: str(r.devices)),
        ("n", _n),
        (f"{unit}/s", lambda r: _number(r.median_throughput)),
        ("spread", _spread),
        ("ideal", lambda r: _number(r.ideal_throughput)),
        ("vs collocated", lambda r: _ratio(speedup(r, results))),
        ("per device/s", lambda r: _number(r.per_device)),
        ("per device-hour", lambda r: _count(r.per_device * 3600)),
        ("step s", _seconds("time/step")),
        *([("run s", lambda r: _number(r.run_s, ".1f"))] if adaptive else []),
        *(
            [
                ("predicted s", lambda r: "-" if r.predicted_step is None else f"{r.predicted_step:.3f}"),
                ("error", lambda r: "-" if r.predicted_step is None else f"{r.prediction_error:.0%}"),
            ]
            if any(r.predicted_step is not None for r in ran)
            else []
        ),
        *[(f"{key.removeprefix('time/')} s", _seconds(key)) for key in stages],
        ("wait s", _seconds(HANDOFF_WAIT)),
        ("train s", _seconds("time/training")),
        ("overlap s", _seconds("time/overlap")),
    ]


def rows(results: list[JobResult], table: list[Column]) -> list[list[str]]:
    blank = [""] * (len(table) - 2)
    return [[r.job, "skipped", *blank] if r.skipped else [fill(r) for _, fill in table] for r in results]


def markdown_table(headers: list[str], table: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    return "\n".join(lines)


def recommendation(ran: list[JobResult]) -> str:
    """The sentence a placement is decided from: the fastest job, and by how much it beats the fastest job of
    another mode (or, if only one mode ran, the next job) on this cluster, flagged when the steps' spreads overlap.
    Jobs that measured no step take no part."""
    if not ran:
        return "no job ran: nothing to recommend"
    ran = [r for r in ran if r.n]
    if not ran:
        return "no job that ran measured a step: nothing to recommend"
    fastest = max(ran, key=lambda r: r.median_throughput)
    where = f"on this cluster ({fastest.devices} devices)"
    headline = f"fastest: {fastest.title} ({fastest.median_throughput:,.0f} {fastest.unit}/s)"
    other_modes = [r for r in ran if r.mode != fastest.mode]
    rivals = other_modes or [r for r in ran if r is not fastest]
    if not rivals:
        return f"{headline} {where}; it is the only job that ran: nothing to compare it with"
    rival = max(rivals, key=lambda r: r.median_throughput)
    if rival.median_throughput > 0:
        text = f"{headline}, {fastest.median_throughput / rival.median_throughput:.2f}x over {rival.title} {where}"
    else:
        text = f"{headline}, where {rival.title} measured no throughput, {where}"
    if min(fastest.throughput) <= max(rival.throughput):
        text += "; within the spread over steps, so not a clear win"
    return text if other_modes else f"{text}; only {fastest.mode} ran"


def prediction_note(ran: list[JobResult]) -> list[str]:
    """What *predicted s* and *error* are, when the sweep had a profile: which run's, and that the profiled job is
    the model's calibration point (its own error says nothing about the model)."""
    sources = sorted({r.predicted_from for r in ran if r.predicted_from})
    if not sources:
        return []
    return [
        f"*predicted s* is the planner's step time for the job from the profile of {', '.join(sources)} "
        "(`rlplace-plan plan.profile=...`; the profiled run itself is the model's calibration point); *error* is "
        "|predicted - measured| / measured step time."
    ]


@dataclass
class Report:
    """A written report: report.md, the table it holds, and the charts beside it."""

    path: Path
    results: list[JobResult]
    headers: list[str]
    rows: list[list[str]]
    images: list[Path] = field(default_factory=list)
    advice: str = ""
    """The recommendation line."""


def write_report(multirun_dir: Path, console: Console | None = None) -> Path:
    """Write report.md and the PNG charts into `multirun_dir`, print the table, and return report.md's path.
    Raises `collect.ReportError` for a folder that is not a sweep's or a job that is no finished run's."""
    return make_report(multirun_dir, console).path


def make_report(multirun_dir: Path, console: Console | None = None) -> Report:
    """`write_report`, returning what it wrote (for `dashboard.log_report`)."""
    results = collect(multirun_dir)
    ran = [r for r in results if not r.skipped]
    measured = [r for r in ran if r.n]  # a job that measured no step has nothing to chart
    table = columns(results)
    headers = [header for header, _ in table]
    body = rows(results, table)
    images = []
    if measured:
        images += [
            charts.throughput_chart(measured, multirun_dir / "throughput.png"),
            charts.speedup_chart(measured, multirun_dir / "speedup.png"),
            charts.time_breakdown_chart(measured, multirun_dir / "time_breakdown.png"),
            charts.utilization_chart(measured, multirun_dir / "utilization.png"),
        ]
        images += [
            charts.timeline_chart(r, multirun_dir / f"timeline_{r.job}.png")
            for r in measured
            if (r.path / "timeline.json").exists()
        ]
    advice = recommendation(ran)
    notes = [f"- job {r.job} ({r.label}): {r.note}" for r in ran if r.note]
    notes += [
        f"- job {r.job} ({r.label}): re-placed after step "
        + ", ".join(f"{m['step']} ({m['to']}, {m['seconds']:.1f} s)" for m in r.replaced)
        + ": its medians mix its placements; *run s* (every step and switch) compares it with a fixed placement"
        for r in ran
        if r.replaced
    ]
    text = [
        f"# Placement sweep: {multirun_dir}",
        "",
        f"Medians over the *n* steps measured after {WARMUP_STEPS} warm-up steps (*: a run too short to leave them "
        "out, measured over all its steps); *spread* is min-max over those steps; *ideal* is the throughput if the "
        "generation stages overlapped perfectly (generation costing only the busiest stage); *K* is "
        "runner.max_staleness (0: synchronous; K: generation runs K steps ahead of training); *vs collocated* "
        "compares with the synchronous collocated run of the same pipeline stages; *per device* divides by every "
        "device the run holds, busy or idle; *wait* is the hand-off wait: generation time the busiest stage does not "
        "cover; *overlap* is training time that ran beside generation.",
        *prediction_note(ran),
        "",
        markdown_table(headers, body),
        "",
        *[f"- job {r.job} ({r.label}): skipped: {r.skipped}" for r in results if r.skipped],
        *notes,
        "",
        *[f"![{p.stem}]({p.name})" for p in images],
        "",
        f"**Recommendation:** {advice}",
        "",
    ]
    report = multirun_dir / "report.md"
    report.write_text("\n".join(text))
    printed = Table(title=f"placement sweep ({len(ran)} of {len(results)} jobs ran)")
    for header in headers:
        printed.add_column(header)
    for row in body:
        printed.add_row(*row)
    if console is None:
        console = Console()
        console = console if console.is_terminal else Console(width=200)  # logs and CI: no wrapping
    console.print(printed)
    for note in notes:
        console.print(f"rlplace: {note.removeprefix('- ')}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"rlplace: {advice}")
    return Report(report, results, headers, body, images, advice)
