"""`Channel`: a keyed FIFO between processes (env <-> rollout -> actor, the reasoning stages), with backpressure.

Decoupling producers from consumers lets pipeline stages run at their own rates, while `maxsize` keeps a fast
producer from racing ahead of memory. Each key is an independent FIFO with its own `maxsize`; the default key is
None. Every blocking call takes a timeout and raises `ChannelTimeout` rather than blocking forever (None waits
forever); a peer process that dies surfaces as a `ChannelError` naming it.

Items travel directly from the writing process to the reading one (`mailbox.py`: a Unix socket on one node, TCP
across nodes), with no Ray call per item. A key has one reader: the first process that calls `get` on it. A small
object per channel, the registry, introduces writers to that reader once, and holds what writers put before the
reader made itself known (the slow path, a few items at the start of a run). A bounded key (maxsize > 0) takes one
writer, which counts the items the reader has not taken yet; an unbounded key takes any number of writers.

The registry lives in the creating process's hub (`hub.py`), at an address of its own (the channel's name only
labels messages), so two runs sharing one Ray never collide; it ends with `close` or with the process that created
the channel.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections import deque
from collections.abc import Hashable
from typing import Any

import ray

from rlplace.scheduler.errors import ChannelError, ChannelTimeout
from rlplace.scheduler.hub import Hosted, host
from rlplace.scheduler.mailbox import Address, Mailbox, QueueId, mailbox


class _Backlog:
    """A key's items put before its reader registered, pickled so the registry never imports what they hold."""

    def __init__(self) -> None:
        self.items: deque[bytes] = deque()
        self.changed = asyncio.Condition()


class _Registry:
    """Who reads each key of one channel, and the backlog of keys nobody reads yet; hosted in a hub. Every method is
    async, so a writer waiting on a full backlog never blocks the reader that would drain it."""

    def __init__(self, name: str, maxsize: int) -> None:
        self.name = name
        self.maxsize = maxsize
        self.readers: dict[Hashable, Address] = {}
        self.backlogs: dict[Hashable, _Backlog] = {}
        self.closed = False

    def _backlog(self, key: Hashable) -> _Backlog:
        if key not in self.backlogs:
            self.backlogs[key] = _Backlog()
        return self.backlogs[key]

    async def register(self, key: Hashable, reader: Address) -> Address | list[bytes]:
        """Make `reader` the key's reader and hand it the backlog; or, if another process reads the key, its
        address."""
        current = self.readers.setdefault(key, reader)
        if current != reader:
            return current
        backlog = self._backlog(key)
        async with backlog.changed:
            items = list(backlog.items)
            backlog.items.clear()
            backlog.changed.notify_all()  # writers waiting for room now find the reader
        return items

    async def put(self, key: Hashable, item: bytes, timeout: float | None) -> Address | bool:
        """The key's reader, for the writer to send to directly; else queue `item` (True), waiting while the
        backlog is full; False after `timeout`."""
        backlog = self._backlog(key)
        async with backlog.changed:

            def ready() -> bool:
                return self.closed or key in self.readers or not 0 < self.maxsize <= len(backlog.items)

            try:
                await asyncio.wait_for(backlog.changed.wait_for(ready), timeout)
            except TimeoutError:
                return False
            if self.closed:
                raise ChannelError(f"channel {self.name!r} was closed while a writer waited for room")
            if key in self.readers:
                return self.readers[key]
            backlog.items.append(item)
            return True

    async def lookup(self, key: Hashable) -> tuple[Address | None, int]:
        """The key's reader if it has one, and the backlog's length."""
        return self.readers.get(key), len(self._backlog(key).items)

    async def close(self) -> None:
        """Wake the writers waiting for room, which then fail: the channel is gone."""
        self.closed = True
        for backlog in self.backlogs.values():
            async with backlog.changed:
                backlog.changed.notify_all()


class Channel:
    """A keyed FIFO usable from the driver and from workers: create it in the runner, pass it to worker methods.

    `put` and `get` block up to `timeout` seconds, then raise `ChannelTimeout`.
    """

    def __init__(self, name: str, maxsize: int, registry: str, spin_s: float = 0.0) -> None:
        """A handle on an existing channel (`registry`: its registry's hub address); use `Channel.create` instead."""
        self.name = name
        self.maxsize = maxsize
        self.spin_s = spin_s
        self._id = registry
        self._wheres: dict[Hashable, str] = {}
        self._hosted: Hosted | None = None

    @classmethod
    def create(cls, name: str, maxsize: int = 0, spin_s: float = 0.0) -> Channel:
        """A new channel labelled `name` in messages; `maxsize` bounds each key's queue, 0 = unbounded.

        `spin_s` > 0: a `get` on an empty key polls up to that long before its process sleeps, when the reader and
        the key's writers are pinned to disjoint cores. Waking a sleeping process costs tens of microseconds, more
        than a hand-off itself; polling costs the reader's core meanwhile, so give it only to channels whose readers
        have nothing else to run on their cores while they wait (generation's lockstep, `rlplace.embodied.runner`).

        Its registry lives on the caller's node, while the caller's process lives or until `close`.
        """
        if maxsize < 0:
            raise ValueError(f"channel {name!r}: maxsize must be >= 0, got {maxsize}")
        return cls(name, maxsize, host(_Registry, name, maxsize).address, spin_s)

    @property
    def _registry(self) -> Hosted:
        """The registry. A channel pickles as its name, size and the registry's address only: a Ray actor handle
        costs a fraction of a millisecond to unpickle, in every worker call that passes the channel."""
        if self._hosted is None:
            self._hosted = Hosted(self._id)
        return self._hosted

    def put(self, item: Any, key: Hashable = None, timeout: float | None = None) -> None:
        """Append `item` to the queue of `key`, waiting while it is full; ChannelTimeout after `timeout` seconds."""
        box, queue, deadline = mailbox(), self.queue(key), _deadline(timeout)
        with box.lock:
            reader = box.readers.get(queue)
            if reader is None:
                reader = ray.get(self._registry.put.remote(key, pickle.dumps(item, protocol=5), timeout))
                if reader is True:
                    return
                if reader is False:
                    raise ChannelTimeout(self.name, key, "put", timeout)
                box.readers[queue] = reader
            if reader == box.address:
                sent = box.put_local(queue, item, self.maxsize, deadline)
            else:
                sent = box.send(reader, queue, item, self.maxsize, deadline, self._where(key))
            if not sent:
                raise ChannelTimeout(self.name, key, "put", timeout)

    def get(self, key: Hashable = None, timeout: float | None = None) -> Any:
        """Remove and return the oldest item of `key`, waiting while it is empty; ChannelTimeout after `timeout`.

        The first `get` on a key makes this process its reader; another process's `get` on it is a ChannelError."""
        box, queue = mailbox(), self.queue(key)
        with box.lock:
            self._register(box, key)
            received, item = box.receive(queue, self.maxsize, _deadline(timeout), self._where(key), self.spin_s)
        if not received:
            raise ChannelTimeout(self.name, key, "get", timeout)
        return item

    def subscribe(self, key: Hashable = None) -> None:
        """Make this process the reader of `key` now, rather than at its first `get`: writers then send to it
        directly from their first item, without the registry's slow path."""
        box = mailbox()
        with box.lock:
            self._register(box, key)

    def queue(self, key: Hashable = None) -> QueueId:
        """The mailbox queue of `key`."""
        return (self._id, key)

    def _register(self, box: Mailbox, key: Hashable) -> None:
        """Make this process the reader of `key` on its first `get`, taking in what the registry held meanwhile."""
        queue = self.queue(key)
        if box.readers.get(queue) == box.address:
            return
        answer = ray.get(self._registry.register.remote(key, box.address))
        if isinstance(answer, Address):
            raise ChannelError(f"{self._where(key)} is read by {answer.name}; a key has one reader")
        box.readers[queue] = box.address
        box.inbox(queue).items.extendleft((pickle.loads(item), None) for item in reversed(answer))

    def qsize(self, key: Hashable = None) -> int:
        """The items in the queue of `key`; in a writing process, those of its own the reader has not taken."""
        box, queue = mailbox(), self.queue(key)
        with box.lock:
            reader = box.readers.get(queue)
            if reader is None:
                reader, backlog = ray.get(self._registry.lookup.remote(key))
                if reader is None:
                    return backlog
                box.readers[queue] = reader
            box.pump(time.monotonic())  # take in what has arrived: items, or the reader's credit
            if reader == box.address:
                return len(box.inbox(queue).items)
            return box.in_flight.get(queue, 0)

    def empty(self, key: Hashable = None) -> bool:
        return self.qsize(key) == 0

    def full(self, key: Hashable = None) -> bool:
        return 0 < self.maxsize <= self.qsize(key)

    def close(self) -> None:
        """Destroy the channel's registry and this process's items of it."""
        self._registry.close()
        mailbox().forget(self._id)

    def _where(self, key: Hashable) -> str:
        """How errors name `key`: built once per key and handle, not once per item."""
        where = self._wheres.get(key)
        if where is None:
            where = self._wheres[key] = (
                f"channel {self.name!r}" if key is None else f"channel {self.name!r} key {key!r}"
            )
        return where

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "maxsize": self.maxsize, "spin_s": self.spin_s, "_id": self._id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _wheres={}, _hosted=None)

    def __repr__(self) -> str:
        return f"Channel(name={self.name!r}, maxsize={self.maxsize})"


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout
