"""A user's own reward, referenced from a task's YAML as `task.reward: tests.custom_reward:last_integer`."""

from __future__ import annotations

import re


def last_integer(response: str, answer: str) -> float:
    """1.0 when the last integer in the response is the answer ("so the sum is 7" for 7), else 0.0."""
    found = re.findall(r"-?\d+", response)
    return 1.0 if found and found[-1] == answer.strip() else 0.0
