"""What both runners share: the phase switch plan, channels opened for a run, and the per-step timeline.

A step is a fixed sequence of phases, each with the components that hold device memory in it. When components
share devices, the idle ones make room: `switch_plan` decides once, from the placement and each component's
`enable_offload`, which groups to offload and onload before each phase, so the runner's phase methods do only their
phase. `open_channels` creates the queues of a run and closes them after; the runner passes them to the worker
methods that use them, so who talks to whom reads off the runner's calls.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from rlplace.metrics import PhaseTimer, Timeline
from rlplace.placement import ComponentPlacement
from rlplace.scheduler import Channel, WorkerGroup, wait_all

C = TypeVar("C")


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


@contextmanager
def open_channels(kind: type[C], **maxsizes: int) -> Iterator[C]:
    """Create one channel per field of `kind` (a NamedTuple of Channels) with the given bounds; close them after.

    `maxsize` 0 is unbounded."""
    opened = {name: Channel.create(name, maxsize) for name, maxsize in maxsizes.items()}
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
