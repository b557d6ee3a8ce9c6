"""The reasoning tasks: `task.name` -> the task's config schema, whose `prompt_source` builds its problems (scored
by the `reward` section, `rlplace.reasoning.rewards`).

A new task is a module with its config dataclass (extending `ReasoningTaskConfig` with its own fields; its
`prompt_source` returns a `PromptSource`: train batches by step and a held-out set) and one
`TASKS.register` line here; `task.name` is checked against this registry before anything starts.
"""

from __future__ import annotations

import math

from rlplace.core.errors import ConfigError

from .arithmetic import ArithmeticTaskConfig
from .dataset import DatasetTaskConfig
from .prompts import PromptSource
from .registry import TASKS, ReasoningTaskConfig

TASKS.register("arithmetic", ArithmeticTaskConfig)
TASKS.register("dataset", DatasetTaskConfig)

__all__ = [
    "TASKS",
    "ArithmeticTaskConfig",
    "DatasetTaskConfig",
    "ReasoningTaskConfig",
    "make_prompt_source",
    "steps_for_epochs",
]


def make_prompt_source(task: ReasoningTaskConfig) -> PromptSource:
    """The problems of `task` (its schema builds them)."""
    return task.prompt_source()


def steps_for_epochs(task: ReasoningTaskConfig, epochs: int) -> int:
    """The steps that walk `epochs` times over the task's training problems, `task.prompts_per_step` a step (the last
    one may reach into the next epoch). ConfigError naming runner.max_epochs for a task whose problems are made
    without end."""
    records = getattr(make_prompt_source(task), "num_train", None)
    if not isinstance(records, int):
        raise ConfigError(
            f"runner.max_epochs = {epochs} is invalid with task.name = {task.name!r}: its problems are made without "
            "end, so it has no epochs (valid: null, with runner.max_steps)"
        )
    return math.ceil(epochs * records / task.prompts_per_step)
