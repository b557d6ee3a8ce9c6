"""A console progress bar for the training loop.

On a terminal it is a live `rich` bar (steps done / total, elapsed, remaining, and a few live fields such as the
episode return and env steps/s). When stdout is not a terminal (CI, `nohup`, Ray job logs) a redrawn bar would
flood the log with control codes, so it prints one plain line every `every` steps instead, plus the last step.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

DEFAULT_FIELDS: dict[str, str] = {
    "env/episode_return": "return",
    "rollout/reward": "reward",
    "throughput/env_steps_per_s": "env steps/s",
    "throughput/tokens_per_s": "tokens/s",
}
"""Metric key -> short label shown next to the bar; keys missing from a step's metrics are not shown."""


def _format_fields(metrics: Mapping[str, float], fields: Mapping[str, str]) -> str:
    return " | ".join(f"{label} {metrics[key]:.4g}" for key, label in fields.items() if key in metrics)


class TrainingProgress:
    """Progress of `total_steps` training steps; use as a context manager and call `update(step, metrics)`.

    `step` is the number of steps done (1 after the first step). `stream` defaults to stdout; `force_terminal`
    overrides the TTY check (tests, or a terminal rich does not recognise).
    """

    def __init__(
        self,
        total_steps: int,
        *,
        fields: Mapping[str, str] | None = None,
        every: int = 10,
        stream: IO[str] | None = None,
        force_terminal: bool | None = None,
        description: str = "train",
    ) -> None:
        if total_steps < 0 or every < 1:
            raise ValueError(f"need total_steps >= 0 and every >= 1, got total_steps={total_steps}, every={every}")
        self.total_steps = total_steps
        self.fields = dict(DEFAULT_FIELDS if fields is None else fields)
        self.every = every
        self.description = description
        self._stream = stream if stream is not None else sys.stdout
        console = Console(file=self._stream, force_terminal=force_terminal)
        self.interactive = console.is_terminal
        self._start = time.monotonic()
        self._progress: Progress | None = None
        self._task: Any = None
        if self.interactive:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
            )
            self._task = self._progress.add_task(description, total=total_steps, info="")

    def __enter__(self) -> TrainingProgress:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._start = time.monotonic()
        if self._progress is not None:
            self._progress.start()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, step: int, metrics: Mapping[str, float] | None = None) -> None:
        info = _format_fields(metrics or {}, self.fields)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
            return
        if step % self.every == 0 or step == self.total_steps:
            elapsed = time.monotonic() - self._start
            parts = [f"{self.description} step {step}/{self.total_steps}", info, f"elapsed {elapsed:.1f}s"]
            print(" | ".join(p for p in parts if p), file=self._stream, flush=True)
