"""Placement strategies: how a component's processes map onto the cluster's nodes and devices.

A strategy is plain data (checked when built) that turns a cluster shape into one `Placement` per process. The
scheduler launches workers from these records and never re-derives devices itself, so what `rlplace-plan` prints is
exactly what runs. The names and semantics follow RLinf's `PackedPlacementStrategy` and `FlexiblePlacementStrategy`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import PlacementError
from .grammar import format_ranks
from .placement import Placement


class PlacementStrategy(ABC):
    """Base class: yields the placements of a component's processes on a cluster of a given shape."""

    @property
    @abstractmethod
    def num_processes(self) -> int:
        """How many processes this strategy places."""

    @abstractmethod
    def get_placements(self, num_nodes: int, num_devices_per_node: int) -> list[Placement]:
        """One `Placement` per process, in rank order; raises PlacementError if the cluster cannot hold them."""


def _check_shape(num_nodes: int, num_devices_per_node: int) -> None:
    for name, value, minimum in (("num_nodes", num_nodes, 1), ("num_devices_per_node", num_devices_per_node, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise PlacementError(f"cluster shape: {name} = {value!r} must be an integer >= {minimum}")


def _device_placements(
    process_devices: Sequence[tuple[int, ...]], num_nodes: int, num_devices_per_node: int
) -> list[Placement]:
    """Check devices against the cluster and build the records; a process may not span nodes."""
    _check_shape(num_nodes, num_devices_per_node)
    num_devices = num_nodes * num_devices_per_node
    process_nodes: list[int] = []
    for rank, devices in enumerate(process_devices):
        for device in devices:
            if device >= num_devices:
                raise PlacementError(
                    f"device {device} of process {rank} is out of range; this cluster has {num_devices} devices "
                    f"(valid: {format_ranks(range(num_devices))})"
                )
        nodes = sorted({device // num_devices_per_node for device in devices})
        if len(nodes) > 1:
            per_node = num_devices_per_node
            holds = "; ".join(f"node {n} holds {format_ranks(range(n * per_node, (n + 1) * per_node))}" for n in nodes)
            raise PlacementError(
                f"process {rank} would span nodes {', '.join(map(str, nodes))} (devices {format_ranks(devices)}); "
                f"the devices of one process must lie on one node ({holds})"
            )
        process_nodes.append(nodes[0])
    local_devices = [tuple(d % num_devices_per_node for d in devices) for devices in process_devices]
    return _records(process_nodes, list(process_devices), local_devices)


def _records(
    process_nodes: Sequence[int],
    process_devices: Sequence[tuple[int, ...]],
    local_devices: Sequence[tuple[int, ...]],
) -> list[Placement]:
    per_node = Counter(process_nodes)
    seen: Counter[int] = Counter()
    placements = []
    for rank, node in enumerate(process_nodes):
        placements.append(
            Placement(
                rank=rank,
                world_size=len(process_nodes),
                node_rank=node,
                devices=tuple(process_devices[rank]),
                local_devices=tuple(local_devices[rank]),
                local_rank=seen[node],
                local_world_size=per_node[node],
            )
        )
        seen[node] += 1
    return placements


@dataclass(frozen=True)
class PackedPlacementStrategy(PlacementStrategy):
    """Devices `start..end` (global ranks, inclusive) packed into processes of `num_devices_per_process` consecutive
    devices; the device count must be divisible by `num_devices_per_process`."""

    start: int
    end: int
    num_devices_per_process: int = 1

    def __post_init__(self) -> None:
        for name in ("start", "end", "num_devices_per_process"):
            value = getattr(self, name)
            minimum = 0 if name in ("start", "end") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise PlacementError(f"PackedPlacementStrategy: {name} = {value!r} must be an integer >= {minimum}")
        if self.end < self.start:
            raise PlacementError(f"PackedPlacementStrategy: end {self.end} is before start {self.start}")
        count = self.end - self.start + 1
        if count % self.num_devices_per_process:
            raise PlacementError(
                f"PackedPlacementStrategy: {count} devices ({self.start}-{self.end}) are not divisible by "
                f"num_devices_per_process = {self.num_devices_per_process}"
            )

    @property
    def num_processes(self) -> int:
        return (self.end - self.start + 1) // self.num_devices_per_process

    def process_devices(self) -> list[tuple[int, ...]]:
        """Global devices of each process, in rank order."""
        size = self.num_devices_per_process
        return [tuple(range(first, first + size)) for first in range(self.start, self.end + 1, size)]

    def get_placements(self, num_nodes: int, num_devices_per_node: int) -> list[Placement]:
        return _device_placements(self.process_devices(), num_nodes, num_devices_per_node)


@dataclass(frozen=True)
class FlexiblePlacementStrategy(PlacementStrategy):
    """Explicit devices per process: `[[0, 1], [2, 3]]` is two processes with two devices each.

    Several processes may list the same device; that is how two processes per device are expressed.
    """

    device_ranks_per_process: tuple[tuple[int, ...], ...]

    def __init__(self, device_ranks_per_process: Sequence[Sequence[int]]) -> None:
        processes = tuple(tuple(devices) for devices in device_ranks_per_process)
        if not processes:
            raise PlacementError("FlexiblePlacementStrategy: at least one process is required")
        for rank, devices in enumerate(processes):
            if not devices:
                raise PlacementError(f"FlexiblePlacementStrategy: process {rank} has no devices")
            if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices):
                raise PlacementError(
                    f"FlexiblePlacementStrategy: process {rank} devices {list(devices)} must be integers >= 0"
                )
            if len(set(devices)) != len(devices):
                raise PlacementError(f"FlexiblePlacementStrategy: process {rank} lists a device twice: {list(devices)}")
        object.__setattr__(self, "device_ranks_per_process", processes)

    @property
    def num_processes(self) -> int:
        return len(self.device_ranks_per_process)

    def get_placements(self, num_nodes: int, num_devices_per_node: int) -> list[Placement]:
        return _device_placements(self.device_ranks_per_process, num_nodes, num_devices_per_node)


@dataclass(frozen=True)
class NodePlacementStrategy(PlacementStrategy):
    """CPU-only processes placed on nodes: one process per entry of `node_ranks` (repeat a node for several)."""

    node_ranks: tuple[int, ...]

    def __init__(self, node_ranks: Sequence[int]) -> None:
        nodes = tuple(node_ranks)
        if not nodes:
            raise PlacementError("NodePlacementStrategy: at least one process is required")
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in nodes):
            raise PlacementError(f"NodePlacementStrategy: node ranks {list(nodes)} must be integers >= 0")
        object.__setattr__(self, "node_ranks", nodes)

    @property
    def num_processes(self) -> int:
        return len(self.node_ranks)

    def get_placements(self, num_nodes: int, num_devices_per_node: int) -> list[Placement]:
        _check_shape(num_nodes, num_devices_per_node)
        for rank, node in enumerate(self.node_ranks):
            if node >= num_nodes:
                raise PlacementError(
                    f"node {node} of process {rank} is out of range; this cluster has {num_nodes} nodes "
                    f"(valid: {format_ranks(range(num_nodes))})"
                )
        empty = [()] * len(self.node_ranks)
        return _records(self.node_ranks, empty, empty)
