"""The scheduler's own exceptions, so callers catch rlplace errors rather than Ray's internals.

Ray reports a failed remote call as one of several exception types whose messages name Ray tasks and actor ids. The
scheduler translates them into errors that name what the user launched: the group, the rank and the method.
"""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The Ray cluster cannot host the declared nodes and devices, or Ray could not be started or reached."""


class WorkerError(RuntimeError):
    """A worker method failed or its process died; the message names group, rank and method.

    `cause` is the exception raised inside the worker when there was one (None when the process died), and
    `remote_traceback` is the worker-side traceback as text.
    """

    def __init__(
        self,
        group: str,
        rank: int,
        method: str,
        reason: str,
        remote_traceback: str = "",
        cause: BaseException | None = None,
    ) -> None:
        message = f"group {group!r} rank {rank}: {method}() {reason}"
        if remote_traceback:
            message += f"\n\nRemote traceback (group {group!r} rank {rank}):\n{remote_traceback}"
        super().__init__(message)
        self.group = group
        self.rank = rank
        self.method = method
        self.remote_traceback = remote_traceback
        self.cause = cause


class WorkerTimeout(WorkerError, TimeoutError):
    """A worker method did not finish within its deadline: the process is hung (stopped, deadlocked) or far slower
    than the deadline allows. Names the first rank still pending."""

    def __init__(self, group: str, rank: int, method: str, seconds: float, reason: str) -> None:
        super().__init__(group, rank, method, f"did not finish within {round(seconds, 1):g} s ({reason})")
        self.seconds = seconds


class ChannelTimeout(TimeoutError):
    """A channel `put` found the queue full, or a `get` found it empty, for longer than the timeout."""

    def __init__(self, channel: str, key: object, operation: str, timeout: float) -> None:
        where = f"channel {channel!r}" if key is None else f"channel {channel!r} key {key!r}"
        super().__init__(f"{operation} on {where} timed out after {timeout:g} s")
        self.channel = channel
        self.key = key
        self.operation = operation
        self.timeout = timeout


class ChannelError(RuntimeError):
    """A channel cannot deliver: the process at the other end is gone, or a key is used against its rules (a second
    reader, a second writer of a bounded key). The message names the channel, the key and the peer."""
