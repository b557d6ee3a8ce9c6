"""The report's charts, drawn with matplotlib from `JobResult`s and each run's own timeline.json.

Every chart that shows phases colours them from one mapping (`PHASE_COLOURS`), so training is the same orange in the
time breakdown and in every timeline, and a reader matches bars across charts by colour alone. Legends sit outside
the axes, where they cannot hide a bar.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from rlplace.report.collect import BREAKDOWN, JobResult, speedup  # noqa: E402

PHASE_COLOURS = {
    "sync_weights": "#9467bd",
    "generate_rollouts": "#1f77b4",
    "handoff_wait": "#c7c7c7",
    "env": "#2ca02c",
    "rollout": "#17becf",
    "reward": "#bcbd22",
    "inference": "#e377c2",
    "advantages": "#8c564b",
    "training": "#ff7f0e",
    "offload": "#d62728",
    "onload": "#ff9896",
    "checkpoint": "#7f7f7f",
    "evaluate": "#aec7e8",
    "other": "#000000",
}
"""The one colour of each phase, in every chart."""

PHASE_OF = {
    "busiest_stage": "generate_rollouts",
    "recv_rollout_batch": "generate_rollouts",
    "env_step": "env",
    "rollout_infer": "rollout",
    "rollout_generate": "rollout",
}
"""Breakdown segments and worker spans that belong to a phase under another name."""

OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1, 1), "fontsize": 8}
"""Legend placement right of the axes."""


def phase_of(name: str) -> str:
    """The phase (a key of `PHASE_COLOURS`) of a metric (`time/training`), segment or span name; "other" if none."""
    name = name.removeprefix("time/")
    name = PHASE_OF.get(name, name)
    return name if name in PHASE_COLOURS else "other"


def _tick(result: JobResult) -> str:
    """An x tick: mode, stages and the number of measured steps, one per line."""
    return "\n".join([*result.title.split(", "), f"n={result.n}"])


def throughput_chart(results: list[JobResult], path: Path) -> Path:
    """Median throughput per job with its spread over the n measured steps (min to max), and the ideal with
    perfect overlap."""
    fig, ax = plt.subplots(figsize=(1.6 * len(results) + 3.5, 4))
    x = range(len(results))
    medians = [r.median_throughput for r in results]
    low = [m - min(r.throughput) for m, r in zip(medians, results, strict=True)]
    high = [max(r.throughput) - m for m, r in zip(medians, results, strict=True)]
    ax.bar(x, medians, yerr=[low, high], capsize=4, color="tab:blue", label="measured (median, min-max)")
    ax.scatter(x, [r.ideal_throughput for r in results], marker="_", s=400, color="black", label="ideal overlap")
    ax.set_xticks(list(x), [_tick(r) for r in results])
    ax.set_ylabel(f"{results[0].unit}/s")
    ax.set_title("Throughput per placement")
    ax.legend(**OUTSIDE)
    return _save(fig, path)


def speedup_chart(results: list[JobResult], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(1.6 * len(results) + 2, 3.5))
    ax.bar(range(len(results)), [speedup(r, results) for r in results], color="tab:green")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(results)), [_tick(r) for r in results])
    ax.set_ylabel("speedup over collocated")
    ax.set_title("Speedup over collocated (same stages)")
    return _save(fig, path)


def time_breakdown_chart(results: list[JobResult], path: Path) -> Path:
    """Stacked median time per phase of one training step, generation split into its busiest stage and the
    hand-off wait."""
    fig, ax = plt.subplots(figsize=(1.6 * len(results) + 3.5, 4))
    bottom = [0.0] * len(results)
    for key in BREAKDOWN:
        values = [r.medians.get(key, 0.0) for r in results]
        label = key.removeprefix("time/")
        ax.bar(range(len(results)), values, bottom=bottom, label=label, color=PHASE_COLOURS[phase_of(key)])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(range(len(results)), [_tick(r) for r in results])
    ax.set_ylabel("seconds per step")
    ax.set_title("Where a step's time goes")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], **OUTSIDE)  # top to bottom, as the segments are stacked
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
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(results))], [_tick(r) for r in results])
    ax.set_ylim(0, 1)
    ax.set_ylabel("busy fraction")
    ax.set_title("Device utilisation")
    ax.legend(**OUTSIDE)
    return _save(fig, path)


def timeline_chart(result: JobResult, path: Path) -> Path:
    """The run's last training step: one row per device, labelled with the components on it as the trace names
    it, and one bar per span of every worker on it, coloured by phase."""
    trace = json.loads((result.path / "timeline.json").read_text())["traceEvents"]
    rows = {e["pid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    steps = [e for e in trace if e["ph"] == "X" and e["name"] == "step"]
    last = max(steps, key=lambda e: e["ts"])
    t0, t1 = last["ts"], last["ts"] + last["dur"]
    spans = [e for e in trace if e["ph"] == "X" and e["name"] != "step" and t0 <= e["ts"] < t1 and e["pid"] in rows]
    order = sorted(rows)  # devices in order, then the host (its pid lies above every device's)
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(order) + 1.5))
    for y, pid in enumerate(order):
        for e in (e for e in spans if e["pid"] == pid):
            bar = ((e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, 0.05))
            ax.broken_barh([bar], (y - 0.35, 0.7), color=PHASE_COLOURS[phase_of(e["name"])])
    ax.set_yticks(range(len(order)), [rows[pid] for pid in order])
    ax.invert_yaxis()
    ax.set_xlabel("ms into the step")
    ax.set_title(f"Timeline of one step: {result.label}")
    phases = [p for p in PHASE_COLOURS if p in {phase_of(e["name"]) for e in spans}]
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLOURS[p]) for p in phases]
    ax.legend(handles, phases, **OUTSIDE)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
