"""What the reasoning end-to-end tests share: the tiny settings, and training runs from a tiny LM folder built here,
either in a subprocess as users start them (`rlplace-train experiment=arithmetic_grpo ...` on an embedded local
Ray) or in this process as `rlplace-train` runs them once resolved (`trained`, on the Ray this process is
connected to)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
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

TIMEOUT_S = 300


def command(run_dir: Path, model_path: Path, *overrides: str) -> list[str]:
    """`rlplace-train` on the tiny settings; `overrides` come last (a later `experiment=` replaces the first)."""
    return [
        sys.executable,
        "-m",
        "rlplace.train",
        "experiment=arithmetic_grpo",
        *TINY,
        f"model.path={model_path}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]


@dataclass
class Run:
    """A training subprocess writing its output into its run folder."""

    run_dir: Path
    process: subprocess.Popen[bytes]
    stdout: str = ""
    stderr: str = ""

    def finished(self) -> Run:
        """Wait for it; it must have succeeded."""
        if self.process.returncode is None:
            try:
                self.process.wait(timeout=TIMEOUT_S)
            finally:
                self.stop()  # no-op once it exited
            self.stdout = (self.run_dir / "stdout.txt").read_text()
            self.stderr = (self.run_dir / "stderr.txt").read_text()
        assert self.process.returncode == 0, self.stdout[-3000:] + self.stderr[-3000:]
        return self

    def stop(self) -> None:
        """Interrupt it if it still runs, so that it shuts its Ray down (a kill would leave Ray's processes)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def metrics(self) -> list[dict[str, float]]:
        return metrics(self.run_dir)


def metrics(run_dir: Path) -> list[dict[str, float]]:
    """A run folder's metrics.jsonl rows."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def trained(run_dir: Path, model_path: Path, *overrides: str) -> Path:
    """`command`'s run trained in this process (`rlplace.train.train`, re-placed where `runner.replace_at` says);
    its folder."""
    args = ["experiment=arithmetic_grpo", *TINY, f"model.path={model_path}", *overrides]
    plan = resolve(compose_run(args))
    train(plan, run_dir, resolved_config={}, switches=switches(plan, args))
    return run_dir


def start(run_dir: Path, model_path: Path, *overrides: str, niceness: int = 0) -> Run:
    """`command` started in the background, its output in `run_dir`'s stdout.txt and stderr.txt."""
    with (run_dir / "stdout.txt").open("wb") as out, (run_dir / "stderr.txt").open("wb") as err:
        process = subprocess.Popen(
            command(run_dir, model_path, *overrides),
            stdout=out,
            stderr=err,
            preexec_fn=functools.partial(os.nice, niceness),
        )
    return Run(run_dir, process)


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
