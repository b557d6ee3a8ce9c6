"""Which CPU cores each logical device of a cpu cluster owns (a pure function, shared by the scheduler, which pins
workers to them, and the planner, which predicts their contention)."""

from __future__ import annotations

from collections.abc import Sequence


def device_cores(cores: Sequence[int], num_devices: int, cpus_per_device: int | None) -> list[tuple[int, ...]]:
    """The cores of each logical device of a node: consecutive runs of `cpus_per_device` cores (None: the cores
    split evenly, at least one each); with more devices than cores, devices wrap round-robin and share."""
    per_device = cpus_per_device or max(1, len(cores) // num_devices)
    return [
        tuple(cores[(device * per_device + i) % len(cores)] for i in range(per_device)) for device in range(num_devices)
    ]
