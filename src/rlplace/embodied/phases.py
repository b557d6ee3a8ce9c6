"""The phases of an embodied step, as data that the runner switches by and the planner predicts from."""

from __future__ import annotations

PHASES = (
    ("sync_weights", frozenset({"actor", "rollout"})),
    ("generate_rollouts", frozenset({"env", "rollout"})),
    ("training", frozenset({"actor"})),
)
"""The phases of a step and the components that hold device memory in each (the actor only collects CPU
trajectories while generating, so it may be offloaded then)."""
