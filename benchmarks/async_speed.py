"""Asynchronous training's speed: the same run with runner.max_staleness = 0 (synchronous) and 1 (one step off).

The placement gives the actor a device of its own (`cluster=local`: the generating components on device 0, the actor
on device 1), the one where generation and training can run side by side. `--task halfcheetah` (the default) runs
the HalfCheetah pipeline preset, where both take a sizeable part of a step; `--task arithmetic` the GRPO preset with
rollout, reward and inference on device 0 (evaluated only before the first step and after the last). Runs alternate
(K = 0, K = 1, K = 0, ...) so that machine noise falls on both alike; each run's figures are medians over its steps
after 2 warm-up steps, leaving out the last (with K = 1 it generates nothing: no step is ahead of it). Prints, per
run, the step, generation and training times; for K = 1 its step over max(generation, training) (1.0 = perfect
overlap) and the overlap seconds per step; and the speedup of K = 1's step over K = 0's.

    .venv/bin/python benchmarks/async_speed.py [--task halfcheetah|arithmetic] [--rounds 2] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from results import write_section

REPO = Path(__file__).resolve().parent.parent
COMMON = ["cluster=local", "cluster.component_placement.actor=1", "logger=none", "runner.save_interval=0"]
TASKS = {
    "halfcheetah": (
        "HalfCheetah pipeline, env and rollout on device 0, actor on device 1",
        ["experiment=halfcheetah_pipeline", *(f"cluster.component_placement.{c}=0" for c in ("env", "rollout"))],
    ),
    "arithmetic": (
        "arithmetic GRPO, rollout, reward and inference on device 0, actor on device 1",
        [
            "experiment=arithmetic_grpo",
            "placement=reasoning_disaggregated",
            "runner.eval_interval=1000",
            *(f"cluster.component_placement.{c}=0" for c in ("rollout", "reward", "inference")),
        ],
    ),
}
WARM_UP = 2


def run(task: str, staleness: int, steps: int) -> dict[str, float]:
    """One run's medians of time/step, time/generate_rollouts, time/training and time/overlap."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            str(Path(sys.executable).parent / "rlplace-train"),
            *TASKS[task][1],
            *COMMON,
            f"runner.max_staleness={staleness}",
            f"runner.max_steps={steps}",
        ]
        env = {**os.environ, "RLPLACE_OUTPUT_DIR": out}
        subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True)
        (path,) = Path(out).rglob("metrics.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines()][WARM_UP:-1]
    keys = ("time/step", "time/generate_rollouts", "time/training", "time/overlap")
    return {key: statistics.median(row.get(key, 0.0) for row in rows) for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="halfcheetah")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs (K = 0, then K = 1)")
    parser.add_argument("--steps", type=int, default=10, help="runner.max_steps of each run")
    args = parser.parse_args()
    results: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for _ in range(args.rounds):
        for staleness in (0, 1):
            results[staleness].append(run(args.task, staleness, args.steps))
    lines = [
        f"{TASKS[args.task][0]} ({args.rounds} runs each)\n",
        "| K | step (s) | generation (s) | training (s) | step / max(gen, train) | overlap (s) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for staleness, runs in results.items():
        for r in runs:
            bound = r["time/step"] / max(r["time/generate_rollouts"], r["time/training"])
            lines.append(
                f"| {staleness} | {r['time/step']:.3f} | {r['time/generate_rollouts']:.3f} | {r['time/training']:.3f}"
                f" | {bound:.2f} | {r['time/overlap']:.3f} |"
            )
    sync = statistics.median(r["time/step"] for r in results[0])
    one_off = statistics.median(r["time/step"] for r in results[1])
    lines.append(f"\nspeedup of K = 1 over K = 0 (median step): {sync / one_off:.2f}x")
    print("\n".join(lines))
    write_section(f"async_speed.py --task {args.task}", "\n".join(lines))


if __name__ == "__main__":
    main()
