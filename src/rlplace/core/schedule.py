"""The shape of a training step, as data: which groups switch before each phase, and which steps' rollouts each
step generates under a staleness bound.

Pure Python (no Ray, no torch): the runner applies these decisions and the planner predicts their cost, so both read
the same plan.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlplace.placement import ComponentPlacement

log = logging.getLogger(__name__)

Phases = Sequence[tuple[str, frozenset[str]]]
"""A step's phases in order, each with the components that hold device memory in it."""


@dataclass(frozen=True)
class Switch:
    """What to do before one phase: groups to offload first, then groups to onload."""

    offload: tuple[str, ...] = ()
    onload: tuple[str, ...] = ()


def switch_plan(
    phases: Phases,
    devices: Mapping[str, frozenset[int]],
    offloadable: Mapping[str, bool],
) -> dict[str, Switch]:
    """The switch before each phase of the repeating step, in steady state.

    Before a phase, an offloadable component that is idle in it and shares a device with one that works in it is
    offloaded, and an offloaded component that works in it is onloaded. The plan is read off the second pass over
    the phases (the first starts with everything on its devices); applied from the first step, its extra onloads
    move nothing.
    """
    offloaded: set[str] = set()
    plan: dict[str, Switch] = {}
    for _ in range(2):
        for name, working in phases:
            busy = frozenset().union(*(devices[c] for c in working))
            offload = tuple(
                c
                for c in devices
                if offloadable.get(c) and c not in working and c not in offloaded and devices[c] & busy
            )
            onload = tuple(c for c in devices if c in working and c in offloaded)  # in a fixed order, as offload
            offloaded.update(offload)
            offloaded.difference_update(onload)
            plan[name] = Switch(offload, onload)
    return plan


def offloaded_during(
    phases: Phases,
    devices: Mapping[str, frozenset[int]],
    offloadable: Mapping[str, bool],
) -> dict[str, frozenset[str]]:
    """The components off their devices during each phase (after its switch), in steady state: what the memory
    model leaves out of a phase's sum."""
    plan = switch_plan(phases, devices, offloadable)
    offloaded: set[str] = set()
    during: dict[str, frozenset[str]] = {}
    for _ in range(2):
        for name, _ in phases:
            offloaded.update(plan[name].offload)
            offloaded.difference_update(plan[name].onload)
            during[name] = frozenset(offloaded)
    return during


@dataclass(frozen=True)
class AsyncSchedule:
    """Which rollouts each training step generates with K = runner.max_staleness, so that the batch of step t always
    comes from weights max(0, t - K), whatever the timing.

    K = 0 is synchronous: step t generates its own batch, then trains on it. K > 0: step 0 first generates the
    batches of steps 0..K-1 with the initial weights; then every step t gets v(t) to the generators and generates
    step t + K with it while (or, sharing devices, before) the actor trains on step t's batch, queued K steps earlier.
    The last K steps generate nothing.
    """

    max_staleness: int
    max_steps: int
    overlap: bool
    """Whether generation runs beside training: the trainer's devices are its own."""

    @classmethod
    def of(cls, placement: ComponentPlacement, max_staleness: int, max_steps: int, trainer: str) -> AsyncSchedule:
        """The schedule of a run whose `trainer` group trains while every other component generates; logs once when
        K > 0 cannot overlap here."""
        others = {d for name in placement.components if name != trainer for d in placement.devices_of(name)}
        overlap = not set(placement.devices_of(trainer)) & others
        if max_staleness and not overlap:
            log.info(
                f"rlplace: runner.max_staleness={max_staleness}: the {trainer} shares devices with the components "
                f"that generate, so generation and training take turns (give the {trainer} devices of its own to "
                "overlap)"
            )
        return cls(max_staleness, max_steps, overlap)

    def before_training(self, step: int) -> list[int]:
        """The steps whose rollouts are generated before the actor trains on `step`: that step when synchronous, the
        first K steps at step 0 of a run with K > 0 (all with the initial weights), else none."""
        if self.max_staleness == 0:
            return [step]
        return list(range(min(self.max_staleness, self.max_steps))) if step == 0 else []

    def ahead(self, step: int) -> int | None:
        """The step whose rollouts are generated with the weights of `step` beside (or before) its training: step + K,
        None when synchronous or past the last step."""
        ahead = step + self.max_staleness
        return ahead if self.max_staleness and ahead < self.max_steps else None
