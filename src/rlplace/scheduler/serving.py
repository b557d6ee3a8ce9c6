"""Served groups: a group's method calls through the mailboxes instead of Ray, for loops that call every few ms.

A Ray actor call costs the caller far more than a hand-off through the mailboxes, a large share of a short generation
phase (benchmarks/handoff.py measures both). While a group is served (`with serve(env, rollout, actor): ...`), each
rank runs one long Ray call, `Worker._serve`, that takes the rank's calls from a channel key of its own and answers on
its group's key of the same channel (one channel, so one registry), in the order they were sent, as Ray would have
run them. Group calls look the same to the caller: `ServedCalls` is the group's call transport (`transport.py`) for
the block, so calls return a `GroupFuture`, `wait` and `wait_all` work on it (mixed with Ray-backed futures), and a
failure names group, rank and method. The Ray call stays the watchdog of the process: a
rank that dies closes its connection to the driver, which `wait` reports at once as the worker's death; a rank that
hangs misses the call's deadline.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import ray

from rlplace.scheduler.channel import Channel
from rlplace.scheduler.errors import ChannelError, WorkerError
from rlplace.scheduler.mailbox import mailbox
from rlplace.scheduler.transport import CallTransport, RankCall, translate_ray_error

if TYPE_CHECKING:
    from rlplace.scheduler.group import WorkerGroup
    from rlplace.scheduler.mailbox import _Peer
    from rlplace.scheduler.worker import Worker

MIXED_POLL_S = 0.001
"""Longest wait on the mailbox while calls of another kind (Ray calls) are pending too: the driver cannot block on
Ray and on its mailbox at once, so it polls both."""
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


class ServedCall(RankCall):
    """A rank's call sent through the mailboxes: the reply to `call_id` from that rank settles it."""

    __slots__ = ("call_id", "calls")

    def __init__(self, calls: ServedCalls, rank: int, method: str, call_id: int) -> None:
        super().__init__(calls.group, rank, method)
        self.calls = calls
        self.call_id = call_id

    @classmethod
    def collect(cls, calls: Sequence[RankCall], timeout: float, others_pending: bool) -> None:
        """Claim the replies that arrived; wait on the driver's mailbox (any group's reply wakes it) when none did.
        A rank whose connection closed has died; when a whole wait passes without a reply, a rank whose loop ended
        (it raised, or Ray lost the process) fails the calls of its group, since no reply will ever come."""
        served = cast("Sequence[ServedCall]", calls)
        transports = list(dict.fromkeys(call.calls for call in served))
        if _settle(served, transports) or timeout <= 0:
            return
        ServedCalls.wait(min(timeout, MIXED_POLL_S) if others_pending else timeout)
        if _settle(served, transports) or others_pending:
            return
        ended = {transport: transport.ended_loop() for transport in transports}
        for call in served:
            if (loop := ended[call.calls]) is not None:
                call.error = call.calls.loop_error(call.method, *loop)


def _settle(calls: Sequence[ServedCall], transports: Sequence[ServedCalls]) -> int:
    """Settle the calls whose reply arrived or whose rank died; how many."""
    for transport in transports:
        transport.take()
    settled = 0
    for call in calls:
        if call.done or call.error is not None:  # a future passed twice
            continue
        transport = call.calls
        reply = transport.results.pop((call.rank, call.call_id), None)
        if reply is not None and reply.ok:
            call.value = reply.value
            call.done = True
        elif reply is not None:
            call.error = transport.error(call.method, reply)
        elif transport.died(call.rank):
            call.error = WorkerError(transport.group, call.rank, call.method, "failed: the worker process died")
        else:
            continue
        settled += 1
    return settled


@dataclass(eq=False)
class ServedCalls(CallTransport):
    """The driver's end of one served group: its loops' Ray calls, their connections, and replies not yet claimed."""

    group: str
    channel: Channel
    refs: list[ray.ObjectRef]
    """Each rank's `_serve` call: it ends only when the rank stops serving or its process dies."""
    connections: dict[int, _Peer] = field(default_factory=dict)
    unreachable: set[int] = field(default_factory=set)
    """Ranks a call could not be sent to: their process is gone."""
    results: dict[tuple[int, int], Reply] = field(default_factory=dict)
    next_id: int = 0

    def send(self, method: str, ranks: Sequence[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[RankCall]:
        """Send `method(*args, **kwargs)` to `ranks` on their channel keys, one call id for all of them."""
        self.next_id += 1
        call = Call(self.next_id, method, args, kwargs)
        handles: list[RankCall] = []
        for rank in ranks:
            try:
                self.channel.put(call, key=_calls_key(self.group, rank))
            except ChannelError:  # the future reports it, as it would a rank that dies after the call
                self.unreachable.add(rank)
            handles.append(ServedCall(self, rank, method, call.id))
        return handles

    def take(self) -> None:
        """Move the replies that arrived into `results` (without waiting)."""
        box = mailbox()
        with box.lock:
            for reply, connection in box.take_arrived(self.channel.queue(_replies_key(self.group))):
                if reply.call_id == READY:
                    self.connections[reply.rank] = connection
                else:
                    self.results[reply.rank, reply.call_id] = reply

    def died(self, rank: int) -> bool:
        connection = self.connections.get(rank)
        return rank in self.unreachable or (connection is not None and connection.closed)

    def ended_loop(self) -> tuple[int, ray.exceptions.RayError | None] | None:
        """A rank whose loop ended, if any did, with Ray's error when it raised or Ray lost the process (asks Ray)."""
        done, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as error:
                return self.refs.index(ref), error
            return self.refs.index(ref), None
        return None

    def loop_error(self, method: str, rank: int, error: ray.exceptions.RayError | None) -> WorkerError:
        """The failure of a call to this group, once rank `rank`'s loop ended (`ended_loop`)."""
        if error is not None:
            return translate_ray_error(self.group, rank, method, error)
        return WorkerError(self.group, rank, method, "was never answered: the rank stopped serving")

    def error(self, method: str, reply: Reply) -> WorkerError:
        """The failure a reply that is not ok reports."""
        cause = reply.value if isinstance(reply.value, BaseException) else None
        return WorkerError(self.group, reply.rank, method, "raised an exception", reply.traceback, cause)

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
    servings: list[ServedCalls] = []
    try:
        for group in groups:
            channel.subscribe(_replies_key(group.name))
            refs = [worker.call.remote("_serve", (channel,), {}) for worker in group.workers]
            servings.append(ServedCalls(group.name, channel, refs))
        _wait_ready(servings, timeout_s)
        for group, serving in zip(groups, servings, strict=True):
            group.transport = serving
        yield
    finally:
        for group, serving in zip(groups, servings, strict=False):
            group.transport = group.ray_calls
            for rank in range(len(serving.refs)):
                with contextlib.suppress(ChannelError):  # a rank that died needs no stop
                    channel.put(None, key=_calls_key(serving.group, rank))
        channel.close()


def _wait_ready(servings: list[ServedCalls], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        for serving in servings:
            serving.take()
            loop = serving.ended_loop()
            if loop is not None:
                raise serving.loop_error("_serve", *loop)
        if all(len(s.connections) == len(s.refs) for s in servings):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"served groups did not start their loops within {timeout_s:g} s")
        ServedCalls.wait(0.1)
