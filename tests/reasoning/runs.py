"""What the reasoning end-to-end tests share: the tiny settings, and training runs from a tiny LM folder built here, as
`rlplace-train experiment=arithmetic_grpo ...` runs them (`arguments`), or in this process as `rlplace-train` runs
them once resolved (`trained`, on the Ray this process is connected to)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rlplace.cli import compose_run
from rlplace.families import resolve
from rlplace.replace import switches
from rlplace.train import train

TINY = [
    "task.min_digits=1",
    "task.max_digits=1",
    "task.operations=+",
    "task.eval_size=16",
    "task.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.num_minibatches=2",
    "rollout.micro_batch_prompts=2",
    "rollout.max_new_tokens=4",
    "runner.max_steps=2",
    "runner.eval_interval=1",
    "logger=jsonl",
]

ON_DEVICE_0 = [
    "placement=reasoning_disaggregated",
    *(f"cluster.component_placement.{name}=0" for name in ("rollout", "reward", "inference", "actor")),
]
"""Every component on device 0 of the default 2, one process each, taking turns: the collocated shape of the reasoning
runs trained in a pytest process, each taking over the processes of the run before it (`scheduler/parking.py`)."""


def tiny_overrides(model_path: Path, *more: str) -> list[str]:
    """A run on the tiny settings from the model folder `model_path`; `more` come last (a later `experiment=` replaces
    the first)."""
    return ["experiment=arithmetic_grpo", *TINY, f"model.path={model_path}", *more]


def arguments(run_dir: Path, model_path: Path, *overrides: str) -> list[str]:
    """`rlplace-train`'s arguments for `tiny_overrides`' run, writing into `run_dir`."""
    return [*tiny_overrides(model_path, *overrides), f"hydra.run.dir={run_dir}"]


def command(run_dir: Path, model_path: Path, *overrides: str) -> list[str]:
    """`arguments`' run as a command started in a subprocess."""
    return [sys.executable, "-m", "rlplace.train", *arguments(run_dir, model_path, *overrides)]


def metrics(run_dir: Path) -> list[dict[str, float]]:
    """A run folder's metrics.jsonl rows."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def trained(run_dir: Path, model_path: Path, *overrides: str) -> Path:
    """`arguments`' run trained in this process (`rlplace.train.train`, re-placed where `runner.replace_at` says);
    its folder."""
    args = tiny_overrides(model_path, *overrides)
    plan = resolve(compose_run(args))
    train(plan, run_dir, resolved_config={}, switches=switches(plan, args))
    return run_dir


def same(a: object, b: object) -> bool:
    """Deep equality of checkpoint contents, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def compared(row: dict[str, float]) -> dict[str, float]:
    """The metrics a resumed run must reproduce exactly (times and throughputs differ from run to run)."""
    return {key: value for key, value in row.items() if key.startswith(("train/", "rollout/", "eval/"))}
