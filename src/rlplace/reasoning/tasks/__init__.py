"""The reasoning tasks: `task.name` -> the task's config schema, whose `prompt_source` builds its problems (scored
by the `reward` section, `rlplace.reasoning.rewards`).

A new task is a module with its config dataclass (extending `ReasoningTaskConfig` with its own fields; its
`prompt_source` returns a `PromptSource`: train batches by step and a held-out set) and one
`TASKS.register` line here; `task.name` is checked against this registry before anything starts.
"""

from __future__ import annotations

from .arithmetic import ArithmeticTaskConfig
from .dataset import DatasetTaskConfig
from .prompts import PromptSource
from .registry import TASKS, ReasoningTaskConfig

TASKS.register("arithmetic", ArithmeticTaskConfig)
TASKS.register("dataset", DatasetTaskConfig)

__all__ = ["TASKS", "ArithmeticTaskConfig", "DatasetTaskConfig", "ReasoningTaskConfig", "make_prompt_source"]


def make_prompt_source(task: ReasoningTaskConfig) -> PromptSource:
    """The problems of `task` (its schema builds them)."""
    return task.prompt_source()
