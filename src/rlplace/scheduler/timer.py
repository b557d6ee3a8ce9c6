"""`@timer("name")`: time a worker method on every rank, for metrics and the per-device timeline.

Durations alone cannot show whether two components overlapped, so each call records wall-clock start and end
(`time.time()`, comparable across processes on one machine and, with synchronised clocks, across nodes). Records
stay in the worker until the driver drains them with `group.pop_timings().wait()`; nothing is sent per call.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class TimingRecord(TypedDict):
    """One timed call of a worker method on one rank."""

    name: str
    group: str
    rank: int
    start: float
    end: float
    duration: float


def timer(name: str) -> Callable[[F], F]:
    """Record every call of the decorated worker method (sync or async) under `name`, also when it raises."""

    def decorate(method: F) -> F:
        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def timed_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                start, tick = time.time(), time.perf_counter()
                try:
                    return await method(self, *args, **kwargs)
                finally:
                    self._record_timing(name, start, time.perf_counter() - tick)

            return timed_async  # type: ignore[return-value]

        @functools.wraps(method)
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            start, tick = time.time(), time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                self._record_timing(name, start, time.perf_counter() - tick)

        return timed  # type: ignore[return-value]

    return decorate
