"""LoRA adapters (`actor.lora`) against training every weight, on `experiment=arithmetic_grpo`: held-out accuracy
before and after the same steps, and the medians of a step and of its training phase.

Each variant is one `rlplace-train experiment=arithmetic_grpo runner.seed=N runner.max_steps=STEPS` run (the preset's
sizes and learning-rate schedule; adapters of rank 16, alpha 32, on every linear layer; LoRA at the preset's learning
rate and at ten times it, as adapters usually want), one after the other as subprocesses from the same pretrained
tiny LM. Accuracies are a function of the seed; the times are this machine's, the variants run in turn.

    python benchmarks/lora.py                  # seed 1, 300 steps, ~10 minutes on 2 cores
    python benchmarks/lora.py --steps 100
"""

from __future__ import annotations

import argparse
import tempfile

from results import publish
from runs import train

ADAPTERS = ["actor.lora.rank=16", "actor.lora.alpha=32"]
VARIANTS = {
    "every weight": [],
    "LoRA 16": ADAPTERS,
    "LoRA 16, lr x 10": [*ADAPTERS, "algorithm.lr=1e-3"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    lines = [
        "| trains | held-out accuracy before -> after | step (median) | training phase (median) |",
        "|---|---|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="rlplace-lora-cache-") as cache:
        for name, overrides in VARIANTS.items():
            summary = train(
                [
                    "experiment=arithmetic_grpo",
                    f"runner.seed={args.seed}",
                    f"runner.max_steps={args.steps}",
                    "runner.save_interval=null",
                    *overrides,
                ],
                cache,
            ).summary
            before, after = summary["eval/accuracy_before"], summary["eval/accuracy_after"]
            lines.append(
                f"| {name} (`{' '.join(overrides) or 'the preset'}`) | {before:.3f} -> {after:.3f} | "
                f"{summary['time/step']:.3f} s | {summary['time/training']:.3f} s |"
            )
            print(lines[-1], flush=True)
    command = f"`experiment=arithmetic_grpo runner.max_steps={args.steps} runner.seed={args.seed}`"
    publish("lora.py", f"{command}; the tiny LM's 1.2 M parameters.", lines)


if __name__ == "__main__":
    main()
