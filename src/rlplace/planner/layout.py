"""Where a placement's processes do their CPU work: the resources (`contention.Resources`) of every rank.

Both families' step models place a placement's processes with this, from a `ComponentPlacement` or the
`to_dict()` a profile stores, the cores of each device of a cpu cluster, and each node's cores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .contention import Resources


class Placed(Protocol):
    """What the layout reads of a placement (`rlplace.placement.ComponentPlacement`)."""

    components: Sequence[str]

    def get_placements(self, name: str) -> Sequence[Any]: ...


def ranks_of(placement: Placed | Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per component, each rank's {"node", "devices"}: a placement's, or a stored placement's (its `to_dict()`)."""
    if isinstance(placement, Mapping):
        return {name: list(procs) for name, procs in placement["components"].items()}
    return {
        name: [{"node": p.node_rank, "devices": p.devices} for p in placement.get_placements(name)]
        for name in placement.components
    }


def process_resources(
    placement: Placed | Mapping[str, Any],
    cores: Mapping[int, Sequence[int]],
    node_cores: Mapping[int, Sequence[int]] | None = None,
) -> dict[str, list[Resources]]:
    """Per component, one resource set per rank.

    A process on cpu devices runs on their cores. A process that is not pinned (on a GPU, whose units are the CPU
    work of launching its kernels, or in a node group) runs on a core of its node: the node's cores are dealt out to
    such processes in turn, shared only when there are more processes than cores; with the node's cores unknown,
    each process is assumed to find one of its own."""
    node_cores = node_cores or {}
    dealt: dict[int, int] = {}
    processes: dict[str, list[Resources]] = {}
    for name, procs in ranks_of(placement).items():
        processes[name] = []
        for i, proc in enumerate(procs):
            pinned = frozenset(("core", proc["node"], c) for d in proc["devices"] for c in cores.get(d, ()))
            if not pinned:
                free = node_cores.get(proc["node"])
                turn = dealt[proc["node"]] = dealt.get(proc["node"], -1) + 1
                pinned = frozenset({("core", proc["node"], free[turn % len(free)]) if free else (name, i)})
            processes[name].append(pinned)
    return processes


def component_devices(placement: Placed | Mapping[str, Any]) -> dict[str, frozenset[int]]:
    """Per component, the devices its ranks hold."""
    return {name: frozenset(d for p in procs for d in p["devices"]) for name, procs in ranks_of(placement).items()}
