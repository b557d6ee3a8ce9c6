"""Pretraining the tiny LM: a real (tiny-budget) SFT run, its cache, its greedy evaluation, and the CLI
(`rlplace-pretrain`, run in-process through `rlplace.cli.pretrain_main`) with its refusals."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from rlplace.cli import EXIT_BAD_CONFIG, pretrain_main
from rlplace.core import preemption
from rlplace.core.errors import ConfigError
from rlplace.reasoning.config import (
    ArithmeticTaskConfig,
    GenerationConfig,
    LMConfig,
    PretrainConfig,
    ReasoningConfig,
    ReasoningTaskConfig,
)
from rlplace.reasoning.models.hf_folder import check_model_folder
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.pretrain import STATS_FILE, cache_key, greedy_accuracy, greedy_responses, pretrained_model_path
from rlplace.reasoning.rewards import exact_match, reward_function
from rlplace.reasoning.tasks import make_prompt_source
from rlplace.reasoning.tasks.prompts import Problem, encode_prompts

MAX_NEW_TOKENS = 4


def tiny_cfg(**pretrain: object) -> ReasoningConfig:
    """1-digit addition (100 problems, 20 held out) and a budget of a few seconds; target 1.0 runs every step."""
    budget = {"max_steps": 40, "batch_size": 32, "lr": 1e-3, "target_accuracy": 1.0, "eval_interval": 20} | pretrain
    return ReasoningConfig(
        task=ArithmeticTaskConfig(min_digits=1, max_digits=1, operations="+", eval_size=20),
        model=LMConfig(name="tiny_lm", pretrain=PretrainConfig(**budget)),
        rollout=GenerationConfig(max_new_tokens=MAX_NEW_TOKENS),
    )


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReasoningConfig, Path, Path]:
    cfg, cache_root = tiny_cfg(), tmp_path_factory.mktemp("pretrained")
    return cfg, cache_root, pretrained_model_path(cfg, cache_root)


def test_pretrain_writes_a_loadable_folder_and_its_stats(pretrained: tuple[ReasoningConfig, Path, Path]) -> None:
    cfg, cache_root, folder = pretrained
    assert folder == cache_root / f"tiny_lm-arithmetic-{cache_key(cfg)}"
    assert check_model_folder(folder) == folder
    assert [p.name for p in cache_root.iterdir()] == [folder.name]  # the temporary folder is gone
    stats = json.loads((folder / STATS_FILE).read_text())
    assert stats["steps"] == 40 and [h["step"] for h in stats["history"]] == [0, 20, 40]
    assert 0.0 <= stats["accuracy_before"] <= 1.0 and 0.0 <= stats["accuracy_after"] <= 1.0
    assert stats["config"]["pretrain"] == dataclasses.asdict(cfg.model.pretrain)
    # The saved weights are the trained ones: their greedy accuracy is the one recorded at the last step.
    model, tokenizer = load_causal_lm(folder), load_tokenizer(folder)
    eval_set = make_prompt_source(cfg.task).eval_set()
    accuracy = greedy_accuracy(model, tokenizer, eval_set, cfg.task, MAX_NEW_TOKENS, cfg.reward_function())
    assert accuracy == stats["accuracy_after"]


def test_sft_loss_goes_down(pretrained: tuple[ReasoningConfig, Path, Path]) -> None:
    history = json.loads((pretrained[2] / STATS_FILE).read_text())["history"]
    # A random init over a 100-token vocabulary starts near ln(100) = 4.6 nats per answer token.
    assert history[0]["eval_loss"] > 4.0
    assert history[-1]["eval_loss"] < 0.5 * history[0]["eval_loss"]
    assert history[-1]["train_loss"] < history[1]["train_loss"]


def test_second_call_hits_the_cache(pretrained: tuple[ReasoningConfig, Path, Path]) -> None:
    cfg, cache_root, folder = pretrained
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    start = time.monotonic()
    assert pretrained_model_path(tiny_cfg(), cache_root) == folder
    assert time.monotonic() - start < 1.0
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime


def test_cache_key_follows_what_the_weights_depend_on() -> None:
    base = tiny_cfg()
    same = tiny_cfg()
    same.task.prompts_per_step = 7  # RL batch size: pretraining does not read it
    other_seed = tiny_cfg(seed=1)
    other_task = tiny_cfg()
    other_task.task.data_seed = 3
    other_reward = tiny_cfg()
    other_reward.reward.function = "gsm8k"  # pretraining stops on the reward's score
    same.reward.function = "exact_match"  # the arithmetic task's default, named
    assert cache_key(same) == cache_key(base)
    assert len({cache_key(base), cache_key(other_seed), cache_key(other_task), cache_key(other_reward)}) == 4


def greedy_one_by_one(model: torch.nn.Module, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """The plainest greedy decoding: one unpadded prompt, full forward pass per token, argmax, stop at EOS."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    new: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(model(input_ids=ids).logits[0, -1].argmax())
            if token == tokenizer.eos_token_id:
                break
            new.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return tokenizer.decode(new, skip_special_tokens=True)


def test_batched_greedy_matches_one_prompt_at_a_time(pretrained: tuple[ReasoningConfig, Path, Path]) -> None:
    cfg, _, folder = pretrained
    model, tokenizer = load_causal_lm(folder), load_tokenizer(folder)
    # Prompts of different lengths, so batches are left-padded; batch_size=3 makes the last batch a partial one.
    problems = make_prompt_source(cfg.task).eval_set()[:5] + [Problem("12+7=", "19"), Problem("305+41=", "346")]
    prompts = [p.prompt for p in problems]
    expected = [greedy_one_by_one(model, tokenizer, p, MAX_NEW_TOKENS) for p in prompts]
    ids = encode_prompts(tokenizer, problems, cfg.task)
    greedy = greedy_responses(model, tokenizer, ids, MAX_NEW_TOKENS, batch_size=3)
    assert tokenizer.batch_decode(greedy, skip_special_tokens=True) == expected
    by_hand = sum(exact_match(p.prompt, r, p.answer, p.extra) for r, p in zip(expected, problems, strict=True))
    reward = reward_function("exact_match")
    accuracy = greedy_accuracy(model, tokenizer, problems, cfg.task, MAX_NEW_TOKENS, reward, batch_size=3)
    assert accuracy == by_hand / len(problems)
    # Answers equal to the model's own greedy responses are all accepted; answers it never writes, none.
    own = [Problem(p, r.split("\n")[0].strip()) for p, r in zip(prompts, expected, strict=True)]
    assert greedy_accuracy(model, tokenizer, own, cfg.task, MAX_NEW_TOKENS, reward, batch_size=3) == 1.0
    never = [Problem(p, "not a number") for p in prompts]
    assert greedy_accuracy(model, tokenizer, never, cfg.task, MAX_NEW_TOKENS, reward) == 0.0


def test_model_path_is_used_as_is_when_set(pretrained: tuple[ReasoningConfig, Path, Path], tmp_path: Path) -> None:
    cfg = tiny_cfg()
    cfg.model.path = str(pretrained[2])
    assert pretrained_model_path(cfg, tmp_path) == pretrained[2]
    assert list(tmp_path.iterdir()) == []


def test_bad_model_path_is_refused_naming_the_key(tmp_path: Path) -> None:
    cfg = tiny_cfg()
    cfg.model.path = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="model.path"):
        pretrained_model_path(cfg, tmp_path)
    (tmp_path / "empty").mkdir()
    cfg.model.path = str(tmp_path / "empty")
    with pytest.raises(ConfigError, match="model.path .*no config.json"):
        pretrained_model_path(cfg, tmp_path)


def test_only_tiny_lm_on_a_reasoning_task_is_built(tmp_path: Path) -> None:
    # The typed sections refuse a model without a folder to start from and a task that is not a reasoning task
    # as they are built; the builder itself refuses any model but tiny_lm without a path.
    with pytest.raises(ConfigError, match="model.path = None is invalid: a local Hugging Face model folder"):
        LMConfig(name="hf")
    cfg = tiny_cfg()
    cfg.model.name = "hf"
    with pytest.raises(ConfigError, match="model.path"):
        pretrained_model_path(cfg, tmp_path)
    with pytest.raises(ConfigError, match="task.name = 'cartpole' is invalid: valid: arithmetic, dataset"):
        ReasoningTaskConfig(name="cartpole")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """`rlplace-pretrain ARGS` in this process, from `tmp_path`: returns (exit code, stdout, stderr).

    The CLI sets up logging to stdout and torch's thread count for its process; both are put back afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(logging.root, "level", logging.root.level)
    threads = torch.get_num_threads()

    def run(*overrides: str) -> tuple[int, str, str]:
        monkeypatch.setattr(logging.root, "handlers", [])  # so that its logging.basicConfig takes effect
        try:
            pretrain_main(list(overrides))
            code = 0
        except SystemExit as exit_:
            code = exit_.code
        finally:
            torch.set_num_threads(threads)
        out, err = capsys.readouterr()
        return code, out, err

    return run


REASONING = ["experiment=arithmetic_grpo"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*REASONING, "model.pretrain.batch_size=0"], "model.pretrain.batch_size = 0"),
        ([*REASONING, "model.pretrain.lr=fast"], "model.pretrain.lr=fast"),
        (["task=cartpole"], "rlplace-pretrain pretrains the LM of a reasoning task"),
        (["task=arithmetic", "model=tiny_lm"], "algorithm: the chosen option (algorithm.name = 'ppo')"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(overrides: list[str], message: str, cli, tmp_path: Path) -> None:
    # One value the typed config refuses, one Hydra cannot parse, a task of the other family, and a reasoning task
    # with the default (embodied) algorithm; the other refusals are checked on the typed config above.
    code, _, err = cli(*overrides)
    assert code == EXIT_BAD_CONFIG, err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow  # the whole CLI: composes, resolves, pretrains (on every core, as the CLI sets torch up) and caches
def test_cli_pretrains_into_outputs_and_reports_the_folder(cli, tmp_path: Path) -> None:
    code, out, err = cli(
        *REASONING,
        "task.max_digits=1",
        "task.operations=+",
        "task.eval_size=10",
        "model.pretrain.max_steps=4",
        "model.pretrain.batch_size=8",
        "model.pretrain.eval_interval=2",
    )
    assert code == 0, err
    [folder] = (tmp_path / "outputs" / "pretrained").iterdir()
    assert "pretrain step 4:" in out
    assert out.strip().splitlines()[-1].startswith(f"model: {Path('outputs/pretrained') / folder.name}")
    check_model_folder(folder)


def test_a_run_stopped_while_its_model_pretrains_ends_there_caching_nothing(tmp_path: Path) -> None:
    """A SIGTERM (or Ctrl-C) before a run's first step: pretraining stops at its next step, and no half-trained model
    is left in the cache for a later run to take as pretrained."""
    with preemption.handled():
        os.kill(os.getpid(), signal.SIGTERM)  # recorded by the run's handler, as a batch scheduler's stop would be
        with pytest.raises(preemption.StoppedEarly, match="stopped by SIGTERM before the first step"):
            pretrained_model_path(tiny_cfg(), cache_root=tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither the cache folder nor its temporary one


def test_cli_aborted_by_ctrl_c_says_so_in_one_line_and_caches_nothing(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt  # a Ctrl-C while the model fine-tunes, in its temporary folder

    monkeypatch.setattr("rlplace.reasoning.pretrain.fine_tune", interrupted)
    code, _, err = cli(*REASONING, "task.max_digits=1", "task.operations=+", "task.eval_size=10")
    assert (code, err.strip()) == (130, "rlplace: pretraining aborted by Ctrl-C; nothing was cached")
    assert list((tmp_path / "outputs" / "pretrained").iterdir()) == []
