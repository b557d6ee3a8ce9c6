"""Adding to rlplace as a user would, without touching its code: a gymnasium task is one option file; a reasoning task
scored by a reward of its own is an option file for the task and one for the reward, naming a function in a file of
the user's (joined with a reward model of theirs). Each trains for 2 steps on an embedded Ray shared by the module's
runs (docs/extending.md shows the same files)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlplace.cli import compose_run
from rlplace.core.errors import ConfigError
from rlplace.families import resolve
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm
from rlplace.train import train
from tests.reasoning.runs import ON_DEVICE_0 as REASONING_ON_DEVICE_0
from tests.reasoning.runs import TINY
from tests.reasoning.tiny_reward_model import build_reward_model

ACROBOT = """\
defaults:
  - /schema/task/embodied@_here_
  - _self_

name: acrobot
env_id: Acrobot-v1
total_num_envs: 8
"""
"""A gymnasium task: gymnasium's registry knows Acrobot-v1, so this file is all it takes."""

SUMS_ANY_FORM = """\
defaults:
  - /schema/task/arithmetic@_here_
  - _self_

name: arithmetic
operations: "+"
"""
"""Sums: the file starts from the arithmetic task's own schema, so its fields (operations) are typed and another
task's keys are refused."""

GRADED = """\
defaults:
  - /schema/reward/reasoning@_here_
  - _self_

function: {rewards}:graded
"""
"""The user's own reward, a function in a file of theirs returning named scores (`REWARDS_FILE`)."""

REWARDS_FILE = """\
import re


def graded(prompt, response, answer, extra):
    found = re.findall(r"-?\\d+", response)
    correct = float(bool(found) and found[-1] == answer)
    return {"score": correct, "correct": correct, "length": float(len(response))}
"""
"""The last integer of the response must be the answer; the response's length is logged too."""


@pytest.fixture(scope="module")
def conf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A config folder of the user's own, added to Hydra's search path: its options join rlplace's groups."""
    folder = tmp_path_factory.mktemp("conf")
    (folder / "task").mkdir()
    (folder / "task" / "acrobot.yaml").write_text(ACROBOT)
    (folder / "task" / "sums_any_form.yaml").write_text(SUMS_ANY_FORM)
    (folder / "reward").mkdir()
    (folder / "my_rewards.py").write_text(REWARDS_FILE)
    (folder / "reward" / "graded.yaml").write_text(GRADED.format(rewards=folder / "my_rewards.py"))
    return f"hydra.searchpath=[file://{folder}]"


ON_DEVICE_0 = ["placement=hybrid", *(f"cluster.component_placement.{c}=0" for c in ("env", "rollout", "actor"))]
"""Every component on device 0 of the default 2, one process each: the shape of the runs of other modules on this
process's Ray, whose processes the run takes over (`scheduler/parking.py`); `reasoning.runs.ON_DEVICE_0` for a
reasoning run."""


def rows(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_gymnasium_task_is_one_option_file(conf: str, shared_ray: None, tmp_path: Path) -> None:
    tiny = ["rollout.num_steps=16", "runner.max_steps=2", "logger=jsonl"]
    plan = resolve(compose_run([conf, "task=acrobot", *ON_DEVICE_0, *tiny]))
    assert (plan.cfg.task.name, plan.cfg.task.env_id) == ("acrobot", "Acrobot-v1")
    train(plan, tmp_path, resolved_config={})
    history = rows(tmp_path)
    assert [row["step"] for row in history] == [0, 1]
    assert history[-1]["env/total_steps"] == 2 * 8 * 16
    assert math.isfinite(history[-1]["train/policy_loss"])


@pytest.mark.slow
def test_a_reasoning_task_with_its_own_reward_is_one_option_file(
    conf: str, shared_ray: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The user's reward is joined with a reward model of theirs (a sequence classifier), half and half; every named
    score is logged."""
    model = build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), TinyLMShape(num_layers=1, hidden_size=64))
    reward_model = build_reward_model(tmp_path_factory.mktemp("reward_model"))
    overrides = [conf, "experiment=arithmetic_grpo", "task=sums_any_form", "reward=graded", *TINY, "model=hf"]
    extra = [f"model.path={model}", f"reward.model_path={reward_model}", "reward.model_weight=0.5"]
    extra += REASONING_ON_DEVICE_0  # the preset's collocated placement with one process per component, not two
    plan = resolve(compose_run([*overrides, *extra]))
    reward = plan.cfg.reward_function()
    assert reward("1+2=", "1+2 makes 3", "3", {}) == {"score": 1.0, "correct": 1.0, "length": 11.0}
    assert reward("1+2=", "3 or 4", "3", {})["score"] == 0.0
    run_dir = tmp_path_factory.mktemp("run")
    train(plan, run_dir, resolved_config={})  # its workers load the reward from the same file
    history = rows(run_dir)
    assert [row["step"] for row in history] == [0, 1]
    for row in history:  # every named score, as the mean over the step's responses
        assert 0.0 <= row["rollout/reward"] <= 1.0 and 0.0 <= row["eval/accuracy"] <= 1.0
        assert row["reward/rule"] == pytest.approx(row["reward/correct"])  # the user's "score"
        assert row["reward/score"] == pytest.approx(row["rollout/reward"])  # what is trained on
        assert row["reward/score"] == pytest.approx(0.5 * row["reward/rule"] + 0.5 * row["reward/model"])
        assert 0.0 <= row["reward/length"] <= 4.0  # rollout.max_new_tokens characters at most


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("exact", "reward.function = 'exact' is invalid: valid: exact_match, gsm8k"),
        ("tests.custom_reward:nothing_here", "reward.function = 'tests.custom_reward:nothing_here' cannot be imported"),
        ("no_such_module:f", "reward.function = 'no_such_module:f' cannot be imported"),
        ("tests.custom_reward:re", "reward.function = 'tests.custom_reward:re' is not callable"),
        ("no/such/file.py:f", "reward.function = 'no/such/file.py:f' cannot be loaded: no such file"),
    ],
)
def test_a_reward_that_cannot_be_used_is_refused_in_one_line(reward: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        resolve(compose_run(["experiment=arithmetic_grpo", f"reward.function={reward}"]))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["task=dataset", "task.train_path=x.jsonl", "+task.min_digits=2"],
            "task.min_digits = 2: DatasetTaskConfig has no",
        ),
        (["+task.no_such_key=1"], "task.no_such_key = 1: ArithmeticTaskConfig has no key 'no_such_key'"),
        (["task.name=dataset"], "task.name = 'dataset' is invalid for a task section typed ArithmeticTaskConfig"),
        (["task.name=sums"], "task.name = 'sums' is invalid: valid: arithmetic, dataset"),
        (["algorithm.name=dpo"], "algorithm.name = 'dpo' is invalid: valid: grpo, ppo, reinforce_pp"),
    ],
)
def test_each_option_has_its_own_schema_and_names_come_from_the_registries(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        resolve(compose_run(["experiment=arithmetic_grpo", *overrides]))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("reward", ["tests.custom_reward:nope", "no/such/file.py:f"])
def test_the_cli_refuses_a_reward_that_cannot_be_imported_before_ray(tmp_path: Path, reward: str) -> None:
    """Exit 2 and one line, from the driver, with nothing started."""
    done = subprocess.run(
        [sys.executable, "-m", "rlplace.train", "experiment=arithmetic_grpo", f"reward.function={reward}"],
        capture_output=True,
        text=True,
        env={**os.environ, "RLPLACE_OUTPUT_DIR": str(tmp_path)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "reward.function" in line]
    assert len(errors) == 1 and "cannot be" in errors[0] and "valid: exact_match" in errors[0]
