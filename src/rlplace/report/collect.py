"""Read a multirun folder back: one `JobResult` per Hydra job, from the files each run leaves behind.

Everything comes from the run folders (run.json, metrics.jsonl, timeline.json, skipped.txt), not from wandb, so a
report can be made offline, later, or on another machine.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlplace.metrics.logger import WARMUP_STEPS

PHASES = (
    "time/sync_weights",
    "time/generate_rollouts",
    "time/advantages",
    "time/training",
    "time/offload",
    "time/onload",
)


@dataclass
class JobResult:
    job: str
    path: Path
    label: str
    """What the job varied, e.g. `placement=hybrid rollout.pipeline_stage_num=2`."""
    mode: str = ""
    stages: int = 0
    skipped: str | None = None
    """Why the job did not run (a combination the cluster cannot hold)."""
    throughput: list[float] = field(default_factory=list)
    """env steps/s of each step after warm-up."""
    medians: dict[str, float] = field(default_factory=dict)
    """Median over steps after warm-up of every time/*, util/* and throughput/* metric."""

    @property
    def median_throughput(self) -> float:
        return statistics.median(self.throughput) if self.throughput else float("nan")

    @property
    def ideal_throughput(self) -> float:
        """env steps/s if env and rollout overlapped perfectly: generation costs only the slower of the two."""
        m = self.medians
        if not m or not self.throughput:
            return float("nan")
        env_steps = m["throughput/env_steps_per_s"] * m["time/step"]
        other = m["time/step"] - m["time/generate_rollouts"]
        return env_steps / (max(m["time/env"], m["time/rollout"]) + other)


def swept_keys(multirun_dir: Path) -> set[str]:
    """The keys the sweep varies (hydra.sweeper.params), so that labels show only what differs between jobs."""
    multirun = multirun_dir / "multirun.yaml"
    if not multirun.exists():
        return set()
    params = (yaml.safe_load(multirun.read_text()).get("hydra", {}).get("sweeper", {}) or {}).get("params") or {}
    return set(params)


def _job_label(path: Path, keys: set[str]) -> str:
    overrides_file = path / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    return " ".join(o for o in overrides if not keys or o.split("=", 1)[0] in keys) or path.name


def read_job(path: Path, keys: set[str] = frozenset()) -> JobResult:
    result = JobResult(job=path.name, path=path, label=_job_label(path, keys))
    if (path / "skipped.txt").exists():
        result.skipped = (path / "skipped.txt").read_text().strip()
        return result
    info = json.loads((path / "run.json").read_text())
    result.mode, result.stages = info["mode"], info.get("stages", 1)
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    kept = rows[WARMUP_STEPS:] or rows
    result.throughput = [row["throughput/env_steps_per_s"] for row in kept]
    keys = {k for row in kept for k in row if k.startswith(("time/", "util/", "throughput/"))}
    result.medians = {k: statistics.median(row.get(k, 0.0) for row in kept) for k in sorted(keys)}
    return result


def collect(multirun_dir: Path) -> list[JobResult]:
    """Every job folder (named by job number) of a multirun, in job order."""
    jobs = sorted((p for p in multirun_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not jobs:
        raise FileNotFoundError(f"{multirun_dir} holds no job folders (0, 1, ...): is it a multirun folder?")
    keys = swept_keys(multirun_dir)
    return [read_job(job, keys) for job in jobs]


def baseline_for(result: JobResult, results: list[JobResult]) -> JobResult | None:
    """The collocated run to compare against: same stages if there is one, else any collocated run."""
    collocated = [r for r in results if r.mode == "collocated" and not r.skipped]
    same = [r for r in collocated if r.stages == result.stages]
    return (same or collocated or [None])[0]
