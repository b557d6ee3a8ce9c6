"""What both runners share: the phase switch plan, the asynchronous schedule, channels opened for a run, and the
per-step timeline.

A step is a fixed sequence of phases, each with the components that hold device memory in it. When components
share devices, the idle ones make room: `switch_plan` decides once, from the placement and each component's
`enable_offload`, which groups to offload and onload before each phase, so the runner's phase methods do only their
phase. `AsyncSchedule` says which steps' rollouts each training step generates with runner.max_staleness = K, and
whether generation may run beside training. `open_channels` creates the queues of a run and closes them after; the
runner passes them to the worker methods that use them, so who talks to whom reads off the runner's calls.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from rlplace.metrics import PhaseTimer, Timeline
from rlplace.placement import ComponentPlacement
from rlplace.scheduler import Channel, WorkerGroup, wait_all

C = TypeVar("C")

log = logging.getLogger(__name__)

TRAINING_SPANS = ("advantages", "training")
"""The actor's spans that `time/overlap` counts: training beside generation, not the weight sync its receivers
share with it in every placement."""


@dataclass(frozen=True)
class Switch:
    """What to do before one phase: groups to offload first, then groups to onload."""

    offload: tuple[str, ...] = ()
    onload: tuple[str, ...] = ()


def switch_plan(
    phases: Sequence[tuple[str, frozenset[str]]],
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
            onload = tuple(c for c in working if c in offloaded)
            offloaded.update(offload)
            offloaded.difference_update(onload)
            plan[name] = Switch(offload, onload)
    return plan


class PhaseSwitcher:
    """Applies a switch plan to the run's worker groups, timing it as the step's `offload`/`onload` phases."""

    def __init__(
        self,
        groups: Mapping[str, WorkerGroup],
        placement: ComponentPlacement,
        phases: Sequence[tuple[str, frozenset[str]]],
        offloadable: Mapping[str, bool],
        timer: PhaseTimer,
    ) -> None:
        devices = {name: frozenset(placement.devices_of(name)) for name in groups}
        self.plan = switch_plan(phases, devices, offloadable)
        self.groups, self.timer = groups, timer

    def before(self, phase: str) -> None:
        switch = self.plan[phase]
        for action, names in (("offload", switch.offload), ("onload", switch.onload)):
            if names:
                with self.timer.phase(action):
                    wait_all(*(getattr(self.groups[name], action)() for name in names))


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


@contextmanager
def open_channels(kind: type[C], spinning: Mapping[str, float] | None = None, **maxsizes: int) -> Iterator[C]:
    """Create one channel per field of `kind` (a NamedTuple of Channels) with the given bounds; close them after.

    `maxsize` 0 is unbounded. `spinning` gives channels whose readers poll before sleeping, and how long
    (`Channel.create`'s `spin_s`)."""
    spin = {} if spinning is None else spinning
    opened = {name: Channel.create(name, maxsize, spin.get(name, 0.0)) for name, maxsize in maxsizes.items()}
    try:
        yield kind(**opened)
    finally:
        for channel in opened.values():
            channel.close()


def placement_timeline(placement: ComponentPlacement, components: Sequence[str]) -> Timeline:
    """A timeline with one row per device, knowing which devices each rank of each component runs on.

    Components go in in the placement's config order, which is the order in which each trace row names its
    components ("device 0: actor, env"), as the run's start line and `rlplace-plan` do.
    """
    return Timeline(
        {
            (name, p.rank): p.devices
            for name in sorted(components, key=placement.components.index)
            for p in placement.get_placements(name)
        },
        num_devices=placement.num_devices,
    )


def collect_spans(timer: PhaseTimer, timeline: Timeline, groups: Sequence[WorkerGroup]) -> None:
    """Move the step's driver phases and every worker's timed spans onto the timeline."""
    timeline.extend(timer.drain_spans())
    for group in groups:
        for spans in group.pop_timings().wait():
            timeline.extend(spans)
