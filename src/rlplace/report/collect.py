"""Read a multirun folder back: one `JobResult` per Hydra job, from the files each run leaves behind.

Everything comes from the run folders (run.json, metrics.jsonl, timeline.json, skipped.txt), not from wandb, so a
report can be made offline, later, or on another machine.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlplace.core.errors import ConfigError
from rlplace.metrics.logger import WARMUP_STEPS
from rlplace.placement import PlacementError
from rlplace.planner import PROFILE_FILE

STAGES = ("time/env", "time/rollout", "time/reward", "time/inference")
"""Busy seconds of each generation stage in a step: embodied runs log env and rollout, reasoning runs rollout,
reward and inference. Generation can be no shorter than the busiest of them."""

BUSIEST_STAGE = "time/busiest_stage"
HANDOFF_WAIT = "time/handoff_wait"
"""`time/generate_rollouts` split in two by `split_generation`, per step, before the medians are taken."""

BREAKDOWN = (
    "time/sync_weights",
    BUSIEST_STAGE,
    HANDOFF_WAIT,
    "time/advantages",
    "time/training",
    "time/offload",
    "time/onload",
)
"""The segments of a step, bottom to top, in the time breakdown chart."""

RATES = {"throughput/env_steps_per_s": "env steps", "throughput/tokens_per_s": "tokens"}
"""Each family's throughput metric and what it counts."""


class ReportError(ValueError):
    """A folder the report cannot be made from, in one line naming the folder or file and what is wrong with it."""


def split_generation(row: Mapping[str, float]) -> dict[str, float]:
    """A step's generation time as the busiest stage's busy time plus the rest, the *hand-off wait* (floored at 0).

    The wait is the queue hand-offs between stages plus any stage time that did not overlap the busiest one: what
    perfect overlap would save (`JobResult.ideal_throughput`), which is why the time breakdown shows it on its own.
    A run that logs no stage times shows no wait.
    """
    generation = row["time/generate_rollouts"]
    busiest = min(generation, max((row[key] for key in STAGES if key in row), default=generation))
    return {BUSIEST_STAGE: busiest, HANDOFF_WAIT: generation - busiest}


@dataclass
class JobResult:
    job: str
    path: Path
    label: str
    """What the job varied, e.g. `placement=hybrid rollout.pipeline_stage_num=2`."""
    mode: str = ""
    stages: int = 0
    staleness: int = 0
    """runner.max_staleness: 0 synchronous, K generation K steps ahead of training."""
    devices: int = 0
    """The run's device budget (run.json), which the per-device numbers divide by."""
    skipped: str | None = None
    """Why the job did not run (a combination the cluster cannot hold)."""
    rate: str = ""
    """The throughput metric (a key of `RATES`)."""
    warmup: int = 0
    """Steps left out as warm-up: `WARMUP_STEPS`, or 0 for a run too short to leave any out."""
    note: str | None = None
    """Why the job's numbers say less than the others' (too short to leave warm-up out, or nothing measured)."""
    throughput: list[float] = field(default_factory=list)
    """Throughput of each measured step (after warm-up)."""
    medians: dict[str, float] = field(default_factory=dict)
    """Median over the measured steps of every time/*, util/* and throughput/* metric, and of `split_generation`."""
    predicted_step: float | None = None
    """The planner's step time for this job (`predicted_step`), if the sweep had a profile."""
    predicted_from: str | None = None
    """The run folder of that profile."""
    replaced: list[dict[str, Any]] = field(default_factory=list)
    """The run's re-placements (run.json's `replaced`: step, where to, seconds), in order."""
    run_s: float = math.nan
    """Seconds from the first step's start to the last step's end: every step and every switch. An adaptive run
    (re-placed while it ran) compares with a fixed one on this, its medians mixing its placements."""

    @property
    def prediction_error(self) -> float:
        """|predicted - measured| / measured step time; nan without a prediction."""
        if self.predicted_step is None or "time/step" not in self.medians:
            return math.nan
        return abs(self.predicted_step - self.medians["time/step"]) / self.medians["time/step"]

    @property
    def title(self) -> str:
        """The job as a reader names it: "hybrid, 2 stages", "hybrid, 2 stages, K=1", "hybrid, 2 stages, re-placed
        after step 5" (an adaptive run: where it started)."""
        title = f"{self.mode}, {self.stages} stage{'s' if self.stages > 1 else ''}"
        title = f"{title}, K={self.staleness}" if self.staleness else title
        moves = ", ".join(str(r["step"]) for r in self.replaced)
        return f"{title}, re-placed after step {moves}" if moves else title

    @property
    def unit(self) -> str:
        return RATES.get(self.rate, "")

    @property
    def n(self) -> int:
        """Steps the medians and the spread are over."""
        return len(self.throughput)

    @property
    def median_throughput(self) -> float:
        return statistics.median(self.throughput) if self.throughput else math.nan

    @property
    def per_device(self) -> float:
        """Median throughput per device of the run's whole budget: idle devices count against the placement."""
        return self.median_throughput / self.devices if self.devices else math.nan

    @property
    def ideal_throughput(self) -> float:
        """Throughput if the generation stages overlapped perfectly: generation costing only the busiest stage."""
        step, wait = self.medians.get("time/step", math.nan), self.medians.get(HANDOFF_WAIT, 0.0)
        if not self.throughput or not step > wait:
            return math.nan
        return self.median_throughput * step / (step - wait)


def swept_keys(multirun_dir: Path) -> set[str]:
    """The keys the sweep varies (hydra.sweeper.params), so that labels show only what differs between jobs."""
    multirun = multirun_dir / "multirun.yaml"
    if not multirun.exists():
        return set()
    try:
        config = yaml.safe_load(multirun.read_text())
        params = ((config.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    except (yaml.YAMLError, AttributeError) as err:
        raise ReportError(f"{multirun} is not a multirun's config ({one_line_yaml(err)})") from None
    return set(params)


def one_line_yaml(err: Exception) -> str:
    """A YAML error's first line (its full text spans several, with a pointer into the file)."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _job_label(path: Path, keys: set[str]) -> str:
    overrides_file = path / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    return " ".join(o for o in overrides if not keys or o.split("=", 1)[0] in keys) or path.name


def _run_info(path: Path) -> dict[str, Any]:
    """The job's run.json, checked for what the report reads from it."""
    file = path / "run.json"
    if not file.is_file():
        raise ReportError(f"job {path.name}: {file} is missing: the job stopped before its run started")
    try:
        info = json.loads(file.read_text())
        if not isinstance(info, dict) or not isinstance(info["mode"], str) or int(info["num_devices"]) < 1:
            raise ValueError("not an object with a mode and a device count")
    except (ValueError, KeyError, TypeError) as err:
        raise ReportError(f"job {path.name}: {file} is not a run's run.json ({err})") from None
    return info


def _rows(path: Path) -> list[dict[str, Any]]:
    """The job's metrics.jsonl: one object per step, at least one."""
    file = path / "metrics.jsonl"
    if not file.is_file():
        raise ReportError(f"job {path.name}: {file} is missing: the job logged no step")
    rows = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise ReportError(f"job {path.name}: {file} line {number} is not JSON ({err})") from None
        if not isinstance(row, dict):
            raise ReportError(f"job {path.name}: {file} line {number} is not a step's metrics (a JSON object)")
        rows.append(row)
    if not rows:
        raise ReportError(f"job {path.name}: {file} is empty: the job logged no step")
    return rows


def read_job(path: Path, keys: set[str] = frozenset(), profile: Path | None = None) -> JobResult:
    """One job of a sweep. Raises ReportError for a folder that is no finished run's."""
    result = JobResult(job=path.name, path=path, label=_job_label(path, keys))
    if (path / "skipped.txt").exists():
        result.skipped = (path / "skipped.txt").read_text().strip()
        return result
    info = _run_info(path)
    result.mode, result.stages, result.devices = info["mode"], info.get("stages", 1), int(info["num_devices"])
    result.staleness = info.get("staleness", 0)
    result.replaced = list(info.get("replaced", []))
    rows = _rows(path)
    result.run_s = sum(row.get("time/step", 0.0) for row in rows) + sum(r["seconds"] for r in result.replaced)
    # The last K steps of an asynchronous run (runner.max_staleness = K) generate nothing: no throughput to count.
    generating = [i for i, row in enumerate(rows) if "time/generate_rollouts" in row]
    result.warmup = WARMUP_STEPS if any(i >= WARMUP_STEPS for i in generating) else 0
    kept = [rows[i] | split_generation(rows[i]) for i in generating if i >= result.warmup]
    if not kept:
        result.note = f"{len(rows)} step{'s' if len(rows) > 1 else ''}, none of which generated: nothing to measure"
        return result
    if not result.warmup:
        result.note = (
            f"{len(rows)} step{'s' if len(rows) > 1 else ''}, none generating after the {WARMUP_STEPS} warm-up steps: "
            f"measured over the {len(kept)} that generated, start-up included; run more steps for a fair number"
        )
    result.rate = next((key for key in RATES if key in kept[0]), "")
    if not result.rate:
        raise ReportError(f"job {path.name}: {path / 'metrics.jsonl'} logs no throughput ({' or '.join(RATES)})")
    result.throughput = [row[result.rate] for row in kept]
    keys = {k for row in kept for k in row if k.startswith(("time/", "util/", "throughput/"))}
    result.medians = {k: statistics.median(row.get(k, 0.0) for row in kept) for k in sorted(keys)}
    result.predicted_step, result.predicted_from = predicted_step(path, profile)
    return result


def profile_source(jobs: list[Path]) -> Path | None:
    """Of a sweep's jobs that profiled themselves (`runner.profile=true`), the one to predict every job from: the
    least contended (disaggregated, synchronous, 1 stage first, as `benchmarks/planner_accuracy.py` validates)."""

    def contention(job: Path) -> tuple[bool, bool, int, int]:
        info = _run_info(job)
        return info["mode"] != "disaggregated", info.get("staleness", 0) != 0, info.get("stages", 1), int(job.name)

    profiled = [job for job in jobs if (job / PROFILE_FILE).exists() and (job / "run.json").exists()]
    return min(profiled, key=contention, default=None)


def predicted_step(path: Path, profile: Path | None = None) -> tuple[float | None, str | None]:
    """The planner's step time for the job in `path`: from the profile its overrides name (`plan.profile`), else
    from `profile` (a job of the same sweep); the job's config composed again from its overrides, as `rlplace-plan`
    would, and predicted by its family's model; and the profile it came from. None without a profile, or for a
    profile that cannot serve the job (another task's)."""
    overrides_file = path / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    named = next((o.split("=", 1)[1] for o in overrides if o.startswith("plan.profile=")), None)
    source = named or profile
    if source is None:
        return None, None
    from rlplace.cli import compose_run  # the models and the config tree only load for a sweep that asks
    from rlplace.families import resolve

    kept = [o for o in overrides if not o.startswith("plan.profile=")]
    try:
        plan = resolve(compose_run([*kept, f"plan.profile={source}"]))
    except (ConfigError, PlacementError):
        return None, None
    return plan.prediction.step_s, str(source)


def collect(multirun_dir: Path) -> list[JobResult]:
    """Every job folder (named by job number) of a multirun, in job order; predicted from a profile where one was
    named (`plan.profile`) or a job profiled itself (`profile_source`)."""
    if not multirun_dir.is_dir():
        raise ReportError(f"{multirun_dir} is not a folder")
    jobs = sorted((p for p in multirun_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not jobs:
        what = "a run's folder, not a sweep's" if (multirun_dir / "run.json").exists() else "not a sweep's folder"
        raise ReportError(
            f"{multirun_dir} holds no job folders (0, 1, ...): {what}; rlplace-report reads the folder of a multirun "
            "(outputs/multiruns/<date>/<time>)"
        )
    keys = swept_keys(multirun_dir)
    profile = profile_source(jobs)
    return [read_job(job, keys, profile) for job in jobs]


def baseline_for(result: JobResult, results: list[JobResult]) -> JobResult | None:
    """The synchronous collocated run to compare against: same stages if there is one, else any synchronous
    collocated run, else any collocated run."""
    collocated = [r for r in results if r.mode == "collocated" and not r.skipped and r.n]
    synchronous = [r for r in collocated if r.staleness == 0]
    same = [r for r in synchronous if r.stages == result.stages]
    return (same or synchronous or collocated or [None])[0]


def speedup(result: JobResult, results: list[JobResult]) -> float:
    """Median throughput over `baseline_for`'s; nan without a collocated run that measured a throughput."""
    base = baseline_for(result, results)
    if base is None or not base.median_throughput or not result.n:
        return math.nan
    return result.median_throughput / base.median_throughput
