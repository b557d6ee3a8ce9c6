"""`@timer("name")`: time a worker method on every rank, for metrics and the per-device timeline.

Durations alone cannot show whether two components overlapped, so each call becomes a `Span` (rlplace.metrics.
timeline) with wall-clock start and end (`time.time()`, comparable across processes on one machine and, with
synchronised clocks, across nodes); on a CUDA worker the span also carries the process's peak and resident device
memory (`DeviceMemory`). Spans stay in the worker until the driver drains them with
`group.pop_timings().wait()`; nothing is sent per call.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def timer(name: str) -> Callable[[F], F]:
    """Record every call of the decorated worker method under `name`, also when it raises."""

    def decorate(method: F) -> F:
        if inspect.iscoroutinefunction(method):
            raise TypeError(f"@timer({name!r}) on {method.__qualname__}: worker methods are timed only when sync")

        @functools.wraps(method)
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            self._device_memory.enter()
            start, tick = time.time(), time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                self._record_span(name, start, time.perf_counter() - tick, self._device_memory.exit())

        return timed  # type: ignore[return-value]

    return decorate
