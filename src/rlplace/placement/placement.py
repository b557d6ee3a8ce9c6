"""The placement record: everything one worker process needs to know about where it runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Where one process of a component runs.

    `devices` are global device ranks (node-major across the cluster); `local_devices` are the same devices
    numbered within the node, which is what the process sees as its `CUDA_VISIBLE_DEVICES` on a GPU cluster or
    the logical devices whose CPU cores it pins to on a CPU-only cluster. A node-group placement (CPU-only
    processes placed on nodes) has no devices.
    """

    rank: int
    world_size: int
    node_rank: int
    devices: tuple[int, ...]
    local_devices: tuple[int, ...]
    local_rank: int
    local_world_size: int
