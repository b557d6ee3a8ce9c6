"""The reasoning tasks: `task.name` -> a prompt source built from the task's config section, with its reward.

A new task is a `PromptSource` (train batches by step, a held-out set, `score` through `Scored`) and one
`TASKS.register` line here; `task.name` is checked against this registry before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlplace.core.registry import Registry
from rlplace.reasoning.rewards import Reward, reward_function

from .arithmetic import ArithmeticTask
from .prompts import JsonlTask, PromptSource

if TYPE_CHECKING:
    from rlplace.reasoning.config import ReasoningTaskConfig

TASKS: Registry[Callable[[ReasoningTaskConfig, Reward], PromptSource]] = Registry("task.name")


@TASKS.register("arithmetic")
def arithmetic(task: ReasoningTaskConfig, reward: Reward) -> PromptSource:
    return ArithmeticTask(
        seed=task.data_seed,
        min_digits=task.min_digits,
        max_digits=task.max_digits,
        operations=task.operations,
        eval_size=task.eval_size,
        reward=reward,
    )


@TASKS.register("jsonl")
def jsonl(task: ReasoningTaskConfig, reward: Reward) -> PromptSource:
    assert task.train_path is not None, "ReasoningTaskConfig refuses task=jsonl without train_path"
    return JsonlTask(task.train_path, task.eval_path, seed=task.data_seed, eval_size=task.eval_size, reward=reward)


def make_prompt_source(task: ReasoningTaskConfig) -> PromptSource:
    """`task.name` picks the source, `task.reward` its reward; its problem streams are seeded by `task.data_seed`."""
    return TASKS[task.name](task, reward_function(task.reward))
