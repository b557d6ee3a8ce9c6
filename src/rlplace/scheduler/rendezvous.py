"""The rendezvous: how workers of one cluster find each other for group-to-group transfers.

Workers address peers by group name ("rollout") and rank, but a name may be relaunched, and a pair's TCPStore port
(or a rank's mailbox) is only known once its owner opened it. One object per cluster, hosted in the driver's hub
(`hub.py`), keeps both: the current launch (uid and size) of every group name, and the addresses workers publish,
which a peer awaits. Workers reach it by its address (`WorkerContext.rendezvous`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from rlplace.scheduler.hub import Hosted, host


class _Rendezvous:
    """Introduces workers to each other: which launch a group name refers to, and the addresses they publish."""

    def __init__(self) -> None:
        self._groups: dict[str, tuple[str, int]] = {}
        self._addresses: dict[str, Any] = {}
        self._published: dict[str, asyncio.Event] = {}

    # Every method is async, so all of them run on the hub's event loop, where the events live.
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


def create_rendezvous() -> Hosted:
    """A new rendezvous, hosted in this process's hub (the driver's, on its node)."""
    return host(_Rendezvous)
