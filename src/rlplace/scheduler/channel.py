"""`Channel`: a FIFO between producer and consumer processes (env -> rollout -> actor), with backpressure.

Decoupling producers from consumers lets pipeline stages run at their own rates, while `maxsize` keeps a fast
producer from racing ahead of memory. The queue lives in a private async Ray actor; the small picklable `Channel`
wrapper around its handle is what the runner creates and passes to worker methods as an argument. The actor has no
name in Ray's namespace (the channel's name only labels messages), so two runs sharing one Ray never collide, and
Ray ends it once no process holds a handle to it any more (or its creator exits).

Large items go to Ray's object store on the producer side (`ray.put`) and the actor holds only references, so large
tensors are never copied through it; such an item is owned by the process that put it and stays readable while that
process lives. Small items (observations and actions of a pipeline stage) travel inline in the queue call, which
halves their latency.

Each key is an independent FIFO with its own `maxsize` (e.g. one per consumer rank); the default key is None.
Every blocking call takes a timeout and raises `ChannelTimeout` rather than blocking forever; None waits forever.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlplace.scheduler.errors import ChannelTimeout

INLINE_BYTES = 64 * 1024
"""Items up to this size travel inside the queue call itself: an object-store round trip costs more than they do."""


@dataclass(frozen=True)
class _Entry:
    """A queued item: a reference to its value in the object store (Ray passes nested references unresolved), or
    the value itself when it is small (`inline`)."""

    ref: Any
    inline: bool = False

    @staticmethod
    def of(item: Any) -> _Entry:
        if _nbytes(item) <= INLINE_BYTES:
            return _Entry(item, inline=True)
        return _Entry(ray.put(item))

    def value(self) -> Any:
        return self.ref if self.inline else ray.get(self.ref)


def _nbytes(item: Any) -> float:
    """Size of arrays and tensors (also in tuples, lists and dicts); anything else counts as large.

    torch is looked up rather than imported: a process that never imported it holds no tensors, and the channel
    actor's process, which imports this module, then starts without it (a second and a few hundred MB).
    """
    torch = sys.modules.get("torch")
    if isinstance(item, np.ndarray):
        return item.nbytes
    if torch is not None and isinstance(item, torch.Tensor):
        return item.numel() * item.element_size()
    if isinstance(item, (tuple, list)):
        return sum(_nbytes(x) for x in item)
    if isinstance(item, dict):
        return sum(_nbytes(x) for x in item.values())
    if isinstance(item, (int, float, bool, str, bytes)) or item is None:
        return 64 + (len(item) if isinstance(item, (str, bytes)) else 0)
    return float("inf")


class _KeyQueue:
    """One key's FIFO. A single condition serves putters and getters; every change wakes all waiters."""

    def __init__(self, maxsize: int) -> None:
        self.items: deque[_Entry] = deque()
        self.maxsize = maxsize
        self.changed = asyncio.Condition()

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self.items)

    async def put(self, entry: _Entry, timeout: float | None) -> bool:
        async with self.changed:
            if not await _wait_for(self.changed, lambda: not self.full(), timeout):
                return False
            self.items.append(entry)
            self.changed.notify_all()
            return True

    async def get(self, timeout: float | None) -> _Entry | None:
        async with self.changed:
            if not await _wait_for(self.changed, lambda: bool(self.items), timeout):
                return None
            entry = self.items.popleft()
            self.changed.notify_all()
            return entry


async def _wait_for(condition: asyncio.Condition, predicate: Callable[[], bool], timeout: float | None) -> bool:
    try:
        await asyncio.wait_for(condition.wait_for(predicate), timeout)
    except TimeoutError:
        return False
    return True


@ray.remote(num_cpus=0)
class _ChannelActor:
    """Holds the per-key queues of one channel; every method is async, so waiting calls never block the others."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.queues: dict[Hashable, _KeyQueue] = {}

    def _queue(self, key: Hashable) -> _KeyQueue:
        if key not in self.queues:
            self.queues[key] = _KeyQueue(self.maxsize)
        return self.queues[key]

    async def put(self, key: Hashable, entry: _Entry, timeout: float | None) -> bool:
        return await self._queue(key).put(entry, timeout)

    async def get(self, key: Hashable, timeout: float | None) -> _Entry | None:
        return await self._queue(key).get(timeout)

    async def qsize(self, key: Hashable) -> int:
        return len(self._queue(key).items)

    async def full(self, key: Hashable) -> bool:
        return self._queue(key).full()


class Channel:
    """A keyed FIFO usable from the driver and from workers: create it in the runner, pass it to worker methods.

    `put` and `get` block up to `timeout` seconds, then raise `ChannelTimeout`.
    """

    def __init__(self, name: str, actor: ActorHandle, maxsize: int) -> None:
        """Wrap a channel actor; use `Channel.create` instead."""
        self.name = name
        self.maxsize = maxsize
        self._actor = actor

    @classmethod
    def create(cls, name: str, maxsize: int = 0) -> Channel:
        """A new channel labelled `name` in messages; `maxsize` bounds each key's queue, 0 = unbounded.

        The channel lives on the caller's node, while some process holds it and the caller's process lives.
        """
        if maxsize < 0:
            raise ValueError(f"channel {name!r}: maxsize must be >= 0, got {maxsize}")
        node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        return cls(name, _ChannelActor.options(scheduling_strategy=node).remote(maxsize), maxsize)

    def put(self, item: Any, key: Hashable = None, timeout: float | None = None) -> None:
        """Append `item` to the queue of `key`, waiting while it is full; ChannelTimeout after `timeout` seconds."""
        if not ray.get(self._actor.put.remote(key, _Entry.of(item), timeout)):
            raise ChannelTimeout(self.name, key, "put", timeout)

    def get(self, key: Hashable = None, timeout: float | None = None) -> Any:
        """Remove and return the oldest item of `key`, waiting while it is empty; ChannelTimeout after `timeout`."""
        entry = ray.get(self._actor.get.remote(key, timeout))
        if entry is None:
            raise ChannelTimeout(self.name, key, "get", timeout)
        return entry.value()

    def qsize(self, key: Hashable = None) -> int:
        return ray.get(self._actor.qsize.remote(key))

    def empty(self, key: Hashable = None) -> bool:
        return self.qsize(key) == 0

    def full(self, key: Hashable = None) -> bool:
        return ray.get(self._actor.full.remote(key))

    def close(self) -> None:
        """Destroy the channel and the items still in it."""
        ray.kill(self._actor)

    def __repr__(self) -> str:
        return f"Channel(name={self.name!r}, maxsize={self.maxsize})"
