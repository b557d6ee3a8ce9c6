"""A CUDA worker's device memory per timed method: what it peaked at inside the method and what it left allocated.

Out-of-memory is what collocation runs into first, so each `@timer` span of a worker whose process uses CUDA carries
`torch.cuda.max_memory_allocated` since the method began and `torch.cuda.memory_allocated` at its end; the timeline
sums them per device and phase (`Timeline.memory`), next to what the planner predicts. Bytes the caching allocator
holds but no tensor uses, and the CUDA context, are not counted: the same bytes the planner's memory model counts.
A process that never initialised CUDA (every cpu worker) pays one dict lookup per call.
"""

from __future__ import annotations

import sys
from types import ModuleType


def _cuda() -> ModuleType | None:
    """torch.cuda once this process has initialised CUDA, else None (torch is not imported here for it)."""
    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_initialized() else None


class DeviceMemory:
    """Peak-memory windows of the outermost timed method: a method timed inside another one does not reset the
    peak of the outer one."""

    __slots__ = ("depth",)

    def __init__(self) -> None:
        self.depth = 0

    def enter(self) -> None:
        cuda = _cuda()
        if cuda is not None and self.depth == 0:
            cuda.reset_peak_memory_stats()
        self.depth += 1

    def exit(self) -> tuple[int, int] | None:
        """(peak, resident) bytes, or None on a process without CUDA."""
        self.depth -= 1
        cuda = _cuda()
        return None if cuda is None else (cuda.max_memory_allocated(), cuda.memory_allocated())
