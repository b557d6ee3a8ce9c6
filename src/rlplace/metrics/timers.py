"""Driver-side phase timing.

The runner's loop reads as a list of phases (`sync_weights`, `generate_rollouts`, `advantages`, `training`, ...);
wrapping each in `with timer.phase(name):` yields the `time/<name>` metrics for the step and, as spans, puts the
driver's phases on the same timeline as the workers' spans, so a trace shows which phase each device was busy in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .timeline import Span


class PhaseTimer:
    """Wall time per named phase for the current step, plus (name, start, end) spans for the timeline.

    `clock` returns unix seconds (the default `time.time`) so driver spans line up with spans recorded by workers
    in other processes and on other nodes. A phase entered twice in one step accumulates.
    """

    def __init__(self, group: str = "driver", rank: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.group = group
        self.rank = rank
        self._clock = clock
        self._seconds: dict[str, float] = {}
        self._spans: list[Span] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the body as phase `name`; recorded even if the body raises, so a failing step still shows up."""
        start = self._clock()
        try:
            yield
        finally:
            self.add(name, start, self._clock())

    def add(self, name: str, start: float, end: float) -> None:
        """Record phase `name` as having run from `start` to `end` (clock times): for phases that run side by side,
        which no single `with` block can time."""
        self.record(name, end - start)
        self._spans.append(Span(name=name, group=self.group, rank=self.rank, start=start, end=end))

    def now(self) -> float:
        return self._clock()

    def record(self, name: str, seconds: float) -> None:
        """Add time measured elsewhere (e.g. a worker-reported `env` time) to `time/<name>` for this step."""
        key = f"time/{name}"
        self._seconds[key] = self._seconds.get(key, 0.0) + float(seconds)

    def step_metrics(self) -> dict[str, float]:
        """The step's `time/<name>` seconds; clears them for the next step."""
        metrics, self._seconds = self._seconds, {}
        return metrics

    def drain_spans(self) -> list[Span]:
        """Spans recorded since the last call, for `Timeline.extend`; clears them."""
        spans, self._spans = self._spans, []
        return spans


def process_uptime_s() -> float:
    """Seconds since this process started, as the OS counts them (Linux `/proc`), so that the interpreter's start and
    the imports before any of our code runs count too."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, counted from field 3
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
