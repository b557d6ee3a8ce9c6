"""Timing a unit of work alone, for a run's profile: the median of several calls after warm-up ones.

Medians, because a stray preemption of one call must not move the cost. A worker times its unit with
`median_seconds` while every other process of the run idles (or, for collective units, while its peers run the
same calls).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlplace.placement import ComponentPlacement

TARGET_S = 0.2
"""Roughly how long the timed calls of one size take together: long enough for a steady median, short enough that
the default CartPole run profiles in a few seconds."""
MIN_REPEATS = 3
"""Fewest timed calls per size, however slow one is: a median of at least three."""
MAX_REPEATS = 200
"""Most timed calls per size, however fast one is."""
WARMUP = 2
"""Untimed calls before timing: first calls pay for allocations, caches and lazy initialisation."""


def seconds_of(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def repeats_for(seconds: float) -> int:
    """Timed calls for a unit that took `seconds` once: about TARGET_S worth, within [MIN_REPEATS, MAX_REPEATS]."""
    return max(MIN_REPEATS, min(MAX_REPEATS, round(TARGET_S / max(seconds, 1e-9))))


def median_seconds(call: Callable[[], object], repeats: int | None = None, warmup: int = WARMUP) -> float:
    """Median seconds of `call` over `repeats` timed calls after `warmup` untimed ones; `repeats` None: one more
    timed call decides (`repeats_for`). `call` must finish its work before it returns (synchronise a GPU)."""
    return interleaved_medians([call], repeats, warmup)[0]


def interleaved_medians(
    calls: Sequence[Callable[[], object]], repeats: int | None = None, warmup: int = WARMUP
) -> list[float]:
    """Median seconds of each of `calls` (one unit at several sizes; `repeats` and `warmup` as for
    `median_seconds`), timed in rounds that take one call of each in turn, after every call's warm-up: a stretch in
    which the machine runs slow (another tenant of a shared host, a clock change) then lands on all sizes alike, and
    each median leaves it out. Timed one size after another, such a stretch shifts the size timed during it alone
    and bends the curve that the planner reads between sizes. A call fast enough to need more timed calls than the
    others (`repeats` None) goes on alone after their last round."""
    for call in calls:
        for _ in range(warmup):
            call()
    counts = [repeats if repeats is not None else repeats_for(seconds_of(call)) for call in calls]
    samples: list[list[float]] = [[] for _ in calls]
    for round_ in range(max(counts, default=0)):
        for call, count, found in zip(calls, counts, samples, strict=True):
            if round_ < count:
                found.append(seconds_of(call))
    return [statistics.median(found) for found in samples]


def sizes_up_to(last: int, first: int = 1) -> list[int]:
    """The powers of two from `first` (a power of two) to `last`, and `last` itself: [1, 2, 4, 8, 12] for 12.

    Doubling sizes cover a range with few points, which the planner interpolates between; `last` is the size this
    run used. Just [last] when it is below `first`."""
    if first < 1 or first & (first - 1):
        raise ValueError(f"first size {first} is not a power of two")
    if last < 1:
        raise ValueError(f"last size {last} is not positive")
    sizes = []
    size = first
    while size <= last:
        sizes.append(size)
        size *= 2
    return sizes if sizes and sizes[-1] == last else [*sizes, last]


def where_it_ran(
    device_type: str,
    cores: Mapping[int, list[int]],
    node_cores: Mapping[int, list[int]],
    placement: ComponentPlacement,
) -> dict[str, Any]:
    """The fields of a profile (either family's) that say where the profiled run ran: the device type, each device's
    and each node's CPU cores, and the placement."""
    return {
        "device_type": device_type,
        "devices": {str(device): found for device, found in cores.items()},
        "node_cores": {str(node): found for node, found in node_cores.items()},
        "placement": placement.to_dict(),
    }
