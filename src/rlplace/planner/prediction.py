"""A step-time prediction, as both families' step models make it and the CLIs, the runs and the report read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prediction:
    step_s: float
    phases: dict[str, float]
    """Predicted seconds of each phase of the step (some overlap: the step is not their sum)."""
    throughput: dict[str, float]
    """The family's rate at that step time: {"env_steps_per_s": ...} or {"tokens_per_s": ...}."""
    assumptions: tuple[str, ...] = field(default=())
    """What the profile could not say, in words."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_s": self.step_s,
            "phases": self.phases,
            "throughput": self.throughput,
            "assumptions": list(self.assumptions),
        }
