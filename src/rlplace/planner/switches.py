"""What a step's phase switches cost, per group and direction, from the profiled run's offload and onload spans.

Before a phase the driver offloads some groups at once and waits for them, then onloads others (`core.schedule`,
`core.runner.PhaseSwitcher`): a call waits for its slowest group. What a group takes depends on what it moves (a
trained actor's weights and optimizer state against a frozen copy's weights, a simulator's nothing), so each group's
offload and onload cost what its slowest rank's took in the profiled run; the driver's part of a call (starting and
collecting the groups' methods) is what the profiled calls took beyond their slowest groups. A placement that keeps
a group resident saves what that group's moves cost, not an average call's.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from rlplace.planner.spans import Trace

DIRECTIONS = ("offload", "onload")

Call = tuple[str, tuple[str, ...]]
"""One switch call: its direction and the groups it moves together."""


class Switch(Protocol):
    """What to do before one phase (`core.schedule.Switch`, which the planner does not import: a layer of its own)."""

    offload: tuple[str, ...]
    onload: tuple[str, ...]


def calls(plan: Mapping[str, Switch]) -> list[Call]:
    """The switch calls of a step's plan, each phase's offloads first."""
    return [
        (direction, names)
        for switch in plan.values()
        for direction in DIRECTIONS
        if (names := getattr(switch, direction))
    ]


@dataclass(frozen=True)
class SwitchCosts:
    """A profiled run's switch costs, to predict another plan's."""

    spans: Mapping[tuple[str, str], float]
    """(group, direction) -> seconds its slowest rank's offload or onload took, median over the measured steps."""
    per_call_s: float | None
    """The driver's part of one call beyond its slowest group; None when the profiled run switched nothing."""

    @classmethod
    def of(cls, trace: Trace, plan: Mapping[str, Switch], measured_s: float) -> SwitchCosts:
        """From the profiled run's `trace`, its own switch `plan`, and `measured_s`, the seconds per step its driver
        spent in offload and onload calls (so that its own plan is predicted at exactly that)."""
        own = calls(plan)
        spans = {}
        for direction, names in own:
            for group in names:
                seconds = trace.rank_seconds(group, direction)
                if seconds:
                    spans[group, direction] = max(seconds.values())
        if not own:
            return cls(spans, None)
        alone = sum(max(spans.get((group, direction), 0.0) for group in names) for direction, names in own)
        return cls(spans, max(0.0, measured_s - alone) / len(own))

    def seconds(self, plan: Mapping[str, Switch], default_s: float, assumptions: list[str]) -> float:
        """Predicted seconds per step of `plan`'s switch calls; `default_s` a group call where the profiled run made
        none to measure (an assumption, appended, as is a group whose moves the profile did not time)."""
        found = calls(plan)
        if self.per_call_s is None:
            if found:
                assumptions.append(f"phase switches {default_s * 1e3:.0f} ms a group (the profile had none)")
            return default_s * sum(len(names) for _, names in found)
        return sum(self.per_call_s + max(self._span(g, d, assumptions) for g in names) for d, names in found)

    def _span(self, group: str, direction: str, assumptions: list[str]) -> float:
        if (group, direction) in self.spans:
            return self.spans[group, direction]
        timed = [seconds for (_, d), seconds in self.spans.items() if d == direction]
        note = f"the {group}'s {direction} costs what the profiled groups' did on average (the profile had none)"
        if note not in assumptions:
            assumptions.append(note)
        return statistics.mean(timed) if timed else 0.0
