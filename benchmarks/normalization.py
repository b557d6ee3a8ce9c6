"""HalfCheetah with and without CleanRL's running normalisation (`task.normalize_observation=true
task.normalize_reward=true`): the mean return of the last 20 episodes after the same number of env steps.

For each seed the script runs, one after the other as subprocesses, `rlplace-train task=halfcheetah runner.seed=N
runner.max_steps=STEPS logger=jsonl` (the task's default PPO settings, 8 sub-envs, hybrid placement on
cluster=local) without and then with normalisation (both parts set either way), and reads `env/return_last20` and
`env/total_steps` from the last row of metrics.jsonl. Returns are in the simulator's own rewards either way, so the
columns compare directly. The table ends with the medians over seeds and refreshes the section of
benchmarks/RESULTS.md.

    python benchmarks/normalization.py                     # seeds 1 2, 300 steps of 256 env steps, ~7 minutes
    python benchmarks/normalization.py --seeds 1 --steps 100
"""

from __future__ import annotations

import argparse
import statistics

from results import write_section
from runs import train


def normalisation(on: bool) -> list[str]:
    """The overrides that turn both parts on or off (the task's option file turns them on)."""
    return [f"task.normalize_observation={str(on).lower()}", f"task.normalize_reward={str(on).lower()}"]


def run(seed: int, steps: int, normalised: bool) -> dict[str, float]:
    """One training run's last metrics row."""
    overrides = ["task=halfcheetah", f"runner.seed={seed}", f"runner.max_steps={steps}", *normalisation(normalised)]
    return train(overrides).last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    lines = ["| seed | env steps | return, raw | return, normalised |", "|---|---|---|---|"]
    raw, normalised = [], []
    for seed in args.seeds:
        plain, norm = run(seed, args.steps, False), run(seed, args.steps, True)
        raw.append(plain["env/return_last20"])
        normalised.append(norm["env/return_last20"])
        lines.append(f"| {seed} | {int(plain['env/total_steps'])} | {raw[-1]:.1f} | {normalised[-1]:.1f} |")
        print(lines[-1], flush=True)
    lines.append(f"| median | | {statistics.median(raw):.1f} | {statistics.median(normalised):.1f} |")
    table = "\n".join(lines)
    print(table)
    write_section("normalization.py", f"`task=halfcheetah runner.max_steps={args.steps}`.\n\n{table}")


if __name__ == "__main__":
    main()
