"""The GSM8K-format example a user copies: the shipped word problems, the tiny Qwen2 with its BPE tokenizer and chat
template, and `experiment=gsm8k_grpo` trained for two steps as `rlplace-train` runs it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlplace.cli import compose_run
from rlplace.families import resolve
from rlplace.reasoning.models.tiny_qwen2 import build_tiny_qwen2
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.rewards import reward_function
from rlplace.reasoning.tasks import word_problems
from rlplace.train import train
from tests.reasoning.runs import ON_DEVICE_0, metrics


def test_the_shipped_word_problems_are_what_their_generator_writes(tmp_path: Path) -> None:
    for split, path in word_problems.write(tmp_path).items():
        assert path.read_text() == (word_problems.DATA_DIR / f"{split}.jsonl").read_text(), split
    records = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(records) == word_problems.SPLITS["train"]
    gsm8k = reward_function("gsm8k")
    for record in records[:20]:  # the reference scores itself right under the gsm8k reward
        assert gsm8k(record["question"], record["answer"], record["answer"], {}) == {"score": 1.0}


def test_the_tiny_qwen2_folder_loads_as_a_user_checkpoint_does(tmp_path: Path) -> None:
    folder = build_tiny_qwen2(tmp_path / "model", ["Ava has 3 apples.\n#### 3"] * 8)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2"
    tokenizer = load_tokenizer(folder)
    turn = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(tokenizer("Ava has 3 apples.\n#### 3")["input_ids"]) == "Ava has 3 apples.\n#### 3"


def _sharded(folder: Path, split: str, suffixes: tuple[str, ...], count: int | None = None) -> list[Path]:
    """The first `count` records of the shipped `split` (all: None) cut into one file per suffix, each record naming
    its shard as its `data_source` (as verl's files name their benchmark)."""
    import datasets

    lines = (word_problems.DATA_DIR / f"{split}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines[:count]]
    shards = len(suffixes)
    folder.mkdir(exist_ok=True)
    paths = []
    for shard, suffix in zip(range(shards), suffixes, strict=True):
        part = [{**r, "data_source": f"{split}{shard}"} for r in records[shard::shards]]
        path = folder / f"{split}-{shard}{suffix}"
        if suffix == ".parquet":
            datasets.Dataset.from_list(part).to_parquet(str(path))
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in part))
        paths.append(path)
    return paths


@pytest.mark.slow
def test_the_gsm8k_example_trains(
    shared_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On the shipped problems in shards as a user's data comes: the training split as a glob pattern of JSONL
    shards and a Parquet file, the held-out split as a list of two files from two sources, answered twice each after
    training only, and records too long for the model among the training ones, left out. Then its last checkpoint
    evaluated alone (runner.val_only) answers as the run's last evaluation did.

    Both runs train in this process (what `rlplace-train` does once it has resolved the config) on the module's Ray,
    the evaluation in processes of the training run (`scheduler/parking.py`); the command itself is exercised by
    the runs of tests/reasoning/test_runner.py and tests/test_wheel.py."""
    data = tmp_path / "data"
    _sharded(data, "train", (".jsonl", ".jsonl", ".parquet"))
    evals = _sharded(data, "test", (".jsonl", ".jsonl"), count=8)
    # As many records again whose question is too long for the model (context 512, 48 new tokens): left out by
    # task.filter_overlong_prompts on the driver and on every rollout rank, which would otherwise draw them.
    long = [" ".join(str(i * 7919 % 1009) for i in range(k, k + 600)) for k in range(word_problems.SPLITS["train"])]
    (data / "train-long.jsonl").write_text(
        "".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n" for q in long)
    )
    tiny = [  # a short pretraining (2 steps of 16), small batches, and 8 held-out problems answered twice each
        "experiment=gsm8k_grpo",
        "model.pretrain.max_steps=2",
        "model.pretrain.eval_interval=2",
        "model.pretrain.batch_size=16",
        f"task.train_path=[{data}/train-*.jsonl,{data}/train-2.parquet]",
        f"task.eval_path=[{evals[0]},{evals[1]}]",
        "task.prompts_per_step=4",
        "rollout.micro_batch_prompts=2",
        "rollout.eval_samples=2",
        "rollout.eval_temperature=1.0",
        "runner.eval_before_train=false",  # evaluated after the last step only
        "task.filter_overlong_prompts=true",
        "algorithm.group_size=4",
        "rollout.temperature=0.7",  # sampled at 0.7, scored at 0.7 by the inference group and the update alike:
        "algorithm.num_minibatches=1",  # the update's one step starts at ratio 1 (train/approx_kl 0)
        "runner.max_steps=2",
        "logger=jsonl",
        # The preset's collocated placement with one process per component instead of two (each imports torch and
        # loads the model).
        *ON_DEVICE_0,
    ]
    monkeypatch.setenv("RLPLACE_OUTPUT_DIR", str(tmp_path))  # the pretrained model's cache
    caplog.set_level(logging.INFO)
    run_dir = tmp_path / "run"
    rows, line = _trained(run_dir, tiny)
    assert f"{len(long)} training and 0 held-out prompts are longer than the 464 tokens" in caplog.text
    assert [row["step"] for row in rows] == [0, 1]
    for key in ("reward/score", "reward/correct", "reward/format", "train/policy_loss", "rollout/response_length"):
        assert key in rows[0], key
    assert all(abs(row["train/approx_kl"]) < 1e-6 for row in rows), [row["train/approx_kl"] for row in rows]
    # Evaluated after the last step; two sources of 4 problems: the mean is the mean of their means.
    last = rows[-1]
    sources = [last["eval/accuracy/test0"], last["eval/accuracy/test1"]]
    assert last["eval/accuracy"] == pytest.approx(sum(sources) / 2)
    assert last["eval/accuracy"] <= last["eval/best@2"] <= 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "eval/accuracy_before" not in summary and summary["eval/accuracy_after"] == last["eval/accuracy"]
    assert f"held-out accuracy {last['eval/accuracy']:.3f} after 2 steps" in line
    assert load_tokenizer(run_dir / "final_model").chat_template is not None
    assert next((tmp_path / "pretrained").glob("tiny_qwen2-dataset-*/pretrain.json"))

    checkpoint = run_dir / "checkpoints" / "step_000002"
    evaluated = tmp_path / "evaluated"
    (row,), line = _trained(evaluated, [*tiny, "runner.val_only=true", f"runner.resume={checkpoint}"])
    assert row == {"step": 2, **{key: value for key, value in last.items() if key.startswith("eval/")}}
    assert line.startswith(
        f"rlplace: evaluated: held-out accuracy {last['eval/accuracy']:.3f}, best@2 {last['eval/best@2']:.3f}"
    )
    assert not (evaluated / "final_model").exists() and not (evaluated / "checkpoints").exists()
    # Only the actor (which loads the checkpoint) and the rollout (which answers and verifies) were started; the
    # timeline holds the evaluation's spans.
    events = json.loads((evaluated / "timeline.json").read_text())["traceEvents"]
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == [
        "device 0: rollout, actor",
        "device 1: idle",
        "host: driver",
    ]
    spans = {(e["args"]["group"], e["name"]) for e in events if e["ph"] == "X"}
    assert {("actor", "sync_weights"), ("rollout", "evaluate")} <= spans
    assert {group for group, _ in spans} == {"driver", "actor", "rollout"}


def _trained(run_dir: Path, overrides: list[str]) -> tuple[list[dict[str, float]], str]:
    """The run of `overrides` trained in this process: its metrics.jsonl rows and its closing line (what
    `rlplace-train` prints last)."""
    plan = resolve(compose_run(overrides))
    run_dir.mkdir()
    final, ended = train(plan, run_dir, resolved_config={})
    line, _ = plan.launcher.summary(plan.cfg, ended.placement.mode, final, run_dir)
    return metrics(run_dir), line
