"""Call transports: how a group's method call reaches its ranks, and how each rank's outcome comes back.

A `CallTransport` sends `method(*args, **kwargs)` to some ranks of one group and returns one `RankCall` per rank: a
handle that settles once with the rank's result, or with a `WorkerError` naming group, rank and method. A
`WorkerGroup` sends every call through its current transport: `RayCalls` (one Ray actor call per rank) unless the
group is served (`serving.ServedCalls`, through the mailboxes). A `GroupFuture` waits on its handles without knowing
how they travel.

Handles of one kind are collected together, by their class's `collect`: one `ray.wait` covers every pending Ray call
of a step (each Ray call the driver makes between them is time the step waits), and one wait on the driver's mailbox
every served call. The driver cannot block on two kinds at once, so `collect` is told when calls of another kind are
pending too, and then blocks briefly or not at all.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, cast

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError, RayError, RayTaskError

from rlplace.scheduler.errors import WorkerError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RankCall:
    """One rank's share of a group call: pending until its kind's `collect` settles it, then `done` (with `value`)
    or failed (`error`)."""

    __slots__ = ("done", "error", "group", "method", "rank", "value")

    def __init__(self, group: str, rank: int, method: str) -> None:
        self.group = group
        self.rank = rank
        self.method = method
        self.done = False
        self.value: Any = None
        self.error: WorkerError | None = None

    @property
    def settled(self) -> bool:
        return self.done or self.error is not None

    @classmethod
    def collect(cls, calls: Sequence[RankCall], timeout: float, others_pending: bool) -> None:
        """Settle those of `calls` (pending calls of this class) whose outcome is there, waiting up to `timeout`
        seconds for the first when none is; `others_pending`: calls of another kind are waited on too, so this one
        must not block for long."""
        raise NotImplementedError


class CallTransport(ABC):
    """How one group's calls travel to its ranks."""

    @abstractmethod
    def send(self, method: str, ranks: Sequence[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[RankCall]:
        """Call `method(*args, **kwargs)` on `ranks`, after every call sent before to the same rank; one handle per
        rank, in the order of `ranks`."""


class RayCall(RankCall):
    """A rank's call made as a Ray actor call: `ref` is its result."""

    __slots__ = ("ref",)

    def __init__(self, group: str, rank: int, method: str, ref: ray.ObjectRef) -> None:
        super().__init__(group, rank, method)
        self.ref = ref

    @classmethod
    def collect(cls, calls: Sequence[RankCall], timeout: float, others_pending: bool) -> None:
        """One `ray.wait` over all of them, then every ready result fetched, so that no failure goes unretrieved
        (Ray would log it). Next to other kinds, only polls: their wait is the one that blocks."""
        owners = {call.ref: call for call in cast("Sequence[RayCall]", calls)}
        ready, _ = ray.wait(list(owners), num_returns=1, timeout=0.0 if others_pending else timeout)
        if ready and len(owners) > 1:
            ready, _ = ray.wait(list(owners), num_returns=len(owners), timeout=0)
        for ref in ready:
            call = owners[ref]
            try:
                call.value = ray.get(ref)
                call.done = True
            except RayError as error:
                call.error = translate_ray_error(call.group, call.rank, call.method, error)


class RayCalls(CallTransport):
    """A group's calls as Ray actor calls, one per rank (`Host.call`): Ray runs each actor's calls in the order sent."""

    def __init__(self, group: str, workers: Sequence[ActorHandle]) -> None:
        self.group = group
        self.workers = workers

    def send(self, method: str, ranks: Sequence[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[RankCall]:
        workers, group = self.workers, self.group
        return [RayCall(group, rank, method, workers[rank].call.remote(method, args, kwargs)) for rank in ranks]

    def track(self, method: str, ranks: Sequence[int], refs: Sequence[ray.ObjectRef]) -> list[RankCall]:
        """Handles for Ray calls made otherwise (a rank's start, `Host.become`), reported as `method`."""
        return [RayCall(self.group, rank, method, ref) for rank, ref in zip(ranks, refs, strict=True)]


def translate_ray_error(group: str, rank: int, method: str, error: RayError) -> WorkerError:
    """Ray's exception for a failed call, as a WorkerError naming group, rank and method."""
    if isinstance(error, RayTaskError):
        traceback = _ANSI.sub("", str(error))
        reason = "failed: the worker's __init__ raised" if method == "__init__" else "raised an exception"
        return WorkerError(group, rank, method, reason, traceback, error.cause)
    if isinstance(error, RayActorError) and error.actor_init_failed:
        traceback = _ANSI.sub("", str(error))
        return WorkerError(group, rank, method, "failed: the worker's __init__ raised", traceback)
    if isinstance(error, RayActorError):
        detail = _ANSI.sub("", str(error)).strip().splitlines()
        reason = "failed: the worker process died"
        if detail:
            reason += f" ({' '.join(line.strip() for line in detail[:2])})"
        return WorkerError(group, rank, method, reason)
    return WorkerError(group, rank, method, f"failed in Ray: {type(error).__name__}: {error}")
