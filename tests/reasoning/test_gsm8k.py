"""The GSM8K-format example a user copies: the shipped word problems, the tiny Qwen2 with its BPE tokenizer and chat
template, and `experiment=gsm8k_grpo` trained for two steps as a user starts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlplace.reasoning.models.tiny_qwen2 import build_tiny_qwen2
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.rewards import reward_function
from rlplace.reasoning.tasks import word_problems


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


@pytest.mark.slow
def test_the_gsm8k_example_trains(tmp_path: Path) -> None:
    tiny = [  # a short pretraining (2 steps of 16), small batches and an eval split of 8 held out of the training file
        "model.pretrain.max_steps=2",
        "model.pretrain.eval_interval=2",
        "model.pretrain.batch_size=16",
        "task.eval_path=null",
        "task.eval_size=8",
        "task.prompts_per_step=4",
        "rollout.micro_batch_prompts=2",
        "algorithm.group_size=4",
        "runner.max_steps=2",
        "logger=jsonl",
        # One device of one core, every component on it taking turns: the preset's collocated placement with one
        # process per component instead of two (each imports torch and loads the model).
        "cluster.num_devices_per_node=1",
        "cluster.cpus_per_device=1",
    ]
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "rlplace.train", "experiment=gsm8k_grpo", *tiny, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "RLPLACE_OUTPUT_DIR": str(tmp_path)}  # the pretrained model's cache, too
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1]
    for key in ("reward/score", "reward/correct", "reward/format", "train/policy_loss", "rollout/response_length"):
        assert key in rows[0], key
    assert load_tokenizer(run_dir / "final_model").chat_template is not None
    assert next((tmp_path / "pretrained").glob("tiny_qwen2-dataset-*/pretrain.json"))
