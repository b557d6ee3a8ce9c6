"""What one re-placement costs (`runner.replace_at`): a run moved to another placement preset while it runs.

Per task, one run of `--steps` steps re-placed after half of them, started as `rlplace-train` is. The switch's cost
is the time from the end of the step before it (its checkpoint included) to the next step's start, when the new
workers hold the checkpoint's state (run.json's `replaced`); next to it, the steps' median times before and after.

    .venv/bin/python benchmarks/replace.py [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from results import write_section

REPO = Path(__file__).resolve().parent.parent
TASKS = {
    "embodied default (CartPole, hybrid -> collocated)": (["runner.stop_when_solved=false"], "collocated"),
    "arithmetic GRPO (reasoning_collocated -> reasoning_hybrid)": (
        ["experiment=arithmetic_grpo", "runner.eval_interval=1000"],
        "reasoning_hybrid",
    ),
}


def measure(name: str, overrides: list[str], preset: str, steps: int, folder: Path) -> str:
    run_dir = folder / name.split(" ")[0]
    switch_at = steps // 2
    cmd = [sys.executable, "-m", "rlplace.train", *overrides, f"runner.max_steps={steps}", "logger=jsonl"]
    cmd += [f"runner.replace_at=[{switch_at}:{preset}]", "runner.save_interval=null", f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=900)
    (replaced,) = json.loads((run_dir / "run.json").read_text())["replaced"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    before = statistics.median(r["time/step"] for r in rows if 2 <= r["step"] < switch_at)
    after = statistics.median(r["time/step"] for r in rows if r["step"] > switch_at)
    return f"| {name} | {switch_at} | {replaced['seconds']:.2f} | {before:.3f} | {after:.3f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    lines = [
        "| run | re-placed after step | switch s | step s before | step s after (first one left out) |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, (overrides, preset) in TASKS.items():
            lines.append(measure(name, overrides, preset, args.steps, Path(tmp)))
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    write_section("replace.py", table)


if __name__ == "__main__":
    main()
