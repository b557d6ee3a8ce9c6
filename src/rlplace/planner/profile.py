"""A run's profile: the unit costs its workers measured (`runner.profile=true` writes `profile.json`) and the phase
times the run itself recorded (metrics.jsonl, timeline.json), which calibrate what the unit costs leave out.
"""

from __future__ import annotations

import bisect
import functools
import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rlplace.metrics.logger import METRICS_FILE, WARMUP_STEPS

from .curve import Curve
from .spans import Trace

PROFILE_FILE = "profile.json"
TIMELINE_FILE = "timeline.json"
GENERATION_SPANS = ("env_step", "rollout_infer")
T = TypeVar("T")


class ProfileError(ValueError):
    """A profile that cannot be used for this plan; the message names `plan.profile` and what is wrong."""


@dataclass(frozen=True)
class Profile:
    folder: Path
    data: dict[str, Any]
    """profile.json as the run wrote it: family, task, devices and their cores, config, unit-cost curves."""
    phases: dict[str, float]
    """Median seconds per step of each `time/*` metric, over the steps after the warm-up."""
    metrics: dict[str, float]
    """Median of every numeric metric, over the same steps."""
    generation_overhead_s: float
    """Per step, the part of generation no worker span covers: starting and collecting the worker methods."""
    loop_s: dict[str, float]
    """Per step, rank 0 of each generating group's seconds inside its generation spans (the env's steps; the
    rollout's inferences and their bookkeeping): what its units cost inside the loop, median over measured steps."""

    def curve(self, name: str) -> Curve:
        return Curve.from_dict(self.data[name])

    @property
    def config(self) -> dict[str, Any]:
        return self.data["config"]

    def trace(self) -> Trace:
        """The run's timeline, read and parsed (once per call: a step model asks once and keeps what it derives)."""
        return _read(self.folder, TIMELINE_FILE, Trace)


def load_profile(folder: str | Path, family: str, task: str) -> Profile:
    """The profile in run folder `folder`, refused (ProfileError) unless it profiled a `family` run of `task`."""
    folder = Path(folder)
    path = folder / PROFILE_FILE
    if not path.is_file():
        raise ProfileError(
            f"plan.profile = {str(folder)!r}: no {PROFILE_FILE} there (valid: the folder of a run trained with "
            "runner.profile=true)"
        )
    data = _read(folder, PROFILE_FILE, json.loads)
    if not isinstance(data, dict):
        raise ProfileError(
            f"plan.profile = {str(folder)!r}: {PROFILE_FILE} holds {type(data).__name__}, not a profile{VALID}"
        )
    found = (data.get("family"), data.get("task", data.get("env_id")))  # an embodied profile names its env_id
    if found != (family, task):
        raise ProfileError(
            f"plan.profile = {str(folder)!r}: it profiled a run of {found[1]!r} ({found[0]} family), not this "
            f"{family} run of {task!r} (valid: a profile of the same task)"
        )
    for name in (METRICS_FILE, TIMELINE_FILE):
        if not (folder / name).is_file():
            raise ProfileError(f"plan.profile = {str(folder)!r}: {name} is missing (valid: a whole run folder)")
    metrics = _read(folder, METRICS_FILE, _medians)
    phases = {key.removeprefix("time/"): value for key, value in metrics.items() if key.startswith("time/")}
    overhead, loop = _read(folder, TIMELINE_FILE, _generation_timing)
    return Profile(folder, data, phases, metrics, overhead, loop)


VALID = " (valid: the folder of a run trained with runner.profile=true, as it wrote it)"
DAMAGED = (OSError, ValueError, LookupError, TypeError, AttributeError)
"""What reading a damaged or hand-made profile raises: bad JSON, a missing key, a value of the wrong kind."""


def describe(err: Exception) -> str:
    """What is wrong with a profile, from what reading it raised, in a few words on one line."""
    if isinstance(err, KeyError):
        return f"no {err.args[0]!r}"
    return " ".join(f"{type(err).__name__}: {err}".split())


def _read(folder: Path, name: str, parse: Callable[[str], T]) -> T:
    """`parse` of the text of `folder / name`, with what a damaged file raises turned into a ProfileError naming it."""
    try:
        return parse((folder / name).read_text())
    except DAMAGED as err:
        raise ProfileError(f"plan.profile = {str(folder)!r}: {name} cannot be used ({describe(err)}){VALID}") from err


def _medians(text: str) -> dict[str, float]:
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not rows:
        raise ValueError("the run logged no step")
    measured = [row for row in rows if row["step"] >= WARMUP_STEPS] or rows
    values: dict[str, list[float]] = defaultdict(list)
    for row in measured:
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float):
                values[key].append(float(value))
    return {key: statistics.median(found) for key, found in values.items()}


def _generation_timing(text: str) -> tuple[float, dict[str, float]]:
    """Medians over measured steps of (first worker span - phase start) + (phase end - last worker span), and of
    each group's rank-0 seconds in its spans within the phase (`Profile.loop_s`; spans without group and rank, as a
    hand-made trace may have, count toward the overhead only)."""
    events = [e for e in json.loads(text)["traceEvents"] if e.get("ph") == "X"]
    phases = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "generate_rollouts")
    # A process on several devices has its span on each device's row: once each here.
    found = {(e["ts"], e["ts"] + e["dur"], _rank0_group(e)) for e in events if e["name"] in GENERATION_SPANS}
    spans = sorted(found, key=lambda span: span[:2])
    starts = [start for start, _, _ in spans]
    gaps = []
    loop: dict[str, list[float]] = defaultdict(list)
    for start, end in phases[WARMUP_STEPS:] or phases:
        # The spans that start in the phase (sorted by start: a slice), of which those that also end in it.
        inside = [
            span
            for span in spans[bisect.bisect_left(starts, start) : bisect.bisect_right(starts, end)]
            if span[1] <= end
        ]
        if inside:
            gaps.append((inside[0][0] - start + end - max(e for _, e, _ in inside)) / 1e6)
        busy: dict[str, float] = defaultdict(float)
        for s, e, group in inside:
            if group is not None:
                busy[group] += (e - s) / 1e6
        for group, seconds in busy.items():
            loop[group].append(seconds)
    overhead = statistics.median(gaps) if gaps else 0.0
    return overhead, {group: statistics.median(found) for group, found in loop.items()}


def _rank0_group(event: dict[str, Any]) -> str | None:
    args = event.get("args", {})
    return args.get("group") if args.get("rank") == 0 else None


def load_model(build: Callable[[Profile], T], folder: str | Path, family: str, task: str) -> T:
    """A family's step model, `build` over the profile in `folder`; ProfileError if the profile cannot serve a
    `family` run of `task`, also when its files parse but lack what `build` reads (a profile is input, perhaps
    hand-made or cut short).

    Built once per process while profile.json stays as it is: resolving a run, its search and each of its re-plans
    (`runner.replan_interval`) ask for the same model."""
    try:
        stamp = (Path(folder) / PROFILE_FILE).stat().st_mtime_ns
    except OSError:
        stamp = None  # `load_profile` names what is missing
    return _load_model(build, str(folder), family, task, stamp)


@functools.lru_cache(maxsize=8)
def _load_model(build: Callable[[Profile], T], folder: str, family: str, task: str, stamp: int | None) -> T:
    profile = load_profile(folder, family, task)
    try:
        return build(profile)
    except ProfileError:
        raise
    except DAMAGED as err:
        raise ProfileError(f"plan.profile = {folder!r}: the profile is incomplete ({describe(err)}){VALID}") from err
