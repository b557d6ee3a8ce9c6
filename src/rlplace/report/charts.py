"""The report's charts, drawn with matplotlib from `JobResult`s and each run's own timeline.json."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from rlplace.report.collect import PHASES, JobResult, baseline_for  # noqa: E402


def _short(result: JobResult) -> str:
    return f"{result.mode}\n{result.stages} stage{'s' if result.stages > 1 else ''}"


def throughput_chart(results: list[JobResult], path: Path) -> Path:
    """Median env steps/s per job with its spread over steps (min to max) and the ideal with perfect overlap."""
    fig, ax = plt.subplots(figsize=(1.6 * len(results) + 2, 4))
    x = range(len(results))
    medians = [r.median_throughput for r in results]
    low = [m - min(r.throughput) for m, r in zip(medians, results, strict=True)]
    high = [max(r.throughput) - m for m, r in zip(medians, results, strict=True)]
    ax.bar(x, medians, yerr=[low, high], capsize=4, color="tab:blue", label="measured (median, min-max)")
    ax.scatter(x, [r.ideal_throughput for r in results], marker="_", s=400, color="black", label="ideal overlap")
    ax.set_xticks(list(x), [_short(r) for r in results])
    ax.set_ylabel("env steps/s")
    ax.set_title("Throughput per placement")
    ax.legend(loc="lower right")
    return _save(fig, path)


def speedup_chart(results: list[JobResult], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(1.6 * len(results) + 2, 3.5))
    speedups = []
    for r in results:
        base = baseline_for(r, results)
        speedups.append(r.median_throughput / base.median_throughput if base else float("nan"))
    ax.bar(range(len(results)), speedups, color="tab:green")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(results)), [_short(r) for r in results])
    ax.set_ylabel("speedup over collocated")
    ax.set_title("Speedup over collocated (same stages)")
    return _save(fig, path)


def time_breakdown_chart(results: list[JobResult], path: Path) -> Path:
    """Stacked median time per phase of one training step."""
    fig, ax = plt.subplots(figsize=(1.6 * len(results) + 3, 4))
    bottom = [0.0] * len(results)
    for phase in PHASES:
        values = [r.medians.get(phase, 0.0) for r in results]
        ax.bar(range(len(results)), values, bottom=bottom, label=phase.removeprefix("time/"))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(range(len(results)), [_short(r) for r in results])
    ax.set_ylabel("seconds per step")
    ax.set_title("Where a step's time goes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, path)


def utilization_chart(results: list[JobResult], path: Path) -> Path:
    devices = sorted({k for r in results for k in r.medians if k.startswith("util/")})
    fig, ax = plt.subplots(figsize=(1.6 * len(results) + 3, 3.5))
    width = 0.8 / max(len(devices), 1)
    for i, key in enumerate(devices):
        ax.bar(
            [j + i * width for j in range(len(results))],
            [r.medians.get(key, 0.0) for r in results],
            width,
            label=key.split("/")[1],
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(results))], [_short(r) for r in results])
    ax.set_ylim(0, 1)
    ax.set_ylabel("busy fraction")
    ax.set_title("Device utilisation")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, path)


def timeline_chart(result: JobResult, path: Path) -> Path:
    """The run's last training step: one row per device, one coloured bar per phase of every worker on it."""
    trace = json.loads((result.path / "timeline.json").read_text())["traceEvents"]
    rows = {e["pid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    steps = [e for e in trace if e["ph"] == "X" and e["name"] == "step"]
    last = max(steps, key=lambda e: e["ts"])
    t0, t1 = last["ts"], last["ts"] + last["dur"]
    spans = [e for e in trace if e["ph"] == "X" and e["name"] != "step" and t0 <= e["ts"] < t1 and e["pid"] in rows]
    names = sorted({e["name"] for e in spans})
    colors = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(names)}
    order = sorted(rows, key=lambda pid: (rows[pid] == "host", pid))
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(order) + 1.5))
    for y, pid in enumerate(order):
        bars = [((e["ts"] - t0) / 1e3, e["dur"] / 1e3, e["name"]) for e in spans if e["pid"] == pid]
        for start, width, name in bars:
            ax.broken_barh([(start, max(width, 0.05))], (y - 0.35, 0.7), color=colors[name])
    ax.set_yticks(range(len(order)), [rows[pid] for pid in order])
    ax.invert_yaxis()
    ax.set_xlabel("ms into the step")
    ax.set_title(f"Timeline of one step: {result.label}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names]
    ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
