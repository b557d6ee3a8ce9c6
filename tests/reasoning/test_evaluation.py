"""Held-out evaluation's metrics and sample ids (`reasoning.evaluation`); sampled evaluation end to end, across
placements with one and two rollout ranks, is in test_placements.py."""

from __future__ import annotations

import random

import pytest

from rlplace.core.errors import ConfigError
from rlplace.reasoning.config import GenerationConfig
from rlplace.reasoning.evaluation import EVAL_SAMPLE_IDS, Answered, eval_metrics, sample_ids


def test_greedy_evaluation_is_the_mean_score() -> None:
    answered = [Answered(0, None, [1.0]), Answered(1, None, [0.0]), Answered(2, None, [0.5])]
    assert eval_metrics(answered) == {"eval/accuracy": 0.5}


def test_sampled_evaluation_adds_the_best_of_k_and_each_data_sources_accuracy() -> None:
    answered = [
        Answered(0, "openai/gsm8k", [1.0, 0.0, 0.0, 0.0]),
        Answered(1, "openai/gsm8k", [0.0, 0.0, 0.0, 0.0]),
        Answered(2, "math", [1.0, 1.0, 1.0, 0.0]),
    ]
    expected = {
        "eval/accuracy": 4 / 12,
        "eval/best@4": 2 / 3,
        "eval/accuracy/math": 3 / 4,
        "eval/accuracy/openai/gsm8k": 1 / 8,
    }
    assert eval_metrics(answered) == pytest.approx(expected)
    shuffled = random.Random(0).sample(answered, len(answered))  # as the ranks' shares arrive
    assert eval_metrics(shuffled) == eval_metrics(answered)


def test_each_held_out_sample_has_an_id_of_its_own_above_the_training_ids() -> None:
    ids = [i for problem in range(100) for i in sample_ids(problem, 4)]
    assert len(set(ids)) == 400 and min(ids) == EVAL_SAMPLE_IDS and max(ids) < 1 << 63
    assert sample_ids(3, 1) == [EVAL_SAMPLE_IDS + 3]


def test_several_greedy_answers_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"rollout.eval_samples = 4 is invalid: 1 while rollout.eval_temperature = 0"):
        GenerationConfig(eval_samples=4)
    assert GenerationConfig(eval_samples=4, eval_temperature=0.6).eval_samples == 4
