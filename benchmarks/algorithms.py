"""The reasoning algorithms on `experiment=arithmetic_grpo`: held-out accuracy before and after the same number of
steps, for each `algorithm` option of the GRPO family and RLOO.

For each seed and algorithm the script runs, one after the other as subprocesses, `rlplace-train
experiment=arithmetic_grpo algorithm=ALG runner.seed=N runner.max_steps=STEPS logger=jsonl` (the preset's sizes and
learning-rate schedule; each option's own loss settings) and reads the run's summary.json. Every run starts from the
same pretrained tiny LM (cached in a folder the runs share) and is evaluated on the same held-out problems. The table
ends with the medians over seeds and refreshes the section of benchmarks/RESULTS.md. The accuracies do not depend on
the machine's load (a run's numbers are a function of its seeds), so nothing here is timed.

    python benchmarks/algorithms.py                        # seeds 1 2, 300 steps, ~25 minutes on 2 cores
    python benchmarks/algorithms.py --seeds 1 --steps 100 --algorithms grpo gspo
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from results import publish
from runs import train

ALGORITHMS = ("grpo", "dr_grpo", "gspo", "rloo")


def run(algorithm: str, seed: int, steps: int, cache: str) -> dict[str, float]:
    """One training run's summary."""
    overrides = [f"algorithm={algorithm}", f"runner.seed={seed}", f"runner.max_steps={steps}"]
    return train(["experiment=arithmetic_grpo", *overrides, "runner.save_interval=null"], cache).summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    args = parser.parse_args()
    lines = ["| algorithm | seed | held-out accuracy before -> after |", "|---|---|---|"]
    after: dict[str, list[float]] = {name: [] for name in args.algorithms}
    with tempfile.TemporaryDirectory(prefix="rlplace-alg-cache-") as cache:
        for seed in args.seeds:
            for name in args.algorithms:
                summary = run(name, seed, args.steps, cache)
                after[name].append(summary["eval/accuracy_after"])
                before = summary["eval/accuracy_before"]
                lines.append(f"| `{name}` | {seed} | {before:.3f} -> {after[name][-1]:.3f} |")
                print(lines[-1], flush=True)
    lines += [f"| `{name}` | median | {statistics.median(values):.3f} |" for name, values in after.items()]
    command = f"`experiment=arithmetic_grpo runner.max_steps={args.steps}`, seeds {', '.join(map(str, args.seeds))}"
    publish("algorithms.py", f"{command}.", lines)


if __name__ == "__main__":
    main()
