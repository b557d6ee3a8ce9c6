"""`GroupFuture`: the pending results of one method called on several ranks of a worker group.

Waiting rank by rank with `ray.get` would hang when one rank dies while the others block on it (in a collective, a
channel, a barrier). `wait()` instead returns as soon as any rank fails and translates Ray's exceptions into a
`WorkerError` naming group, rank and method, with the remote traceback. A call to a served group
(`rlplace.scheduler.serving`) is waited on the same way: its replies come through the driver's mailbox instead of Ray,
and a rank whose connection closes has died.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from rlplace.scheduler.errors import ChannelError, WorkerError, WorkerTimeout

if TYPE_CHECKING:
    from rlplace.scheduler.serving import GroupServing

_POLL_S = 0.5
"""Longest single `ray.wait`, so a waiting driver still reacts to Ctrl-C promptly."""
PEER_DEATH_GRACE_S = 5.0
"""How long a call that failed because its channel peer is gone waits for the peer's own call to report the death,
which is the error to name (Ray notices a dead actor within about a second)."""
MIXED_POLL_S = 0.001
"""Longest wait on either kind while both Ray-backed and served calls are pending: the driver cannot block on Ray
and on its mailbox at once."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class GroupFuture:
    """Results of `method` on `ranks`, in that order; one Ray ObjectRef per rank (`refs`), or for a served group
    (`rlplace.scheduler.serving`) one call id per rank."""

    def __init__(
        self,
        group: str,
        method: str,
        ranks: Sequence[int],
        refs: Sequence[Any],
        deadline_s: float | None = None,
        served: GroupServing | None = None,
    ) -> None:
        self.served = served
        self.group = group
        self.method = method
        self.ranks = tuple(ranks)
        self.refs = tuple(refs)
        self.deadline_s = deadline_s
        """How long `wait()` waits when given no timeout (the cluster's hang deadline); None waits for ever."""
        self._results: dict[int, Any] = {}
        self._error: WorkerError | None = None

    def done(self) -> bool:
        """True once every rank finished, or any rank failed (then `wait()` raises at once)."""
        _collect((self,), timeout=0)
        return self._error is not None or len(self._results) == len(self.refs)

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every called rank returned; their results, in the order of `ranks`.

        Raises `WorkerError` for the first rank found failed (exception or dead process), without waiting for the
        others, and `WorkerTimeout` (a `TimeoutError`) when `timeout` seconds, or without one the future's
        `deadline_s`, pass first.
        """
        return wait_all(self, timeout=timeout)[0]

    def _timeout(self, seconds: float, reason: str) -> WorkerTimeout:
        pending = [rank for i, rank in enumerate(self.ranks) if i not in self._results]
        return WorkerTimeout(self.group, pending[0], self.method, seconds, reason)

    def _pending(self) -> bool:
        return self._error is None and len(self._results) < len(self.refs)

    def _take_replies(self) -> None:
        """A served future: claim the replies that arrived; a rank whose process died fails it."""
        served = self.served
        assert served is not None
        served.take()
        for i, (rank, call_id) in enumerate(zip(self.ranks, self.refs, strict=True)):
            if i in self._results:
                continue
            reply = served.results.pop((rank, call_id), None)
            if reply is not None and reply.ok:
                self._results[i] = reply.value
            elif reply is not None:
                self._error = served.error(self.method, reply)
            elif served.died(rank):
                self._error = WorkerError(self.group, rank, self.method, "failed: the worker process died")
            if self._error is not None:
                return

    def __repr__(self) -> str:
        state = "failed" if self._error else f"{len(self._results)}/{len(self.refs)} done"
        return f"GroupFuture(group={self.group!r}, method={self.method!r}, ranks={list(self.ranks)}, {state})"


def translate_ray_error(group: str, rank: int, method: str, error: RayError) -> WorkerError:
    """Ray's exception for a failed call, as a WorkerError naming group, rank and method."""
    if isinstance(error, RayTaskError):
        traceback = _ANSI.sub("", str(error))
        return WorkerError(group, rank, method, "raised an exception", traceback, error.cause)
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


def wait_all(*futures: GroupFuture, timeout: float | None = None) -> list[list[Any]]:
    """Wait for several group calls together; their results, one list per future, in the order given.

    Calls that depend on each other (the two ends of a channel, both sides of a transfer) must be waited on
    together: waiting on them one after another hangs when a later one fails while an earlier one blocks on it.
    Raises `WorkerError` for the first failure found in any of them, and `WorkerTimeout` (naming the first call
    still pending) after `timeout` seconds, or without one the shortest `deadline_s` of the futures.
    """
    timeout, reason = _timeout_and_reason(timeout, futures)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        _collect(futures, timeout=_POLL_S if remaining is None else min(_POLL_S, remaining))
        failed = next((future._error for future in futures if future._error is not None), None)
        if failed is not None:
            raise _root_cause(futures, failed)
        if all(len(future._results) == len(future.refs) for future in futures):
            return [[future._results[i] for i in range(len(future.refs))] for future in futures]
        if remaining == 0.0:
            raise next(future for future in futures if not future.done())._timeout(timeout, reason)


def _root_cause(futures: Sequence[GroupFuture], error: WorkerError) -> WorkerError:
    """`error`, unless it is a symptom: a worker whose channel peer is gone failed because that peer died, so wait
    up to `PEER_DEATH_GRACE_S` for one of the calls to report a dead process, and name that one."""
    if not isinstance(error.cause, ChannelError):
        return error
    deadline = time.monotonic() + PEER_DEATH_GRACE_S
    while True:
        dead = [f._error for f in futures if f._error is not None and f._error.cause is None]
        pending = any(f._error is None and len(f._results) < len(f.refs) for f in futures)
        if dead or not pending or time.monotonic() > deadline:
            return next((d for d in dead if not isinstance(d, WorkerTimeout)), error)
        _collect(futures, timeout=0.1)


def _collect(futures: Sequence[GroupFuture], timeout: float) -> None:
    """Fetch every result of `futures` that is ready, waiting up to `timeout` for the first one."""
    served = [future for future in futures if future.served is not None and future._pending()]
    by_ray = [future for future in futures if future.served is None]
    if served:
        for future in served:
            future._take_replies()
        pending = [future for future in served if future._pending()]
        if pending and timeout > 0:
            ray_pending = any(future._pending() for future in by_ray)
            mailbox_of = pending[0].served
            assert mailbox_of is not None
            mailbox_of.wait(min(timeout, MIXED_POLL_S) if ray_pending else timeout)
            for future in pending:
                future._take_replies()
            if all(future._pending() for future in pending) and not ray_pending:
                _check_loops(pending)
        timeout = 0.0
    _collect_ray(by_ray, timeout)


def _check_loops(futures: Sequence[GroupFuture]) -> None:
    """Fail a served future whose group's loop ended under it (no reply will ever come); checked only when a wait
    passed with no reply, since it asks Ray."""
    for future in futures:
        assert future.served is not None
        future._error = future.served.failed_loop(future.method)


def _collect_ray(futures: Sequence[GroupFuture], timeout: float) -> None:
    """The Ray-backed part of `_collect`.

    One `ray.wait` over the refs of all of them: a step's calls finish close together, and each Ray call the driver
    makes between them is time the step waits."""
    owners = {
        ref: (future, i)
        for future in futures
        if future._error is None
        for i, ref in enumerate(future.refs)
        if i not in future._results
    }
    if not owners:
        return
    ready, _ = ray.wait(list(owners), num_returns=1, timeout=timeout)
    if ready:
        ready, _ = ray.wait(list(owners), num_returns=len(owners), timeout=0)
    errors: dict[GroupFuture, dict[int, RayError]] = {}
    for ref in ready:  # fetch every ready result, so that no failure goes unretrieved (Ray would log it)
        future, index = owners[ref]
        try:
            future._results[index] = ray.get(ref)
        except RayError as error:
            errors.setdefault(future, {})[index] = error
    for future, failed in errors.items():
        first = min(failed)
        future._error = translate_ray_error(future.group, future.ranks[first], future.method, failed[first])


def _timeout_and_reason(timeout: float | None, futures: Sequence[GroupFuture]) -> tuple[float | None, str]:
    """The wait's timeout (the caller's, else the shortest deadline of the futures) and what it stands for."""
    if timeout is not None:
        return timeout, "the caller's timeout"
    deadlines = [future.deadline_s for future in futures if future.deadline_s is not None]
    if not deadlines:
        return None, ""
    return min(deadlines), "hung, or slower than the hang deadline runner.hang_timeout_s allows"
