"""The reasoning tasks: `task.name` -> the task's config schema, whose `prompt_source` builds its problems, scored
by its reward (`task.reward`).

A new task is a module with its config dataclass (extending `ReasoningTaskConfig` with its own fields; its
`prompt_source` returns a `PromptSource`: train batches by step, a held-out set, `score` through `Scored`) and one
`TASKS.register` line here; `task.name` is checked against this registry before anything starts.
"""

from __future__ import annotations

from rlplace.reasoning.rewards import reward_function

from .arithmetic import ArithmeticTaskConfig
from .prompts import JsonlTaskConfig, PromptSource
from .registry import TASKS, ReasoningTaskConfig

TASKS.register("arithmetic", ArithmeticTaskConfig)
TASKS.register("jsonl", JsonlTaskConfig)

__all__ = ["TASKS", "ArithmeticTaskConfig", "JsonlTaskConfig", "ReasoningTaskConfig", "make_prompt_source"]


def make_prompt_source(task: ReasoningTaskConfig) -> PromptSource:
    """The problems of `task` (its schema builds them), scored by the reward `task.reward` names."""
    return task.prompt_source(reward_function(task.reward))
