"""What one re-placement costs (`runner.replace_at`): a run moved to another placement preset while it runs.

Per task, one run of `--steps` steps re-placed after half of them, started as `rlplace-train` is. The switch's cost
is the time from the end of the step before it (its checkpoint included) to the next step's start, when the new
workers hold the checkpoint's state (run.json's `replaced`); next to it, the steps' median times before and after.

`--benefit`: whether the planner's own moves pay (`runner.replan_interval`). The HalfCheetah preset on `cluster=local4`
(the placement sweep's cluster) is profiled once (disaggregated, 1 stage), then run `--benefit-steps` steps three
ways: started in the sweep's slowest placement and staying there, started there with `runner.replan_interval`, and
started in the sweep's best; each run's wall time from the command to its exit. The runs are long enough that what a
re-plan gains shows next to what no re-plan can: the start-up of the placement a run starts in, a fixed cost (many
more processes in the slowest placement than in the best) that a short run would mostly measure.

    .venv/bin/python benchmarks/replace.py [--steps 8] [--benefit [--benefit-steps 300]]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
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


SWEEP = ["experiment=halfcheetah_pipeline", "cluster=local4", "cluster.max_oversubscription=6", "logger=jsonl"]
SWEEP += ["runner.stop_when_solved=false", "runner.save_interval=null"]
SLOWEST = ["placement=collocated", "rollout.pipeline_stage_num=2"]
BEST = ["placement=disaggregated", "rollout.pipeline_stage_num=2"]
"""The slowest and the fastest synchronous job of the placement sweep here (the planner_accuracy.py section)."""


def benefit(steps: int, folder: Path) -> str:
    profile = folder / "profile"
    profiling = ["placement=disaggregated", "rollout.pipeline_stage_num=1", "runner.profile=true", "runner.max_steps=6"]
    subprocess.run(
        [sys.executable, "-m", "rlplace.train", *SWEEP, *profiling, f"hydra.run.dir={profile}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=900,
    )
    runs = {
        "slowest placement, staying": SLOWEST,
        "slowest placement, runner.replan_interval=5": [
            *SLOWEST,
            f"plan.profile={profile}",
            "runner.replan_interval=5",
        ],
        "best placement": BEST,
    }
    lines = ["| run | wall s | steps s | moves |", "|---|---|---|---|"]
    for name, overrides in runs.items():
        run_dir = folder / name.split(",")[0].replace(" ", "_") / str(len(lines))
        cmd = [sys.executable, "-m", "rlplace.train", *SWEEP, *overrides, f"runner.max_steps={steps}"]
        start = time.monotonic()
        subprocess.run([*cmd, f"hydra.run.dir={run_dir}"], cwd=REPO, check=True, capture_output=True, timeout=1800)
        wall = time.monotonic() - start
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        moves = json.loads((run_dir / "run.json").read_text()).get("replaced", [])
        moved = "; ".join(f"after step {m['step']} to `{m['to']}` in {m['seconds']:.1f} s" for m in moves) or "none"
        lines.append(f"| {name} | {wall:.0f} | {sum(r['time/step'] for r in rows):.0f} | {moved} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--benefit", action="store_true", help="also: the planner's own moves against staying")
    parser.add_argument("--benefit-steps", type=int, default=300)
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
        if args.benefit:
            table += f"\n\nHalfCheetah, {args.benefit_steps} steps on cluster=local4:\n\n" + benefit(
                args.benefit_steps, Path(tmp)
            )
    print(table)
    write_section("replace.py", table)


if __name__ == "__main__":
    main()
