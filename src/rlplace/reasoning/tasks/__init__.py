"""The reasoning tasks: `task.name` -> the task's config schema, whose `prompt_source` builds its problems (scored
by the `reward` section, `rlplace.reasoning.rewards`).

A new task is a module with its config dataclass (extending `ReasoningTaskConfig` with its own fields; its
`prompt_source` returns a `PromptSource`: train batches by step and a held-out set) and one
`TASKS.register` line here; `task.name` is checked against this registry before anything starts.
"""

from __future__ import annotations

import math
from typing import Any

from rlplace.core.errors import ConfigError

from .arithmetic import ArithmeticTaskConfig
from .dataset import DatasetTask, DatasetTaskConfig
from .prompts import Problem, PromptSource, encode_prompts, render_prompts
from .registry import TASKS, ReasoningTaskConfig

TASKS.register("arithmetic", ArithmeticTaskConfig)
TASKS.register("dataset", DatasetTaskConfig)

__all__ = [
    "TASKS",
    "ArithmeticTaskConfig",
    "DatasetTaskConfig",
    "ReasoningTaskConfig",
    "count_truncated",
    "drop_overlong",
    "prompt_room",
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


def drop_overlong(
    source: PromptSource, task: ReasoningTaskConfig, tokenizer: Any, context: int, max_new_tokens: int
) -> tuple[int, int] | None:
    """With task.filter_overlong_prompts, drop from `source` the problems whose prompt, as the model is asked it
    (`encode_prompts`), is longer than `prompt_room` allows; how many were dropped from training and from the
    held-out set. None when the task does not filter (every prompt must then fit: `check_prompt_lengths`).
    Every process that makes the task's problems drops the same ones: the driver, which checks, and each rollout
    rank."""
    if not (isinstance(source, DatasetTask) and getattr(task, "filter_overlong_prompts", False)):
        return None

    def lengths(problems: list[Problem]) -> list[int]:
        return [len(ids) for ids in encode_prompts(tokenizer, problems, task)]

    return source.keep_fitting(lengths, prompt_room(task, context, max_new_tokens))


def count_truncated(source: PromptSource, task: ReasoningTaskConfig, tokenizer: Any) -> tuple[int, int] | None:
    """With task.truncation cutting prompts, how many training and held-out prompts of `source` are longer than
    task.max_prompt_length, and so are cut; None when the task does not cut them. Training prompts are counted for a
    source that holds a known number of them (`num_train`: a data file's records), else 0."""
    if getattr(task, "truncation", "error") == "error":
        return None
    limit = task.max_prompt_length  # type: ignore[attr-defined]  # the schema requires it with truncation

    def cut(problems: list[Problem]) -> int:
        return sum(len(ids) > limit for ids in render_prompts(tokenizer, problems, task))

    records = getattr(source, "num_train", None)
    return (cut(source.train_batch(0, records)) if isinstance(records, int) else 0), cut(source.eval_set())


def prompt_room(task: ReasoningTaskConfig, context: int, max_new_tokens: int) -> int:
    """The most tokens a prompt may have: what the model's `context` leaves for `max_new_tokens` after it, and no
    more than task.max_prompt_length where the task has one."""
    room = context - max_new_tokens
    limit = getattr(task, "max_prompt_length", None)
    return room if limit is None else min(room, limit)
