"""Rewards of reasoning tasks: functions `(response, answer) -> float`, registered by name or named by import path.

`task.reward` picks one: a registered name (`exact_match`), or `package.module:function` for a user's own, checked on
the driver (importable, callable) before any worker starts. The task owns its reward (`PromptSource.score`), so the
reward worker, evaluation and pretraining all score the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from rlplace.core.errors import ConfigError
from rlplace.core.registry import Registry, load

Reward = Callable[[str, str], float]
"""A reward: the response decoded without special tokens, and the reference answer -> a score (1.0 is right)."""

ANSWER_END = "\n"
"""`exact_match`: a response's answer ends at its first newline. The model's EOS token is dropped when the response is
decoded without special tokens; anything the model writes after its answer on the same line makes the answer wrong."""

REWARDS: Registry[Reward] = Registry("task.reward")


@REWARDS.register("exact_match")
def exact_match(response: str, answer: str) -> float:
    """1.0 if the response's answer equals `answer`, else 0.0.

    The response is cut at its first newline (`ANSWER_END`) and stripped of surrounding whitespace; nothing else is
    normalised, so "082" or "82.0" do not match "82"."""
    return 1.0 if response.split(ANSWER_END, 1)[0].strip() == answer else 0.0


def reward_function(spec: str) -> Reward:
    """The reward `spec` names: a registered name, or `module:function` (imported by `core.registry.load`).
    ConfigError in one line when it is neither, or not callable."""
    found = REWARDS[spec] if ":" not in spec else load(spec, "task.reward")
    if not callable(found):
        raise ConfigError(f"task.reward = {spec!r} is not callable: a reward is a function (response, answer) -> float")
    return found
