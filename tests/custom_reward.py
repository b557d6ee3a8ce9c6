"""A user's own rewards, referenced by import path: `reward.function: tests.custom_reward:last_integer`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def last_integer(prompt: str, response: str, answer: str, extra: Mapping[str, Any]) -> float:
    """1.0 when the last integer in the response is the answer ("so the sum is 7" for 7), else 0.0."""
    found = re.findall(r"-?\d+", response)
    return 1.0 if found and found[-1] == answer.strip() else 0.0


def graded(prompt: str, response: str, answer: str, extra: Mapping[str, Any]) -> dict[str, float]:
    """Named scores: `last_integer` as the training reward ("score") and as "correct", and the response's length in
    characters; a run logs each as `reward/<name>`."""
    correct = last_integer(prompt, response, answer, extra)
    return {"score": correct, "correct": correct, "length": float(len(response))}
