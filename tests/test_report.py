"""A tiny placement sweep end to end: Hydra multirun with the report callback, skipped jobs, wandb in one group, and
the same job on Hydra's Ray launcher giving the same numbers.

One sweep (collocated, disaggregated, hybrid; the cluster's 2 devices cannot hold disaggregated, so 2 jobs run) is
shared by both tests: the report reads it, and its hybrid job is what the Ray launcher's one-job multirun, run at
the same time, must reproduce.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlplace.report import collect

TINY = [
    "rollout.pipeline_stage_num=2",  # narrows the sweep's params to one value
    "task.total_num_envs=4",
    "rollout.num_steps=8",
    "algorithm.num_minibatches=2",
    "algorithm.update_epochs=1",
    "runner.max_steps=2",
]
COMPARED = ("env/return_last20", "train/policy_loss", "train/value_loss", "train/entropy")


def start_multirun(sweep_dir: Path, *overrides: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "rlplace.train", "sweep=placement_modes", *TINY, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.Popen(
        [*command, *overrides], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def finish(process: subprocess.Popen[str]) -> str:
    """Wait for a multirun started by `start_multirun`; its stdout."""
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def metrics(job_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def multiruns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, subprocess.Popen[str]]]]:
    """Both multiruns of this module, started together: on a small machine much of a run is waiting (Ray and
    workers starting), which the other run fills. The basic launcher's sweep feeds the report; its hybrid job is
    what the Ray launcher's single job must reproduce."""
    basic_dir, ray_dir = tmp_path_factory.mktemp("basic"), tmp_path_factory.mktemp("ray")
    runs = {
        "basic": (basic_dir, start_multirun(basic_dir, "placement=collocated,disaggregated,hybrid", "logger=wandb")),
        "ray": (
            ray_dir,
            start_multirun(
                ray_dir, "placement=hybrid", "logger=jsonl", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2"
            ),
        ),
    }
    yield runs
    for _, process in runs.values():  # a test that failed early leaves no multirun behind
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def sweep(multiruns: dict[str, tuple[Path, subprocess.Popen[str]]]) -> tuple[Path, str]:
    """The basic launcher's sweep: its folder and stdout."""
    sweep_dir, process = multiruns["basic"]
    return sweep_dir, finish(process)


@pytest.mark.slow
def test_tiny_sweep_writes_report_charts_and_one_wandb_run_per_job(sweep: tuple[Path, str]) -> None:
    sweep_dir, stdout = sweep
    assert "skipping job 1" in stdout  # disaggregated needs 4 devices; cluster=local has 2
    report = (sweep_dir / "report.md").read_text()
    assert "| 0 | collocated | 2 |" in report and "| 2 | hybrid | 2 |" in report
    assert "- job 1 (placement=disaggregated rollout.pipeline_stage_num=2): skipped:" in report
    for png in ("throughput", "speedup", "time_breakdown", "utilization", "timeline_0", "timeline_2"):
        assert (sweep_dir / f"{png}.png").stat().st_size > 1000, png
    jobs = collect(sweep_dir)
    assert [j.skipped is not None for j in jobs] == [False, True, False]
    assert [j.mode for j in jobs] == ["collocated", "", "hybrid"]
    assert jobs[2].median_throughput > 0
    runs = sorted(sweep_dir.glob("*/wandb/offline-run-*"))
    assert len(runs) == 2
    for run in runs:  # the run record in the offline log carries the sweep's group and the mode tag
        log = next(run.glob("*.wandb")).read_bytes()
        assert b"placement_modes" in log and b"stages2" in log


@pytest.mark.slow
def test_ray_launcher_gives_the_basic_launchers_results(
    sweep: tuple[Path, str], multiruns: dict[str, tuple[Path, subprocess.Popen[str]]]
) -> None:
    basic = metrics(sweep[0] / "2")  # the hybrid job of the basic launcher's sweep
    ray_dir, process = multiruns["ray"]
    finish(process)
    on_ray = metrics(ray_dir / "0")
    assert len(on_ray) == len(basic) == 2
    for key in COMPARED:
        assert [row[key] for row in on_ray] == [row[key] for row in basic], key
