"""How well the planner predicts: profile once, predict every job of the placement sweep, run them, compare.

    .venv/bin/python benchmarks/planner_accuracy.py                      # CartPole and HalfCheetah, ~10 min
    .venv/bin/python benchmarks/planner_accuracy.py --tasks cartpole --out accuracy.json
    .venv/bin/python benchmarks/planner_accuracy.py --tasks arithmetic   # GRPO on the tiny LM, ~8 min

Per task: one profiling run (`runner.profile=true`, in the placement its family profiles in: embodied disaggregated
at 1 stage, reasoning hybrid; on the sweep's 4-device cluster), then the jobs of its placement sweep
(`sweep=placement_modes`: {collocated, disaggregated, hybrid} x {1, 2} stages x staleness {0, 1};
`sweep=reasoning_placements`: the three reasoning presets x staleness {0, 1}), each predicted from that one profile
before it runs (`plan.profile`, as `rlplace-plan` does), then run with the sweep's settings. The error is
|predicted - measured| / measured step time (the median of the measured steps after warm-up). Also: whether the
job the planner ranks first is the measured fastest, or within 5% of it; and `placement=auto` from the same profile,
run at each K, against the measured best of the sweep's jobs at that K. Each invocation writes its own section of
RESULTS.md, named by its tasks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from results import write_section

from rlplace.cli import compose_run
from rlplace.families import resolve

ROOT = Path(__file__).resolve().parents[1]
EMBODIED_SWEEP = ["cluster=local4", "cluster.max_oversubscription=6", "runner.max_steps=8"]
EMBODIED_SWEEP += ["runner.stop_when_solved=false", "runner.save_interval=0", "logger=jsonl"]
"""The settings of sweep=placement_modes, as plain overrides."""
REASONING_SWEEP = ["experiment=arithmetic_grpo", "cluster=local4", "cluster.max_oversubscription=8"]
REASONING_SWEEP += ["rollout.micro_batch_prompts=8", "runner.max_steps=8", "runner.eval_interval=100"]
REASONING_SWEEP += ["runner.save_interval=0", "logger=jsonl"]
"""The settings of sweep=reasoning_placements, as plain overrides."""


@dataclass(frozen=True)
class Task:
    base: list[str]
    profile: list[str]
    jobs: list[dict[str, str]]
    """Each job's labels: placement, stages (embodied) and K, which name the overrides that make it."""

    def overrides(self, job: dict[str, str]) -> list[str]:
        found = [f"placement={job['placement']}", f"runner.max_staleness={job['K']}"]
        return found + ([f"rollout.pipeline_stage_num={job['stages']}"] if job["stages"] != "-" else [])


def _embodied_jobs() -> list[dict[str, str]]:
    jobs = itertools.product(("collocated", "disaggregated", "hybrid"), ("1", "2"), ("0", "1"))
    return [{"placement": p, "stages": s, "K": k} for p, s, k in jobs]


EMBODIED_PROFILE = ["placement=disaggregated", "rollout.pipeline_stage_num=1", "runner.profile=true"]
TASKS = {
    "cartpole": Task(EMBODIED_SWEEP, EMBODIED_PROFILE, _embodied_jobs()),
    "halfcheetah": Task(["experiment=halfcheetah_pipeline", *EMBODIED_SWEEP], EMBODIED_PROFILE, _embodied_jobs()),
    "arithmetic": Task(
        REASONING_SWEEP,
        ["placement=reasoning_hybrid", "runner.profile=true"],
        [
            {"placement": f"reasoning_{p}", "stages": "-", "K": k}
            for p, k in itertools.product(("collocated", "disaggregated", "hybrid"), ("0", "1"))
        ],
    ),
}
DEFAULT_TASKS = ["cartpole", "halfcheetah"]


def train(overrides: list[str], run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "rlplace.train", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(overrides)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def predict(overrides: list[str], profile_dir: Path):
    """The family's prediction of the run, from the profile (`plan.profile`, as rlplace-plan and the run do)."""
    return resolve(compose_run([*overrides, f"plan.profile={profile_dir}"])).prediction


def phases(prediction, summary: dict) -> str:
    """Predicted/measured seconds of the main phases, to see where a prediction is off."""
    pairs = [("gen", "generate_rollouts"), ("train", "training"), ("sync", "sync_weights")]
    return "  ".join(
        f"{short} {prediction.phases[key]:.3f}/{summary.get(f'time/{key}', float('nan')):.3f}" for short, key in pairs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=list(TASKS))
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--keep", type=Path, help="keep the run folders here (default: a temporary folder)")
    args = parser.parse_args()
    rows = []
    autos = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        for task in args.tasks:
            spec = TASKS[task]
            profile_dir = Path(tmp) / f"{task}_profile"
            train([*spec.base, *spec.profile], profile_dir)
            for job in spec.jobs:
                overrides = [*spec.base, *spec.overrides(job)]
                prediction = predict(overrides, profile_dir)
                summary = train(overrides, Path(tmp) / f"{task}_{'_'.join(job.values())}")
                predicted, measured = prediction.step_s, summary["time/step"]
                row = {"task": task, **job}
                row |= {"predicted_s": predicted, "measured_s": measured, "error": abs(predicted - measured) / measured}
                rows.append(row)
                print(
                    f"{task:<12} {job['placement']:<24} {job['stages']} {job['K']}  predicted {predicted:6.3f} s  "
                    f"measured {measured:6.3f} s  error {row['error']:6.1%}   {phases(prediction, summary)}",
                    flush=True,
                )
            for staleness in ("0", "1"):
                auto = ["placement=auto", f"plan.profile={profile_dir}", f"runner.max_staleness={staleness}"]
                run_dir = Path(tmp) / f"{task}_auto_{staleness}"
                measured = train([*spec.base, *auto], run_dir)["time/step"]
                chosen = json.loads((run_dir / "run.json").read_text())["auto"]
                autos.append({"task": task, "K": staleness, "measured_s": measured, **chosen})
                print(f"{task:<12} auto K={staleness}  measured {measured:6.3f} s  {chosen['overrides']}", flush=True)
    errors = [r["error"] for r in rows]
    summary = [f"error over {len(rows)} jobs: median {statistics.median(errors):.1%}, max {max(errors):.1%}"]
    print(f"\n{summary[0]}")
    for task in args.tasks:
        jobs = [r for r in rows if r["task"] == task]
        chosen = min(jobs, key=lambda r: r["predicted_s"])
        best = min(jobs, key=lambda r: r["measured_s"])
        summary.append(
            f"{task}: planner's choice {title(chosen)} measured {chosen['measured_s']:.3f} s; measured best "
            f"{title(best)} {best['measured_s']:.3f} s ({chosen['measured_s'] / best['measured_s'] - 1:+.1%})"
        )
        print(summary[-1])
        for auto in (a for a in autos if a["task"] == task):
            same_k = [r for r in jobs if r["K"] == auto["K"]]
            best = min(same_k, key=lambda r: r["measured_s"])
            summary.append(
                f"{task} placement=auto K={auto['K']}: ran `{auto['overrides']}`, measured "
                f"{auto['measured_s']:.3f} s (predicted {auto['predicted_step_s']:.3f} s); the sweep's measured best "
                f"at K={auto['K']}: {title(best)} {best['measured_s']:.3f} s "
                f"({auto['measured_s'] / best['measured_s'] - 1:+.1%})"
            )
            print(summary[-1])
    table = ["| task | placement | stages | K | predicted s | measured s | error |", "|---|---|---|---|---|---|---|"]
    table += [
        f"| {r['task']} | {r['placement']} | {r['stages']} | {r['K']} | {r['predicted_s']:.3f} "
        f"| {r['measured_s']:.3f} | {r['error']:.1%} |"
        for r in rows
    ]
    name = "planner_accuracy.py" + ("" if args.tasks == DEFAULT_TASKS else f" --tasks {' '.join(args.tasks)}")
    write_section(name, "\n".join([*table, "", *(f"- {line}" for line in summary)]))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


def title(row: dict) -> str:
    stages = "" if row["stages"] == "-" else f" {row['stages']} stage(s)"
    return f"{row['placement']}{stages} K={row['K']}"


if __name__ == "__main__":
    main()
