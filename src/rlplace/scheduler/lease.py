"""The device lease: one run at a time holds a shared Ray cluster's devices.

Runs that start their own embedded Ray own its devices outright. Runs that join a Ray they did not start (Hydra's
Ray launcher runs every job of a sweep as a task in one Ray; several drivers may attach to `cluster.address`)
would otherwise place their workers on the same logical devices and cores at the same time, and a sweep comparing
placements would measure the other jobs. The lease is a named actor in that Ray; `acquire` waits until no other
run holds it, so concurrent jobs queue and each measures the whole device budget alone.
"""

from __future__ import annotations

import asyncio
import uuid

import ray

LEASE_ACTOR = "rlplace.device_lease"


@ray.remote(num_cpus=0)
class _DeviceLease:
    """FIFO ownership of the cluster's devices, by holder id."""

    def __init__(self) -> None:
        self.holder: str | None = None
        self.released = asyncio.Condition()

    async def acquire(self, holder: str) -> None:
        async with self.released:
            await self.released.wait_for(lambda: self.holder is None)
            self.holder = holder

    async def release(self, holder: str) -> None:
        async with self.released:
            if self.holder == holder:
                self.holder = None
                self.released.notify_all()


class DeviceLease:
    """Held from `acquire()` until `release()`; a run releases it when its Cluster shuts down."""

    def __init__(self) -> None:
        self.holder = uuid.uuid4().hex
        self._actor = _DeviceLease.options(
            name=LEASE_ACTOR, namespace="rlplace", get_if_exists=True, lifetime="detached"
        ).remote()

    def acquire(self) -> None:
        ray.get(self._actor.acquire.remote(self.holder))

    def release(self) -> None:
        ray.get(self._actor.release.remote(self.holder))
