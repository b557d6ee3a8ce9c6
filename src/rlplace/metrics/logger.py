"""Metric logger backends and the summary used by wandb and sweep reports.

Every run folder gets `metrics.jsonl` whatever the backend: the sweep report reads it, and it survives without an
account or network. `wandb` is added on top when chosen; offline mode writes a local run folder that
`wandb sync` can upload later. The driver owns one logger, calls `log(metrics, step)` once per step, optionally
`log_summary(summarize(history, warmup))` at the end, and `close()`.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

WANDB_MODES = ("offline", "online", "disabled")
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
WANDB_ID_FILE = "wandb_id.txt"
SUMMARY_PREFIXES = ("throughput/", "time/", "plan/", "memory/")
"""What `summarize` takes medians of: speeds, phase times, the planner's prediction and its error, device memory."""
THROUGHPUT = "throughput/"
GENERATED = "time/generate_rollouts"
"""Logged by a step that generated rollouts (the sweep report keys on it too)."""
WARMUP_STEPS = 2
"""Steps left out of a run's summary medians (and the sweep report's): the first steps pay for process start-up
and lazy set-up."""

WandbMode = Literal["offline", "online", "disabled"]


@runtime_checkable
class MetricLogger(Protocol):
    """What the driver needs from a logger."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_summary(self, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def _as_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Coerce numbers (python, numpy, 0-d torch tensors) to float, naming the key that is not a number."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}: {value!r}") from e
    return out


class NullLogger:
    """Discards everything: for non-driver ranks, benchmarks and tests that want no files."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_summary(self, values: Mapping[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlLogger:
    """One JSON object per line, `{"step": step, **metrics}`, flushed per line so a crash loses at most one step.

    A run that starts at `start_step` (a resumed one) first drops the rows of that step and later, which an
    interrupted earlier attempt wrote after its checkpoint, so every step is in the file exactly once.
    `log_summary` writes `summary.json` next to it.
    """

    def __init__(self, path: str | os.PathLike[str], start_step: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            kept = [row for row in read_jsonl(self.path) if row["step"] < start_step]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
            os.replace(tmp, self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": int(step), **_as_floats(metrics)}) + "\n")
        self._file.flush()

    def log_summary(self, values: Mapping[str, float]) -> None:
        summary_path = self.path.with_name(SUMMARY_FILE)
        summary_path.write_text(json.dumps(_as_floats(values), indent=2, sort_keys=True) + "\n", encoding="utf-8")

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class WandbLogger:
    """A Weights & Biases run holding the full resolved config.

    `WANDB_MODE` in the environment overrides `mode`, so CI or a laptop can force offline without touching the
    config. Offline mode never touches the network; the run folder lands in `<dir>/wandb/offline-run-*`.
    The run's console while the wandb run is open (log lines, the progress bar, and what Ray forwards from the
    workers) goes into its `files/output.log`: console capture "wrap" patches the `write` of sys.stdout and
    sys.stderr, which Hydra's log handler and Ray's log forwarding also write through. "redirect" would instead hand
    the process a pseudo-terminal, and rich would then draw its live bar into pipes and log files. `silent` keeps
    wandb's banner out of the training log.
    """

    def __init__(
        self,
        project: str,
        name: str | None = None,
        group: str | None = None,
        tags: Sequence[str] = (),
        config: Mapping[str, Any] | None = None,
        mode: WandbMode = "offline",
        dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
    ) -> None:
        if mode not in WANDB_MODES:
            raise ValueError(f"wandb mode {mode!r} is not one of {list(WANDB_MODES)}")
        import wandb  # deferred: importing wandb is slow, and jsonl-only runs never need it

        if dir is not None:
            Path(dir).mkdir(parents=True, exist_ok=True)
        self.mode = os.environ.get("WANDB_MODE") or mode
        self.run = wandb.init(
            project=project,
            name=name,
            group=group,
            tags=list(tags) or None,
            config=dict(config or {}),
            mode=self.mode,
            dir=None if dir is None else str(dir),
            id=run_id,
            resume="allow" if run_id else None,  # a resumed run continues its wandb run
            reinit="finish_previous",  # a crashed earlier job in the same process (Hydra multirun) is closed
            settings=wandb.Settings(silent=True, console="wrap"),
        )
        self._closed = False
        self._summary: dict[str, float] = {}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        # Committed now: a row logged with an explicit step is otherwise held open for more values of that step and
        # written only at finish, after `log_summary`, so the last step's values (nothing generated by the last
        # step of an asynchronous run: a throughput of 0) would replace the summary's medians.
        self.run.log(_as_floats(metrics), step=int(step), commit=True)

    def log_summary(self, values: Mapping[str, float]) -> None:
        """Set the run's summary to `values` (the medians that summary.json holds) for these keys: wandb would
        otherwise show each metric's last logged value."""
        self._summary.update(_as_floats(values))
        self.run.summary.update(self._summary)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._summary:  # again, last: whatever wandb still writes at finish must not end up in the summary
                self.run.summary.update(self._summary)
            self.run.finish()


class MultiLogger:
    """Fans every call out to several loggers (e.g. `metrics.jsonl` plus wandb)."""

    def __init__(self, loggers: Iterable[MetricLogger]) -> None:
        self.loggers = list(loggers)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def log_summary(self, values: Mapping[str, float]) -> None:
        for logger in self.loggers:
            logger.log_summary(values)

    def close(self) -> None:
        errors: list[BaseException] = []
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as e:  # close the rest before reporting
                errors.append(e)
        if errors:
            raise errors[0]


@dataclass(frozen=True)
class TrackerRun:
    """What a tracker is told about the run it follows: how it is named, grouped and tagged, and its config."""

    config: Mapping[str, Any]
    project: str = "rlplace"
    name: str | None = None
    group: str | None = None
    tags: Sequence[str] = ()
    mode: WandbMode = "offline"


Tracker = Callable[[Path, TrackerRun], MetricLogger]
"""A tracker's factory: the run folder and the run -> the logger that feeds it (beside metrics.jsonl)."""


def wandb_unavailable(mode: WandbMode) -> str | None:
    """Why a wandb run in `mode` (or `WANDB_MODE`, which overrides it) could not start here (None: it can), found
    without the network: online with no API key (`WANDB_API_KEY`, or the entry `wandb login` writes). A run starts
    its workers before its logger, so the driver asks this first."""
    if (os.environ.get("WANDB_MODE") or mode) != "online":
        return None
    import wandb

    wandb.setup(wandb.Settings(silent=True))  # no "API key is configured" banner
    try:
        if wandb.login(verify=False, prompt=False):
            return None
    except wandb.errors.UsageError:
        pass
    return "no wandb API key is configured (set WANDB_API_KEY or run `wandb login`)"


def _wandb(run_dir: Path, run: TrackerRun) -> MetricLogger:
    return WandbLogger(
        project=run.project,
        name=run.name,
        group=run.group,
        tags=run.tags,
        config=run.config,
        mode=run.mode,
        dir=run_dir,
        run_id=_wandb_run_id(run_dir),
    )


BACKENDS: dict[str, Tracker | None] = {"wandb": _wandb, "jsonl": None, "none": None}
"""`logger.backend` -> the tracker fed beside metrics.jsonl (None: metrics.jsonl alone). A new tracker is one entry
here: the config's valid names are read from this table. The registry is a plain table because the metrics layer
lies below `core` and its `Registry`."""


def build_logger(backend: str, run_dir: str | os.PathLike[str], run: TrackerRun, start_step: int = 0) -> MetricLogger:
    """The run's logger: always `run_dir/metrics.jsonl`, plus the tracker `backend` names (files under `run_dir`).

    "none" means no external tracker; the jsonl file is still written because reports read it. `start_step` is the
    first step this run logs (a resumed run's checkpoint step): the jsonl history is cut back to it.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown logger backend {backend!r}; valid backends: {list(BACKENDS)}")
    run_dir = Path(run_dir)
    jsonl = JsonlLogger(run_dir / METRICS_FILE, start_step)
    tracker = BACKENDS[backend]
    if tracker is None:
        return jsonl
    try:
        return MultiLogger([jsonl, tracker(run_dir, run)])
    except BaseException:
        jsonl.close()
        raise


def _wandb_run_id(run_dir: Path) -> str:
    """The wandb run id of a run folder, kept in it, so that every start in the folder (a resume) is one wandb run."""
    path = run_dir / WANDB_ID_FILE
    if not path.exists():
        path.write_text(uuid.uuid4().hex[:12])
    return path.read_text().strip()


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The history written by `JsonlLogger`, one dict per step (blank lines skipped)."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(
    history: Sequence[Mapping[str, Any]],
    warmup: int = WARMUP_STEPS,
    prefixes: Sequence[str] = SUMMARY_PREFIXES,
) -> dict[str, float]:
    """Median of each metric starting with one of `prefixes` over the records after the first `warmup`.

    Medians, not means: one slow step (a compile, a checkpoint) should not move a placement's number. Steps
    where a metric is missing or not finite are skipped for that metric, and throughputs are taken over the steps
    that generated (`GENERATED` logged): the last K steps of an asynchronous run only train, and their throughput of
    0 is not the run's. If no record is left after warm-up the summary is empty rather than silently including
    warm-up steps.
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    values: dict[str, list[float]] = {}
    for record in history[warmup:]:
        for key, value in record.items():
            if key.startswith(THROUGHPUT) and GENERATED not in record:
                continue
            if key.startswith(tuple(prefixes)) and isinstance(value, int | float) and math.isfinite(value):
                values.setdefault(key, []).append(float(value))
    return {key: statistics.median(vals) for key, vals in sorted(values.items())}
