"""The reward model scorer (`reward.model_path`): a sequence classifier's scalar per response, whatever the batch
around it; a folder without a one-output classification head refused on the driver in one line; its weight in the
training reward; and its place in the collocated switch plan."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlplace.cli import compose_run
from rlplace.core.errors import ConfigError
from rlplace.core.schedule import switch_plan
from rlplace.families import resolve
from rlplace.reasoning.models.reward_model import RewardModel
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm
from rlplace.reasoning.phases import PHASES
from rlplace.reasoning.rewards import with_model
from rlplace.reasoning.tasks.prompts import Problem
from tests.reasoning.tiny_reward_model import build_reward_model


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_reward_model(tmp_path_factory.mktemp("reward_model"))


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), TinyLMShape(num_layers=1, hidden_size=64))


def test_a_response_scores_the_same_alone_or_padded_in_a_batch(reward_model: Path) -> None:
    scorer = RewardModel(reward_model, torch.device("cpu"))
    problems = [Problem("1+2=", "3"), Problem("10+20=", "30"), Problem("7+7=", "14")]
    responses = ["3", "30 is it", "4"]
    batched = scorer.score(problems, responses)
    alone = [scorer.score([p], [r])[0] for p, r in zip(problems, responses, strict=True)]
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(batched)) == 3  # it reads the text: different responses, different scores


def test_with_a_chat_template_the_model_reads_the_conversation(reward_model: Path) -> None:
    scorer = RewardModel(reward_model, torch.device("cpu"))
    assert scorer.text("1+2=", "3") == "1+2=3"
    scorer.tokenizer.chat_template = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}"
    assert scorer.text("1+2=", "3") == "u:1+2=;a:3;"


def test_the_training_reward_weighs_the_model_against_the_rule() -> None:
    rule = {"score": 1.0, "correct": 1.0, "format": 0.0}
    assert with_model(rule, 0.2, 0.5) == {"score": 0.6, "correct": 1.0, "format": 0.0, "rule": 1.0, "model": 0.2}
    assert with_model(rule, 0.2, 1.0)["score"] == 0.2 and with_model(rule, 0.2, 0.0)["score"] == 1.0


def test_a_reward_model_folder_is_checked_on_the_driver(reward_model: Path, causal_lm: Path) -> None:
    plan = resolve(compose_run(["experiment=arithmetic_grpo", f"reward.model_path={reward_model}"]))
    assert plan.cfg.reward.model_path == str(reward_model) and plan.cfg.reward.enable_offload
    with pytest.raises(ConfigError, match=r"reward.model_path = '.*' is invalid: not a reward model") as refused:
        resolve(compose_run(["experiment=arithmetic_grpo", f"reward.model_path={causal_lm}"]))
    assert "\n" not in str(refused.value) and "num_labels=1" in str(refused.value)
    with pytest.raises(ConfigError, match="reward.model_path = '/no/such' is invalid: no such folder"):
        resolve(compose_run(["experiment=arithmetic_grpo", "reward.model_path=/no/such"]))
    with pytest.raises(ConfigError, match=r"reward.model_weight = 1.5 is invalid: in \[0, 1\]"):
        resolve(compose_run(["experiment=arithmetic_grpo", "reward.model_weight=1.5"]))


def test_collocated_the_reward_model_leaves_the_devices_while_the_actor_trains() -> None:
    devices = {name: frozenset({0, 1}) for name in ("actor", "rollout", "reward", "inference")}
    plan = switch_plan(PHASES, devices, {"actor": True, "rollout": True, "reward": True})
    assert "reward" in plan["training"].offload and "reward" in plan["generate_rollouts"].onload
    assert "reward" not in plan["sync_weights"].onload  # it scores only while generating
