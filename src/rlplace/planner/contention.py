"""How long processes that share cores (or a GPU) take to do their work together.

Each process runs on a set of resources: the CPU cores of its logical device (cpu clusters), its GPU, or a core of
its own (a node-group process, assumed to find an idle core). A busy process occupies all of its resources (torch
runs one thread per core of the device), so work on shared resources adds up: processes that are busy at the same
time finish no sooner than their most loaded resource can serve all their work.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

Resources = frozenset[Hashable]
Work = tuple[Resources, float]
"""A process's resources and its busy seconds (as it would need them alone)."""


def busiest(work: Sequence[Work]) -> float:
    """Seconds the most loaded resource needs to serve all this work, which runs at the same time."""
    load: Counter[Hashable] = Counter()
    for resources, seconds in work:
        for resource in resources:
            load[resource] += seconds
    return max(load.values(), default=0.0)
