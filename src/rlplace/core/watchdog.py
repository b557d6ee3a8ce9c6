"""The hang deadline of worker calls, grown from the measured step time so that a slow run is never taken for hung.

A call waited on without a timeout fails with `WorkerTimeout` (group, rank, method) once it has run longer than its
group's `call_timeout_s` (see `rlplace.scheduler.future`). The deadline starts at `runner.hang_timeout_s`, generous for
start-up and the first step; after each step it becomes the larger of that and `STEP_FACTOR` times the slowest step
so far, so a model whose steps take longer than the configured deadline keeps running while a stopped worker is still
reported within a few step times.
"""

from __future__ import annotations

from collections.abc import Iterable

from rlplace.scheduler import WorkerGroup

STEP_FACTOR = 5.0
"""A phase call may take this many times the slowest whole step seen before it counts as hung."""


class HangDeadline:
    """Keeps the groups' call deadline at max(hang_timeout_s, STEP_FACTOR x slowest step)."""

    def __init__(self, groups: Iterable[WorkerGroup], hang_timeout_s: float) -> None:
        self.groups = list(groups)
        self.floor_s = hang_timeout_s
        self.slowest_step_s = 0.0

    def observe(self, step_seconds: float) -> float:
        """Account for one step's duration; returns the deadline now in force."""
        self.slowest_step_s = max(self.slowest_step_s, step_seconds)
        deadline = max(self.floor_s, STEP_FACTOR * self.slowest_step_s)
        for group in self.groups:
            group.call_timeout_s = deadline
        return deadline
