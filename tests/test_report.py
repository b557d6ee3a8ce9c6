"""A tiny placement sweep end to end: Hydra multirun with the report callback, skipped jobs, wandb in one group."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlplace.report import collect


@pytest.mark.slow
def test_tiny_sweep_writes_report_charts_and_one_wandb_run_per_job(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable, "-m", "rlplace.train", "sweep=placement_modes",
            "placement=collocated,disaggregated,hybrid", "rollout.pipeline_stage_num=2",  # narrows the sweep's params
            "task.total_num_envs=4", "rollout.num_steps=8", "algorithm.num_minibatches=2",
            "algorithm.update_epochs=1", "runner.max_steps=3", "logger=wandb", f"hydra.sweep.dir={tmp_path}",
        ],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "skipping job 1" in result.stdout  # disaggregated needs 4 devices; cluster=local has 2
    report = (tmp_path / "report.md").read_text()
    assert "| 0 | collocated | 2 |" in report and "| 2 | hybrid | 2 |" in report
    for png in ("throughput", "speedup", "time_breakdown", "utilization", "timeline_0", "timeline_2"):
        assert (tmp_path / f"{png}.png").stat().st_size > 1000, png
    jobs = collect(tmp_path)
    assert [j.skipped is not None for j in jobs] == [False, True, False]
    assert jobs[2].median_throughput > 0
    runs = sorted(tmp_path.glob("*/wandb/offline-run-*"))
    assert len(runs) == 2
    for run in runs:  # the run record in the offline log carries the sweep's group and the mode tag
        log = next(run.glob("*.wandb")).read_bytes()
        assert b"placement_modes" in log and b"stages2" in log


def _sweep(sweep_dir: Path, *overrides: str) -> list[dict[str, float]]:
    result = subprocess.run(
        [
            sys.executable, "-m", "rlplace.train", "--multirun", "sweep=placement_modes", "placement=hybrid",
            "rollout.pipeline_stage_num=2", "task.total_num_envs=4", "rollout.num_steps=8",
            "algorithm.num_minibatches=2", "runner.max_steps=2", "logger=jsonl", f"hydra.sweep.dir={sweep_dir}",
            *overrides,
        ],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads(line) for line in (sweep_dir / "0" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_ray_launcher_gives_the_basic_launchers_results(tmp_path: Path) -> None:
    basic = _sweep(tmp_path / "basic")
    on_ray = _sweep(tmp_path / "ray", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2")
    for key in ("env/return_last20", "train/policy_loss", "train/value_loss", "train/entropy"):
        assert [row[key] for row in on_ray] == [row[key] for row in basic], key
