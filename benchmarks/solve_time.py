"""Time to solve CartPole: rlplace's default run (`make run`) against the single-process CleanRL PPO baseline.

Solved = the mean return of the last 20 finished episodes >= 475, as both systems define it. For each seed the
script runs, as subprocesses and one after the other:

  rlplace   `rlplace-train runner.seed=N logger=none` (the default experiment: cartpole, ppo, hybrid placement on
            cluster=local; the tracker off so wandb's start-up is not timed), outputs in a temporary
            $RLPLACE_OUTPUT_DIR that is deleted afterwards. It stops by itself once solved.
  baseline  `python benchmarks/cleanrl_ppo_baseline.py --seeds N` (unchanged, single process, 1 torch thread).

and records, per run:

  train s      training seconds to solve. rlplace: the sum of `time/step` (sync weights, rollouts, advantages,
               training) over the steps up to and including the solving one, from metrics.jsonl: Ray and worker
               start-up and checkpoint saves are left out. Baseline: its own clock, from envs and agent created to
               the rollout that solves it (its update on that last batch is not timed).
  env steps    env steps taken up to the solving step (`env/total_steps`; the baseline's printed env_steps).
  env steps/s  env steps / train s.
  wall s       the whole command, process start to exit (imports, Ray start-up, checkpoints, shutdown included).

Why alternate (rlplace seed 1, baseline seed 1, rlplace seed 2, ...) rather than all of one system and then all of
the other: on a small shared machine the background load drifts over minutes, and interleaving makes whatever
noise there is fall on both systems alike instead of on one. The table ends with each system's medians over its
solved runs and the ratios rlplace / baseline for training time to solve (the goal: <= 1.0) and for wall time.

    python benchmarks/solve_time.py                 # seeds 1 2 3, about 5 minutes on 2 cores
    python benchmarks/solve_time.py --seeds 1       # one pair, about 1.5 minutes
    python benchmarks/solve_time.py --rlplace-args 'placement=collocated' --baseline-args='--threads 2'
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from results import write_section

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "benchmarks" / "cleanrl_ppo_baseline.py"
TARGET = 475.0
"""CartPole's solved return: task.solved_return of conf/task/cartpole.yaml and the baseline's --target default."""
WINDOW = 20
"""Episodes in the return window of both systems."""
BASELINE_ROW = re.compile(r"^\s*(\d+)\s+(True|False)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$")
"""A result row of the baseline: seed, solved, env_steps, wall_s, env_steps/s."""
RLPLACE_DONE = re.compile(r"rlplace: done: .*?([\d.]+|nan) env steps/s over the run")


@dataclass
class Result:
    system: str
    seed: int
    ok: bool
    """The command exited 0 and its numbers were read."""
    solved: bool = False
    train_s: float = math.nan
    env_steps: float = math.nan
    wall_s: float = math.nan
    steps: int | None = None
    """rlplace training steps run (up to the solving one when solved)."""
    note: str = ""

    @property
    def env_steps_per_s(self) -> float:
        return self.env_steps / self.train_s if self.train_s > 0 else math.nan


def rlplace_command(seed: int, extra: list[str]) -> list[str]:
    exe = Path(sys.executable).parent / "rlplace-train"
    if not exe.exists():
        exe = Path(shutil.which("rlplace-train") or REPO / ".venv" / "bin" / "rlplace-train")
    return [str(exe), f"runner.seed={seed}", "logger=none", *extra]


def baseline_command(seed: int, extra: list[str]) -> list[str]:
    return [sys.executable, str(BASELINE), "--seeds", str(seed), *extra]


def run_command(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str, float]:
    """(exit code, stdout and stderr together, wall seconds); exit code -1 on timeout. The command runs in a session
    of its own, so that on timeout its whole process group (Ray's processes of an rlplace run too) is ended."""
    start = time.perf_counter()
    with subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            return -1, f"{output}\n[timed out after {timeout_s:.0f} s]", time.perf_counter() - start
        return proc.returncode, output, time.perf_counter() - start


def failed(result: Result, cmd: list[str], code: int, output: str) -> Result:
    tail = "\n".join(output.strip().splitlines()[-25:])
    print(f"\n{result.system} seed {result.seed}: `{shlex.join(cmd)}` exited {code}:\n{tail}\n", file=sys.stderr)
    result.note = f"exit {code}"
    return result


def read_rlplace_run(out_dir: Path, result: Result) -> Result:
    """Fill `result` from the run folder's metrics.jsonl: the first step whose return window is full and >= 475."""
    found = sorted(out_dir.rglob("metrics.jsonl"))
    if len(found) != 1:
        result.ok, result.note = False, f"{len(found)} metrics.jsonl files under {out_dir}"
        return result
    rows = [json.loads(line) for line in found[0].read_text().splitlines() if line.strip()]
    rows.sort(key=lambda row: row["step"])
    seconds, episodes = 0.0, 0
    for row in rows:
        seconds += row["time/step"]
        episodes += int(row.get("env/episodes", 0))
        result.train_s, result.env_steps, result.steps = seconds, row["env/total_steps"], row["step"] + 1
        if episodes >= WINDOW and row.get("env/return_last20", math.nan) >= TARGET:
            result.solved = True
            break
    if not rows:
        result.ok, result.note = False, "metrics.jsonl is empty"
    return result


def run_rlplace(seed: int, extra: list[str], timeout_s: float, keep: Path | None) -> Result:
    result = Result("rlplace", seed, ok=True)
    cmd = rlplace_command(seed, extra)
    out_dir = Path(tempfile.mkdtemp(prefix=f"solve_time_rlplace_s{seed}_", dir=keep))
    env = {**os.environ, "RLPLACE_OUTPUT_DIR": str(out_dir)}
    try:
        code, output, result.wall_s = run_command(cmd, env, timeout_s)
        if code != 0:
            result.ok = False
            return failed(result, cmd, code, output)
        read_rlplace_run(out_dir, result)
        done = RLPLACE_DONE.search(output)
        if done:  # the run's own figure, process start-up excluded but checkpoints included
            result.note = f"its final line: {float(done.group(1)):.0f} env steps/s over the run"
        return result
    finally:
        if keep is None:
            shutil.rmtree(out_dir, ignore_errors=True)


def run_baseline(seed: int, extra: list[str], timeout_s: float) -> Result:
    result = Result("baseline", seed, ok=True)
    cmd = baseline_command(seed, extra)
    code, output, result.wall_s = run_command(cmd, dict(os.environ), timeout_s)
    if code != 0:
        result.ok = False
        return failed(result, cmd, code, output)
    rows = [m for m in map(BASELINE_ROW.match, output.splitlines()) if m and int(m.group(1)) == seed]
    if len(rows) != 1:
        result.ok = False
        return failed(result, cmd, code, output + "\n[no result row for this seed in the output]")
    _, solved, env_steps, train_s, _ = rows[0].groups()
    result.solved, result.env_steps, result.train_s = solved == "True", float(env_steps), float(train_s)
    return result


def fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def median(results: list[Result], field: str) -> float:
    values = [getattr(r, field) for r in results if r.ok and r.solved]
    return statistics.median(values) if values else math.nan


def table(results: list[Result]) -> str:
    header = ["seed", "system", "solved", "train s to solve", "env steps to solve", "env steps/s", "wall s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    for r in results:
        solved = ("yes" if r.solved else "NO") if r.ok else f"FAILED ({r.note})"
        if r.ok and r.steps is not None:
            solved += f" ({r.steps} steps)"
        cells = [str(r.seed), r.system, solved, fmt(r.train_s), fmt(r.env_steps, 0), fmt(r.env_steps_per_s, 0)]
        lines.append("| " + " | ".join([*cells, fmt(r.wall_s)]) + " |")
    medians: dict[str, dict[str, float]] = {}
    for system in ("rlplace", "baseline"):
        mine = [r for r in results if r.system == system]
        n_solved = sum(r.ok and r.solved for r in mine)
        medians[system] = {f: median(mine, f) for f in ("train_s", "env_steps", "env_steps_per_s", "wall_s")}
        m = medians[system]
        cells = ["median", system, f"{n_solved}/{len(mine)} solved", fmt(m["train_s"]), fmt(m["env_steps"], 0)]
        lines.append("| " + " | ".join([*cells, fmt(m["env_steps_per_s"], 0), fmt(m["wall_s"])]) + " |")
    ratio = {f: medians["rlplace"][f] / medians["baseline"][f] for f in medians["rlplace"]}
    cells = ["ratio", "rlplace/baseline", "", fmt(ratio["train_s"], 2), fmt(ratio["env_steps"], 2)]
    lines.append("| " + " | ".join([*cells, fmt(ratio["env_steps_per_s"], 2), fmt(ratio["wall_s"], 2)]) + " |")
    verdict = "met" if ratio["train_s"] <= 1.0 else ("not met" if math.isfinite(ratio["train_s"]) else "unknown")
    lines += [
        "",
        f"training time to solve, rlplace median / baseline median: {fmt(ratio['train_s'], 2)} "
        f"(goal <= 1.0: {verdict})",
        f"whole-command wall time, rlplace median / baseline median: {fmt(ratio['wall_s'], 2)}",
        "(medians over solved runs only)",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds, each run by both systems")
    parser.add_argument(
        "--rlplace-args",
        type=shlex.split,
        default=[],
        metavar="'OVERRIDES'",
        help="extra Hydra overrides for rlplace-train, one quoted string (after runner.seed=N logger=none)",
    )
    parser.add_argument(
        "--baseline-args",
        type=shlex.split,
        default=[],
        metavar="'FLAGS'",
        help="extra flags for cleanrl_ppo_baseline.py, one quoted string, e.g. --baseline-args='--threads 2'",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before one run is abandoned")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep rlplace's run folders under this folder instead of deleting them"
    )
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)

    extra = f" {shlex.join(args.rlplace_args)}" if args.rlplace_args else ""
    print(f"# time to solve CartPole-v1 (mean return of the last {WINDOW} episodes >= {TARGET:.0f})")
    print(f"# rlplace: rlplace-train runner.seed=N logger=none{extra}")
    print(f"# baseline: cleanrl_ppo_baseline.py --seeds N {shlex.join(args.baseline_args)}".rstrip())
    print(f"# seeds {' '.join(map(str, args.seeds))}, run alternately, rlplace first", flush=True)
    results: list[Result] = []
    for seed in args.seeds:
        for system in ("rlplace", "baseline"):
            print(f"# {system} seed {seed} ...", end=" ", file=sys.stderr, flush=True)
            if system == "rlplace":
                r = run_rlplace(seed, args.rlplace_args, args.timeout, args.keep)
            else:
                r = run_baseline(seed, args.baseline_args, args.timeout)
            results.append(r)
            state = ("solved" if r.solved else "not solved") if r.ok else "failed"
            print(
                f"{state}: train {fmt(r.train_s)} s, {fmt(r.env_steps, 0)} env steps, wall {fmt(r.wall_s)} s"
                + (f"; {r.note}" if r.ok and r.note else ""),
                file=sys.stderr,
                flush=True,
            )
    print(table(results))
    write_section("solve_time.py", table(results))
    if not all(r.ok for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
