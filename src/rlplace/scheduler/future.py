"""`GroupFuture`: the pending results of one method called on several ranks of a worker group.

Waiting rank by rank with `ray.get` would hang when one rank dies while the others block on it (in a collective, a
channel, a barrier). `wait()` instead returns as soon as any rank fails and translates Ray's exceptions into a
`WorkerError` naming group, rank and method, with the remote traceback. A future holds one handle per rank
(`transport.RankCall`) and waits through them, whichever transport sent the call: Ray actor calls, or a served group's
mailboxes (`serving.py`); `wait_all` waits on futures of both kinds at once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import Any

from rlplace.scheduler.errors import ChannelError, WorkerError, WorkerTimeout
from rlplace.scheduler.transport import RankCall

_POLL_S = 0.5
"""Longest single wait, so a waiting driver still reacts to Ctrl-C promptly."""
PEER_DEATH_GRACE_S = 5.0
"""How long a call that failed because its channel peer is gone waits for the peer's own call to report the death,
which is the error to name (several times what Ray takes to notice a dead actor, tests/faults measure it)."""


class GroupFuture:
    """Results of `method` on `ranks`, in that order: one handle per rank (`calls`), from the group's transport."""

    def __init__(
        self,
        group: str,
        method: str,
        calls: Sequence[RankCall],
        deadline_s: float | None = None,
        processes: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.group = group
        self.method = method
        self.calls = tuple(calls)
        self.ranks = tuple(call.rank for call in self.calls)
        self.deadline_s = deadline_s
        """How long `wait()` waits when given no timeout (the cluster's hang deadline); None waits for ever."""
        self._error: WorkerError | None = None
        """The first failure found; fixed from then on."""
        self._processes = processes
        """Each rank's (host, process id), when the group knows them (`WorkerGroup.processes`)."""

    def done(self) -> bool:
        """True once every rank finished, or any rank failed (then `wait()` raises at once)."""
        _collect((self,), timeout=0)
        return self._error is not None or all(call.done for call in self.calls)

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every called rank returned; their results, in the order of `ranks`.

        Raises `WorkerError` for the first rank found failed (exception or dead process), without waiting for the
        others, and `WorkerTimeout` (a `TimeoutError`) when `timeout` seconds, or without one the future's
        `deadline_s`, pass first.
        """
        return wait_all(self, timeout=timeout)[0]

    def _timeout(self, seconds: float, reason: str) -> WorkerTimeout:
        """The timeout, naming this future's stopped rank if it has one, else its first pending rank."""
        pending = [call.rank for call in self.calls if not call.done]
        stopped = self._stopped_rank()
        if stopped is not None:
            return WorkerTimeout(self.group, stopped, self.method, seconds, f"{reason}; its process is stopped")
        return WorkerTimeout(self.group, pending[0], self.method, seconds, reason)

    def _stopped_rank(self) -> int | None:
        """A pending rank whose process (on this host) is stopped (SIGSTOP, a debugger), if any."""
        for call in self.calls:
            if not call.done and call.rank < len(self._processes) and process_stopped(*self._processes[call.rank]):
                return call.rank
        return None

    def _pending(self) -> bool:
        return self._error is None and not all(call.done for call in self.calls)

    def _note_failure(self) -> None:
        """Keep the first failed rank (in the order of `ranks`) of the first collection that found one."""
        if self._error is None:
            self._error = next((call.error for call in self.calls if call.error is not None), None)

    def __repr__(self) -> str:
        finished = sum(call.done for call in self.calls)
        state = "failed" if self._error else f"{finished}/{len(self.calls)} done"
        return f"GroupFuture(group={self.group!r}, method={self.method!r}, ranks={list(self.ranks)}, {state})"


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
        if all(call.done for future in futures for call in future.calls):
            return [[call.value for call in future.calls] for future in futures]
        if remaining == 0.0:
            # A call that waits on a stopped peer (a broadcast to it, a channel it feeds) is pending too: blame the
            # stopped process, the one that does not answer, before the calls waiting for it.
            pending = [future for future in futures if not future.done()]
            stopped = next((future for future in pending if future._stopped_rank() is not None), pending[0])
            raise stopped._timeout(timeout, reason)


def _root_cause(futures: Sequence[GroupFuture], error: WorkerError) -> WorkerError:
    """`error`, unless it is a symptom: a worker whose channel peer is gone failed because that peer died, so wait
    up to `PEER_DEATH_GRACE_S` for one of the calls to report a dead process, and name that one."""
    if not isinstance(error.cause, ChannelError):
        return error
    deadline = time.monotonic() + PEER_DEATH_GRACE_S
    while True:
        dead = [f._error for f in futures if f._error is not None and f._error.cause is None]
        pending = any(f._pending() for f in futures)
        if dead or not pending or time.monotonic() > deadline:
            return next((d for d in dead if not isinstance(d, WorkerTimeout)), error)
        _collect(futures, timeout=0.1)


def _collect(futures: Sequence[GroupFuture], timeout: float) -> None:
    """Settle every pending call of `futures` whose outcome is there, waiting up to `timeout` for the first one.

    The calls of one kind (one handle class) are collected together; while several kinds are pending, each kind is
    told so and only polls or waits briefly, since the driver cannot block on all of them at once."""
    kinds: dict[type[RankCall], list[RankCall]] = {}
    for future in futures:
        if future._error is None:
            for call in future.calls:
                if not call.done and call.error is None:
                    kinds.setdefault(type(call), []).append(call)
    others_pending = len(kinds) > 1
    for kind, calls in kinds.items():
        kind.collect(calls, timeout, others_pending)
    for future in futures:
        future._note_failure()


def _timeout_and_reason(timeout: float | None, futures: Sequence[GroupFuture]) -> tuple[float | None, str]:
    """The wait's timeout (the caller's, else the shortest deadline of the futures) and what it stands for."""
    if timeout is not None:
        return timeout, "the caller's timeout"
    deadlines = [future.deadline_s for future in futures if future.deadline_s is not None]
    if not deadlines:
        return None, ""
    return min(deadlines), "hung, or slower than the hang deadline runner.hang_timeout_s allows"


def process_stopped(host: str, pid: int) -> bool:
    """Whether process `pid` on `host` is stopped (SIGSTOP, a debugger); False for another host's process or one
    that is gone. psutil, as the session's reaping uses it (Ray vendors it; `import ray` puts it on the path)."""
    import psutil

    if host != socket.gethostname():
        return False
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False
