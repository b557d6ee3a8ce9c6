"""Served groups: a group's method calls through the mailboxes instead of Ray, for loops that call every few ms.

A Ray actor call costs the caller far more than a hand-off through the mailboxes, a large share of a short generation
phase (benchmarks/handoff.py measures both). While a group is served (`with serve(env, rollout, actor): ...`), each
rank runs one long Ray call, `Worker._serve`, that takes the rank's calls from a channel key of its own and answers on
its group's key of the same channel (one channel, so one registry actor), in the order they were sent, as Ray would have
run them. Group calls look the same to the caller: they return a `GroupFuture`, `wait` and `wait_all` work on it (mixed
with Ray-backed futures), and a failure names group, rank and method. The Ray call stays the watchdog of the process: a
rank that dies closes its connection to the driver, which `wait` reports at once as the worker's death; a rank that
hangs misses the call's deadline.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from rlplace.scheduler.channel import Channel
from rlplace.scheduler.errors import ChannelError, WorkerError
from rlplace.scheduler.future import translate_ray_error
from rlplace.scheduler.mailbox import mailbox

if TYPE_CHECKING:
    from rlplace.scheduler.group import WorkerGroup
    from rlplace.scheduler.mailbox import _Peer
    from rlplace.scheduler.worker import Worker

READY = -1
"""The call id of the reply each rank sends before taking calls: it proves the loop runs, and makes the rank's
connection known to the driver, which can then tell its death."""


@dataclass(frozen=True)
class Call:
    id: int
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    rank: int
    call_id: int
    ok: bool
    value: Any
    """The method's result; or, when not ok, the exception it raised."""
    traceback: str = ""


def _calls_key(group: str, rank: int) -> tuple[str, str, int]:
    return ("calls", group, rank)


def _replies_key(group: str) -> tuple[str, str]:
    return ("replies", group)


def serve_calls(worker: Worker, channel: Channel) -> None:
    """The loop of `Worker._serve`: run the calls sent to this rank, in order, answering each, until sent None."""
    calls, replies = _calls_key(worker.group_name, worker.rank), _replies_key(worker.group_name)
    channel.subscribe(calls)  # before READY: the driver's first call then goes straight to this process
    channel.put(Reply(worker.rank, READY, True, None), key=replies)
    while (call := channel.get(key=calls)) is not None:
        try:
            reply = Reply(worker.rank, call.id, True, getattr(worker, call.method)(*call.args, **call.kwargs))
        except Exception as error:
            reply = Reply(worker.rank, call.id, False, error, traceback.format_exc())
        try:
            channel.put(reply, key=replies)
        except ChannelError:  # the driver is gone
            raise
        except Exception as error:  # a result or exception that cannot be pickled
            text = f"{call.method}() returned or raised what cannot be sent back: {type(error).__name__}: {error}"
            channel.put(Reply(worker.rank, call.id, False, RuntimeError(text), reply.traceback or text), key=replies)


@dataclass(eq=False)
class GroupServing:
    """The driver's end of one served group: its loops' Ray calls, their connections, and replies not yet claimed."""

    group: WorkerGroup
    channel: Channel
    refs: list[ray.ObjectRef]
    """Each rank's `_serve` call: it ends only when the rank stops serving or its process dies."""
    connections: dict[int, _Peer] = field(default_factory=dict)
    unreachable: set[int] = field(default_factory=set)
    """Ranks a call could not be sent to: their process is gone."""
    results: dict[tuple[int, int], Reply] = field(default_factory=dict)
    next_id: int = 0

    def send(self, method: str, ranks: tuple[int, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
        """Send `method(*args, **kwargs)` to `ranks`; the call's id, once per rank."""
        self.next_id += 1
        call = Call(self.next_id, method, args, kwargs)
        for rank in ranks:
            try:
                self.channel.put(call, key=_calls_key(self.group.name, rank))
            except ChannelError:  # the future reports it, as it would a rank that dies after the call
                self.unreachable.add(rank)
        return [self.next_id] * len(ranks)

    def take(self) -> None:
        """Move the replies that arrived into `results` (without waiting)."""
        box = mailbox()
        with box.lock:
            for reply, connection in box.take_arrived(self.channel.queue(_replies_key(self.group.name))):
                if reply.call_id == READY:
                    self.connections[reply.rank] = connection
                else:
                    self.results[reply.rank, reply.call_id] = reply

    def died(self, rank: int) -> bool:
        connection = self.connections.get(rank)
        return rank in self.unreachable or (connection is not None and connection.closed)

    def failed_loop(self, method: str) -> WorkerError | None:
        """The error of a rank whose loop ended (it raised, or Ray lost the process), if any did."""
        done, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        for ref in done:
            rank = self.refs.index(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayError as error:
                return translate_ray_error(self.group.name, rank, method, error)
            return WorkerError(self.group.name, rank, method, "was never answered: the rank stopped serving")
        return None

    def error(self, method: str, reply: Reply) -> WorkerError:
        """The failure a reply that is not ok reports."""
        cause = reply.value if isinstance(reply.value, BaseException) else None
        return WorkerError(self.group.name, reply.rank, method, "raised an exception", reply.traceback, cause)

    @staticmethod
    def wait(timeout: float) -> None:
        """Block until something arrives at this process's mailbox (a reply, of any group), at most `timeout`."""
        box = mailbox()
        with box.lock:
            box.pump(time.monotonic() + timeout)


@contextlib.contextmanager
def serve(*groups: WorkerGroup, timeout_s: float = 120.0) -> Iterator[None]:
    """Serve `groups` for the block: their calls go through the mailboxes (see the module's docstring).

    Starts each rank's loop and waits until all answer (at most `timeout_s`); on exit tells every loop to stop,
    without waiting: a Ray call made later, such as the group's termination, runs once the loop has returned."""
    channel = Channel.create("calls")
    servings = []
    try:
        for group in groups:
            channel.subscribe(_replies_key(group.name))
            refs = [worker._serve.remote(channel) for worker in group.workers]
            servings.append(GroupServing(group, channel, refs))
        _wait_ready(servings, timeout_s)
        for serving in servings:
            serving.group.serving = serving
        yield
    finally:
        for serving in servings:
            serving.group.serving = None
            for rank in range(serving.group.world_size):
                with contextlib.suppress(ChannelError):  # a rank that died needs no stop
                    channel.put(None, key=_calls_key(serving.group.name, rank))
        channel.close()


def _wait_ready(servings: list[GroupServing], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        for serving in servings:
            serving.take()
            error = serving.failed_loop("_serve")
            if error is not None:
                raise error
        if all(len(s.connections) == s.group.world_size for s in servings):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"served groups did not start their loops within {timeout_s:g} s")
        GroupServing.wait(0.1)
