"""A unit of work's measured seconds at a few sizes, read at any size."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Curve:
    """Seconds of one call at sampled sizes (increasing). Between samples the seconds are interpolated linearly;
    beyond the largest, the last segment's slope goes on (work grows linearly once the fixed cost is paid)."""

    sizes: tuple[float, ...]
    seconds: tuple[float, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Curve:
        return cls(tuple(float(s) for s in data["sizes"]), tuple(float(s) for s in data["seconds"]))

    def at(self, size: float) -> float:
        if len(self.sizes) == 1 or size <= self.sizes[0]:
            return self.seconds[0]
        i = min(bisect.bisect_left(self.sizes, size), len(self.sizes) - 1)
        (x0, x1), (y0, y1) = self.sizes[i - 1 : i + 1], self.seconds[i - 1 : i + 1]
        return max(y0 + (y1 - y0) * (size - x0) / (x1 - x0), 0.0)
