"""The prompt source of a reasoning task, built from its config section."""

from __future__ import annotations

from rlplace.reasoning.config import ReasoningTaskConfig

from .arithmetic import ArithmeticTask
from .prompts import JsonlTask, PromptSource


def make_prompt_source(task: ReasoningTaskConfig) -> PromptSource:
    """`task.name` picks the source; its problem streams are seeded by `task.data_seed`."""
    if task.name == "arithmetic":
        return ArithmeticTask(
            seed=task.data_seed,
            min_digits=task.min_digits,
            max_digits=task.max_digits,
            operations=task.operations,
            eval_size=task.eval_size,
        )
    if task.name == "jsonl":
        assert task.train_path is not None, "ReasoningTaskConfig refuses task=jsonl without train_path"
        return JsonlTask(task.train_path, task.eval_path, seed=task.data_seed, eval_size=task.eval_size)
    raise ValueError(f"task.name = {task.name!r} is not a reasoning task")
