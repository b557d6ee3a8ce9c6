"""The phases of a reasoning step, as data that the runner switches by and the planner predicts from."""

from __future__ import annotations

PHASES = (
    ("sync_weights", frozenset({"actor", "rollout", "inference"})),
    ("generate_rollouts", frozenset({"rollout", "reward", "inference"})),
    ("training", frozenset({"actor"})),
)
"""The phases of a step and the components that hold device memory in each (the actor only collects finished
micro-batches while the others generate, so it may be offloaded then)."""
