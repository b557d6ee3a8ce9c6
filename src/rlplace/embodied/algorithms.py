"""The embodied algorithms and advantage estimators: `algorithm.name` and `algorithm.adv_estimator` -> the function
that implements them, by import path.

A new advantage estimator is a function `(trajectory, algorithm section) -> (advantages, returns)` and one
`ADVANTAGE_ESTIMATORS.register` line here. Pure Python: configs are checked against these registries before Ray or
torch load; the functions (torch) are imported where they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlplace.core.registry import Registry, load


@dataclass(frozen=True)
class ByPath:
    """An entry whose code needs torch, named by `package.module:function` and imported by `load` where it runs."""

    function: str

    def load(self) -> Any:
        return load(self.function)


ALGORITHMS: Registry[ByPath] = Registry("algorithm.name")
"""`algorithm.name` -> its update over the actor's batch, `(model, optimizer, batch, algorithm section, generator,
allreduce_grads, shard) -> stats` (`rlplace.embodied.ppo.ppo_update`)."""
ALGORITHMS.register("ppo", ByPath("rlplace.embodied.ppo:ppo_update"))

ADVANTAGE_ESTIMATORS: Registry[ByPath] = Registry("algorithm.adv_estimator")
"""`algorithm.adv_estimator` -> its estimator (`rlplace.embodied.advantages.compute_advantages` dispatches by it)."""
ADVANTAGE_ESTIMATORS.register("gae", ByPath("rlplace.embodied.advantages:gae"))
ADVANTAGE_ESTIMATORS.register("group_norm", ByPath("rlplace.embodied.advantages:group_norm"))
