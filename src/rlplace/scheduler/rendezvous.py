"""The rendezvous actor: how workers of one cluster find each other for group-to-group transfers.

Workers address peers by group name ("rollout") and rank, but a name may be relaunched, and a pair's TCPStore port
(or a rank's mailbox) is only known once its owner opened it. One named async actor per cluster keeps both: the
current launch (uid and size) of every group name, and the addresses workers publish, which a peer awaits.
It imports no torch, so its process starts fast.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
class _Rendezvous:
    """Introduces workers to each other: which launch a group name refers to, and the addresses they publish."""

    def __init__(self) -> None:
        self._groups: dict[str, tuple[str, int]] = {}
        self._addresses: dict[str, Any] = {}
        self._published: dict[str, asyncio.Event] = {}

    # Every method is async, so all of them run on the actor's event loop, where the events live.
    async def register_group(self, name: str, uid: str, world_size: int) -> None:
        self._groups[name] = (uid, world_size)

    async def group(self, name: str) -> tuple[str, int] | None:
        return self._groups.get(name)

    async def publish(self, key: str, address: Any) -> None:
        self._addresses[key] = address
        self._published.setdefault(key, asyncio.Event()).set()

    async def lookup(self, key: str, timeout: float) -> Any | None:
        """The address published under `key`, waiting for it up to `timeout` seconds; None after that."""
        try:
            await asyncio.wait_for(self._published.setdefault(key, asyncio.Event()).wait(), timeout)
        except TimeoutError:
            return None
        return self._addresses[key]


def create_rendezvous(name: str, node_id: str) -> ActorHandle:
    """The named rendezvous actor of one cluster, created by the driver on its own node (or found if it exists)."""
    return _Rendezvous.options(
        name=name,
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True),
    ).remote()
