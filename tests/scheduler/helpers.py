"""Helpers shared by the scheduler tests: a cluster config stand-in and placements built by hand."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlplace.placement.placement import Placement


@dataclass
class ClusterCfg:
    """The fields `Cluster` reads (a stand-in for rlplace.config.ClusterConfig)."""

    num_nodes: int = 1
    num_devices_per_node: int = 2
    device_type: str = "cpu"
    address: str | None = None
    cpus_per_device: int | None = None
    dashboard: bool = False
    namespace: str | None = None


def on_devices(*local_devices: Sequence[int], node_rank: int = 0, devices_per_node: int = 2) -> list[Placement]:
    """One rank per entry, all on `node_rank`; entry i lists rank i's local devices."""
    world_size = len(local_devices)
    return [
        Placement(
            rank=rank,
            world_size=world_size,
            node_rank=node_rank,
            devices=tuple(node_rank * devices_per_node + d for d in devices),
            local_devices=tuple(devices),
            local_rank=rank,
            local_world_size=world_size,
        )
        for rank, devices in enumerate(local_devices)
    ]
