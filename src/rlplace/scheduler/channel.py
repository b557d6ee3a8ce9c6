"""`Channel`: a named FIFO between producer and consumer processes (env -> rollout -> actor), with backpressure.

Decoupling producers from consumers lets pipeline stages run at their own rates, while `maxsize` keeps a fast
producer from racing ahead of memory. The queue lives in a private async Ray actor, so any process (driver or
worker, on any node) can use it through the small picklable `Channel` wrapper: pass it to a worker method, or find
it by name with `Channel.connect`. Large items go to Ray's object store on the producer side (`ray.put`) and the actor
holds only references, so large tensors are never copied through it; such an item is owned by the process that put
it and stays readable while that process lives. Small items (observations and actions of a pipeline stage) travel
inline in the queue call, which halves their latency.

Each key is an independent FIFO with its own `maxsize` (e.g. one per consumer rank); the default key is None.
Every blocking call takes a timeout and raises `ChannelTimeout` rather than blocking forever; None waits forever.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlplace.scheduler.errors import ChannelTimeout

_NAME_PREFIX = "rlplace.channel."


INLINE_BYTES = 64 * 1024
"""Items up to this size travel inside the queue call itself: an object-store round trip costs more than they do."""


@dataclass(frozen=True)
class _Entry:
    """A queued item: a reference to its value in the object store (Ray passes nested references unresolved), or
    the value itself when it is small (`inline`)."""

    ref: Any
    weight: float
    inline: bool = False

    @staticmethod
    def of(item: Any, weight: float) -> _Entry:
        if _nbytes(item) <= INLINE_BYTES:
            return _Entry(item, weight, inline=True)
        return _Entry(ray.put(item), weight)


def _nbytes(item: Any) -> float:
    """Size of arrays and tensors (also in tuples, lists and dicts); anything else counts as large."""
    if isinstance(item, np.ndarray):
        return item.nbytes
    if isinstance(item, torch.Tensor):
        return item.numel() * item.element_size()
    if isinstance(item, (tuple, list)):
        return sum(_nbytes(x) for x in item)
    if isinstance(item, dict):
        return sum(_nbytes(x) for x in item.values())
    if isinstance(item, (int, float, bool, str, bytes)) or item is None:
        return 64 + (len(item) if isinstance(item, (str, bytes)) else 0)
    return float("inf")


def _values(entries: list[_Entry]) -> list[Any]:
    refs = [entry.ref for entry in entries if not entry.inline]
    fetched = iter(ray.get(refs)) if refs else iter(())
    return [entry.ref if entry.inline else next(fetched) for entry in entries]


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

    async def take(self, enough: Callable[[list[_Entry]], bool], timeout: float | None) -> list[_Entry] | None:
        """Items from the front until `enough(taken)`; on timeout none are taken (they go back, in order)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        taken: list[_Entry] = []
        async with self.changed:
            while not enough(taken):
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not await _wait_for(self.changed, lambda: bool(self.items), remaining):
                    self.items.extendleft(reversed(taken))
                    self.changed.notify_all()
                    return None
                taken.append(self.items.popleft())
                self.changed.notify_all()  # room for a blocked putter, which may bring the rest of a batch
            return taken


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

    async def get(self, key: Hashable, timeout: float | None) -> list[_Entry] | None:
        return await self._queue(key).take(lambda taken: len(taken) == 1, timeout)

    async def get_batch(self, key: Hashable, target_weight: float, timeout: float | None) -> list[_Entry] | None:
        return await self._queue(key).take(lambda taken: sum(e.weight for e in taken) >= target_weight, timeout)

    async def qsize(self, key: Hashable) -> int:
        return len(self._queue(key).items)

    async def full(self, key: Hashable) -> bool:
        return self._queue(key).full()

    async def get_maxsize(self) -> int:
        return self.maxsize


class Channel:
    """A named, keyed FIFO usable from the driver and from workers; create it once, connect to it anywhere.

    `put`/`get`/`get_batch` block (up to `timeout`); `put_async`/`get_async`/`get_batch_async` are coroutines for
    async worker methods. `weight` lets `get_batch` collect, e.g., a number of samples rather than of items.
    """

    def __init__(self, name: str, actor: ActorHandle, maxsize: int) -> None:
        """Wrap an existing channel actor; use `Channel.create` or `Channel.connect` instead."""
        self.name = name
        self.maxsize = maxsize
        self._actor = actor

    @classmethod
    def create(cls, name: str, maxsize: int = 0) -> Channel:
        """Start the channel `name` (unique in the Ray namespace); `maxsize` bounds each key's queue, 0 = unbounded.

        The channel lives on the caller's node and as long as the caller's process (the driver, usually).
        """
        if maxsize < 0:
            raise ValueError(f"channel {name!r}: maxsize must be >= 0, got {maxsize}")
        node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        try:
            actor = _ChannelActor.options(name=_NAME_PREFIX + name, scheduling_strategy=node).remote(maxsize)
        except ValueError as error:
            raise ValueError(f"a channel named {name!r} already exists; use Channel.connect({name!r})") from error
        return cls(name, actor, maxsize)

    @classmethod
    def connect(cls, name: str, timeout: float = 10.0) -> Channel:
        """The channel `name`, waiting up to `timeout` seconds for someone to create it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                actor = ray.get_actor(_NAME_PREFIX + name)
                break
            except ValueError:
                if time.monotonic() > deadline:
                    raise ValueError(f"no channel named {name!r} was created within {timeout:g} s") from None
                time.sleep(0.05)
        return cls(name, actor, ray.get(actor.get_maxsize.remote()))

    def put(self, item: Any, key: Hashable = None, weight: float = 1, timeout: float | None = None) -> None:
        """Append `item` to the queue of `key`, waiting while it is full; ChannelTimeout after `timeout` seconds."""
        if not ray.get(self._put_ref(item, key, weight, timeout)):
            raise ChannelTimeout(self.name, key, "put", timeout)

    def get(self, key: Hashable = None, timeout: float | None = None) -> Any:
        """Remove and return the oldest item of `key`, waiting while it is empty; ChannelTimeout after `timeout`."""
        entries = ray.get(self._actor.get.remote(key, timeout))
        if entries is None:
            raise ChannelTimeout(self.name, key, "get", timeout)
        return _values(entries)[0]

    def get_batch(self, target_weight: float, key: Hashable = None, timeout: float | None = None) -> list[Any]:
        """Remove the oldest items of `key` until their weights sum to at least `target_weight`, in FIFO order.

        On timeout nothing is removed (items taken so far go back to the front) and ChannelTimeout is raised.
        """
        entries = ray.get(self._get_batch_ref(target_weight, key, timeout))
        if entries is None:
            raise ChannelTimeout(self.name, key, f"get_batch({target_weight:g})", timeout)
        return _values(entries)

    async def put_async(self, item: Any, key: Hashable = None, weight: float = 1, timeout: float | None = None) -> None:
        """`put` as a coroutine."""
        if not await self._put_ref(item, key, weight, timeout):
            raise ChannelTimeout(self.name, key, "put", timeout)

    async def get_async(self, key: Hashable = None, timeout: float | None = None) -> Any:
        """`get` as a coroutine."""
        entries = await self._actor.get.remote(key, timeout)
        if entries is None:
            raise ChannelTimeout(self.name, key, "get", timeout)
        entry = entries[0]
        return entry.ref if entry.inline else await entry.ref

    async def get_batch_async(
        self, target_weight: float, key: Hashable = None, timeout: float | None = None
    ) -> list[Any]:
        """`get_batch` as a coroutine."""
        entries = await self._get_batch_ref(target_weight, key, timeout)
        if entries is None:
            raise ChannelTimeout(self.name, key, f"get_batch({target_weight:g})", timeout)
        return [entry.ref if entry.inline else await entry.ref for entry in entries]

    def qsize(self, key: Hashable = None) -> int:
        return ray.get(self._actor.qsize.remote(key))

    def empty(self, key: Hashable = None) -> bool:
        return self.qsize(key) == 0

    def full(self, key: Hashable = None) -> bool:
        return ray.get(self._actor.full.remote(key))

    def close(self) -> None:
        """Destroy the channel and the items still in it."""
        ray.kill(self._actor)

    def _put_ref(self, item: Any, key: Hashable, weight: float, timeout: float | None) -> ray.ObjectRef:
        if weight <= 0:
            raise ValueError(f"channel {self.name!r}: weight must be > 0, got {weight}")
        return self._actor.put.remote(key, _Entry.of(item, weight), timeout)

    def _get_batch_ref(self, target_weight: float, key: Hashable, timeout: float | None) -> ray.ObjectRef:
        if target_weight <= 0:
            raise ValueError(f"channel {self.name!r}: target_weight must be > 0, got {target_weight}")
        return self._actor.get_batch.remote(key, target_weight, timeout)

    def __repr__(self) -> str:
        return f"Channel(name={self.name!r}, maxsize={self.maxsize})"
