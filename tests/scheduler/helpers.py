"""Helpers shared by the scheduler tests: placements built by hand."""

from __future__ import annotations

from collections.abc import Sequence

from rlplace.placement.placement import Placement


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
