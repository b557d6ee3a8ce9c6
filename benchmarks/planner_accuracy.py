"""How well the planner predicts: profile once, predict every job of the placement sweep, run them, compare.

    .venv/bin/python benchmarks/planner_accuracy.py                      # CartPole and HalfCheetah, ~10 min
    .venv/bin/python benchmarks/planner_accuracy.py --tasks cartpole --out accuracy.json

Per task: one profiling run (`runner.profile=true`, disaggregated, 1 stage, on the sweep's 4-device cluster), then
the 12 jobs of `sweep=placement_modes` ({collocated, disaggregated, hybrid} x {1, 2} stages x staleness {0, 1}),
each predicted from that one profile before it runs, then run with the sweep's settings. The error is
|predicted - measured| / measured step time (the median of the measured steps after warm-up). Also: whether the
job the planner ranks first is the measured fastest, or within 5% of it; and `placement=auto` from the same profile,
run at each K, against the measured best of the sweep's jobs at that K.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from results import write_section

from rlplace.cli import compose_run
from rlplace.embodied import planning
from rlplace.families import resolve

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"cartpole": [], "halfcheetah": ["experiment=halfcheetah_pipeline"]}
SWEEP = ["cluster=local4", "cluster.max_oversubscription=6", "runner.max_steps=8", "runner.stop_when_solved=false"]
SWEEP += ["runner.save_interval=0", "logger=jsonl"]
"""The settings of sweep=placement_modes, as plain overrides."""
PROFILE = ["placement=disaggregated", "rollout.pipeline_stage_num=1", "runner.profile=true"]


def train(overrides: list[str], run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "rlplace.train", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(overrides)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def predict(overrides: list[str], model: planning.StepModel) -> planning.Prediction:
    plan = resolve(compose_run(overrides))
    return planning.predict_run(model, plan.cfg, plan.placement)


def phases(prediction: planning.Prediction, summary: dict) -> str:
    """Predicted/measured seconds of the main phases, to see where a prediction is off."""
    pairs = [("gen", "generate_rollouts"), ("train", "training"), ("sync", "sync_weights")]
    return "  ".join(
        f"{short} {prediction.phases[key]:.3f}/{summary.get(f'time/{key}', float('nan')):.3f}" for short, key in pairs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--keep", type=Path, help="keep the run folders here (default: a temporary folder)")
    args = parser.parse_args()
    rows = []
    autos = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        for task in args.tasks:
            base = [*TASKS[task], *SWEEP]
            profile_dir = Path(tmp) / f"{task}_profile"
            train([*base, *PROFILE], profile_dir)
            model = planning.load_model(profile_dir, resolve(compose_run(base)).cfg.task.env_id)
            jobs = itertools.product(("collocated", "disaggregated", "hybrid"), (1, 2), (0, 1))
            for placement, stages, staleness in jobs:
                job = [f"placement={placement}", f"rollout.pipeline_stage_num={stages}"]
                job.append(f"runner.max_staleness={staleness}")
                prediction = predict([*base, *job], model)
                summary = train([*base, *job], Path(tmp) / f"{task}_{placement}_{stages}_{staleness}")
                predicted, measured = prediction.step_s, summary["time/step"]
                row = {"task": task, "placement": placement, "stages": stages, "staleness": staleness}
                row |= {"predicted_s": predicted, "measured_s": measured, "error": abs(predicted - measured) / measured}
                rows.append(row)
                print(
                    f"{task:<12} {placement:<14} {stages} {staleness}  predicted {predicted:6.3f} s  measured "
                    f"{measured:6.3f} s  error {row['error']:6.1%}   {phases(prediction, summary)}",
                    flush=True,
                )
            for staleness in (0, 1):
                auto = ["placement=auto", f"plan.profile={profile_dir}", f"runner.max_staleness={staleness}"]
                run_dir = Path(tmp) / f"{task}_auto_{staleness}"
                measured = train([*base, *auto], run_dir)["time/step"]
                chosen = json.loads((run_dir / "run.json").read_text())["auto"]
                autos.append({"task": task, "staleness": staleness, "measured_s": measured, **chosen})
                print(f"{task:<12} auto K={staleness}  measured {measured:6.3f} s  {chosen['overrides']}", flush=True)
    errors = [r["error"] for r in rows]
    summary = [f"error over {len(rows)} jobs: median {statistics.median(errors):.1%}, max {max(errors):.1%}"]
    print(f"\n{summary[0]}")
    for task in args.tasks:
        jobs = [r for r in rows if r["task"] == task]
        chosen = min(jobs, key=lambda r: r["predicted_s"])
        best = min(jobs, key=lambda r: r["measured_s"])
        summary.append(
            f"{task}: planner's choice {chosen['placement']} {chosen['stages']} stage(s) K={chosen['staleness']} "
            f"measured {chosen['measured_s']:.3f} s; measured best {best['placement']} {best['stages']} "
            f"K={best['staleness']} {best['measured_s']:.3f} s ({chosen['measured_s'] / best['measured_s'] - 1:+.1%})"
        )
        print(summary[-1])
        for auto in (a for a in autos if a["task"] == task):
            same_k = [r for r in jobs if r["staleness"] == auto["staleness"]]
            best = min(same_k, key=lambda r: r["measured_s"])
            summary.append(
                f"{task} placement=auto K={auto['staleness']}: ran `{auto['overrides']}`, measured "
                f"{auto['measured_s']:.3f} s (predicted {auto['predicted_step_s']:.3f} s); the sweep's measured best "
                f"at K={auto['staleness']}: {best['placement']} {best['stages']} stage(s) {best['measured_s']:.3f} s "
                f"({auto['measured_s'] / best['measured_s'] - 1:+.1%})"
            )
            print(summary[-1])
    table = ["| task | placement | stages | K | predicted s | measured s | error |", "|---|---|---|---|---|---|---|"]
    table += [
        f"| {r['task']} | {r['placement']} | {r['stages']} | {r['staleness']} | {r['predicted_s']:.3f} "
        f"| {r['measured_s']:.3f} | {r['error']:.1%} |"
        for r in rows
    ]
    write_section("planner_accuracy.py", "\n".join([*table, "", *(f"- {line}" for line in summary)]))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
