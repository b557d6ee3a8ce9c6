"""How well the planner predicts: profile, predict every job of the placement sweep, run them, compare; in rounds.

    .venv/bin/python benchmarks/planner_accuracy.py                      # CartPole and HalfCheetah, ~23 min
    .venv/bin/python benchmarks/planner_accuracy.py --tasks cartpole --rounds 3 --out accuracy.json
    .venv/bin/python benchmarks/planner_accuracy.py --tasks arithmetic   # GRPO on the tiny LM

Per task and round: one profiling run (`runner.profile=true`, in the placement its family profiles in: embodied
disaggregated at 1 stage, reasoning hybrid; on the sweep's 4-device cluster), then the jobs of its placement sweep
(`sweep=placement_modes`: {collocated, disaggregated, hybrid} x {1, 2} stages x staleness {0, 1};
`sweep=reasoning_placements`: the three reasoning presets x staleness {0, 1}), each predicted from that round's
profile before it runs (`plan.profile`, as `rlplace-plan` does), then run with the sweep's settings. A job's
predicted and measured step (the median of its steps after warm-up) are their medians over the rounds (`--rounds`,
default 2): on a shared machine one job's step time moves between runs minutes apart, and rounds spread the
profile and the jobs over the same stretch of time. The error is |predicted - measured| / measured; the table also
gives how far the rounds' measurements of a job were apart. Also: whether the job the planner ranks first is the
measured fastest, or within 5% of it; and `placement=auto` from each round's profile, run at each K in that round,
its median measured step against the measured best of the sweep's jobs at that K (both medians over the rounds: a
single run against the least of twelve medians would mostly measure the machine). Each invocation writes its own
section of RESULTS.md, named by its tasks.
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


Seen = dict[tuple[str, ...], dict[str, list[float]]]
"""(task, placement, stages, K) -> each round's predicted and measured step."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=list(TASKS))
    parser.add_argument("--rounds", type=int, default=2, help="profile and run every job this many times (default 2)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--keep", type=Path, help="keep the run folders here (default: a temporary folder)")
    args = parser.parse_args()
    seen: Seen = {}
    autos: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        for round_ in range(args.rounds):
            for task in args.tasks:
                profile_dir = run_round(task, round_, tmp, seen)
                autos += run_autos(task, round_, profile_dir, tmp)
    rows, text = report(seen, autos, args.tasks, args.rounds)
    name = "planner_accuracy.py" + ("" if args.tasks == DEFAULT_TASKS else f" --tasks {' '.join(args.tasks)}")
    write_section(name, text)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


def run_round(task: str, round_: int, tmp: Path, seen: Seen) -> Path:
    """Profile `task`, then predict and run each job of its sweep, adding both to `seen`; the profile's folder."""
    spec = TASKS[task]
    profile_dir = tmp / f"{task}_profile_{round_}"
    train([*spec.base, *spec.profile], profile_dir)
    for job in spec.jobs:
        overrides = [*spec.base, *spec.overrides(job)]
        prediction = predict(overrides, profile_dir)
        summary = train(overrides, tmp / f"{task}_{'_'.join(job.values())}_{round_}")
        found = seen.setdefault((task, *job.values()), {"predicted_s": [], "measured_s": []})
        found["predicted_s"].append(prediction.step_s)
        found["measured_s"].append(summary["time/step"])
        print(
            f"round {round_} {task:<12} {job['placement']:<24} {job['stages']} {job['K']}  predicted "
            f"{prediction.step_s:6.3f} s  measured {summary['time/step']:6.3f} s   {phases(prediction, summary)}",
            flush=True,
        )
    return profile_dir


def run_autos(task: str, round_: int, profile_dir: Path, tmp: Path) -> list[dict]:
    """`placement=auto` from the round's profile at each K, run: what it chose, predicted and measured."""
    autos = []
    for staleness in ("0", "1"):
        auto = ["placement=auto", f"plan.profile={profile_dir}", f"runner.max_staleness={staleness}"]
        run_dir = tmp / f"{task}_auto_{staleness}_{round_}"
        measured = train([*TASKS[task].base, *auto], run_dir)["time/step"]
        chosen = json.loads((run_dir / "run.json").read_text())["auto"]
        autos.append({"task": task, "K": staleness, "measured_s": measured, **chosen})
        print(
            f"round {round_} {task:<12} auto K={staleness}  predicted {chosen['predicted_step_s']:6.3f} s  "
            f"measured {measured:6.3f} s  {chosen['overrides']}",
            flush=True,
        )
    return autos


def report(seen: Seen, autos: list[dict], tasks: list[str], rounds: int) -> tuple[list[dict], str]:
    """Each job's medians over the rounds and their error, and the section's text: the table, then the summary."""
    rows = []
    for (task, *labels), found in seen.items():
        row = {"task": task, **dict(zip(("placement", "stages", "K"), labels, strict=True))}
        row |= {key: statistics.median(values) for key, values in found.items()}
        row["error"] = abs(row["predicted_s"] - row["measured_s"]) / row["measured_s"]
        row["spread"] = (max(found["measured_s"]) - min(found["measured_s"])) / row["measured_s"]
        rows.append(row)
    errors, spreads = [r["error"] for r in rows], [r["spread"] for r in rows]
    summary = [
        f"error over {len(rows)} jobs: median {statistics.median(errors):.1%}, max {max(errors):.1%}",
        f"{rounds} rounds; predicted and measured are each job's medians over them; a job's measured step moved "
        f"between rounds by median {statistics.median(spreads):.1%}, max {max(spreads):.1%}",
    ]
    for task in tasks:
        jobs = [r for r in rows if r["task"] == task]
        chosen = min(jobs, key=lambda r: r["predicted_s"])
        best = min(jobs, key=lambda r: r["measured_s"])
        summary.append(
            f"{task}: planner's choice {title(chosen)} measured {chosen['measured_s']:.3f} s; measured best "
            f"{title(best)} {best['measured_s']:.3f} s ({chosen['measured_s'] / best['measured_s'] - 1:+.1%})"
        )
        for staleness in sorted({a["K"] for a in autos if a["task"] == task}):
            runs = [a for a in autos if a["task"] == task and a["K"] == staleness]
            measured = statistics.median(a["measured_s"] for a in runs)
            predicted = statistics.median(a["predicted_step_s"] for a in runs)
            ran = "; ".join(f"`{choice}`" for choice in dict.fromkeys(a["overrides"] for a in runs))
            best = min((r for r in jobs if r["K"] == staleness), key=lambda r: r["measured_s"])
            summary.append(
                f"{task} placement=auto K={staleness}: ran {ran}, measured {measured:.3f} s (predicted "
                f"{predicted:.3f} s; medians over {len(runs)} rounds); the sweep's measured best at K={staleness}: "
                f"{title(best)} {best['measured_s']:.3f} s ({measured / best['measured_s'] - 1:+.1%})"
            )
    print("\n" + "\n".join(summary))
    table = ["| task | placement | stages | K | predicted s | measured s | error | measured spread |"]
    table += ["|---|---|---|---|---|---|---|---|"]
    table += [
        f"| {r['task']} | {r['placement']} | {r['stages']} | {r['K']} | {r['predicted_s']:.3f} "
        f"| {r['measured_s']:.3f} | {r['error']:.1%} | {r['spread']:.1%} |"
        for r in rows
    ]
    return rows, "\n".join([*table, "", *(f"- {line}" for line in summary)])


def title(row: dict) -> str:
    stages = "" if row["stages"] == "-" else f" {row['stages']} stage(s)"
    return f"{row['placement']}{stages} K={row['K']}"


if __name__ == "__main__":
    main()
