"""The learning-rate factor of each step (`core.lr_schedule`): CleanRL's linear anneal, cosine decay to a floor, a
warmup, and refusals of settings outside their range."""

from __future__ import annotations

import math

import pytest

from rlplace.core.config import PolicyGradientConfig
from rlplace.core.errors import ConfigError
from rlplace.core.lr_schedule import lr_factor


def factors(max_steps: int = 10, **settings: object) -> list[float]:
    alg = PolicyGradientConfig(**settings)
    return [lr_factor(alg, step, max_steps) for step in range(max_steps)]


def test_the_default_is_cleanrls_linear_anneal() -> None:
    assert factors() == [1.0 - step / 10 for step in range(10)]
    assert factors(anneal_lr=False) == [1.0] * 10


def test_a_warmup_rises_to_lr_then_the_decay_runs_over_the_remaining_steps() -> None:
    expected = [0.25, 0.5, 0.75, 1.0, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6]
    assert factors(lr_warmup_steps=4) == pytest.approx(expected)
    warm = factors(lr_warmup_steps=4, anneal_lr=False)
    assert warm == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_cosine_decay_ends_near_its_floor() -> None:
    got = factors(lr_decay="cosine", min_lr_ratio=0.1)
    expected = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / 10)) for step in range(10)]
    assert got == pytest.approx(expected) and got[0] == 1.0 and all(a > b for a, b in zip(got, got[1:], strict=False))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"lr_decay": "step"}, "algorithm.lr_decay = 'step' is invalid: valid: linear, cosine"),
        ({"lr_warmup_steps": -1}, "algorithm.lr_warmup_steps = -1 is invalid"),
        ({"min_lr_ratio": 1.5}, r"algorithm.min_lr_ratio = 1.5 is invalid: in \[0, 1\]"),
    ],
)
def test_settings_outside_their_range_are_refused(setting: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PolicyGradientConfig(**setting)
