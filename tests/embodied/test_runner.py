"""The embodied loop end to end, as users run it: `rlplace-train` in a subprocess on an embedded local Ray.

Each run is a few tiny steps (4 envs x 16 steps) so that the checks are about behaviour, not speed: placement does
not change results, pipelining overlaps env and rollout, checkpoints resume exactly, bad input is refused early.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlplace.metrics import Timeline

TINY = [
    "task.total_num_envs=4",
    "rollout.num_steps=16",
    "rollout.pipeline_stage_num=2",
    "algorithm.num_minibatches=2",
    "algorithm.update_epochs=2",
    "runner.max_steps=3",
    "logger=jsonl",
]
# Same process counts in both modes (2 actor, 2 env, 2 rollout processes on the 2 logical devices), so the numbers
# must match exactly; only which device each process shares changes.
COLLOCATED = ["placement=collocated"]
HYBRID = ["placement=hybrid", "cluster.component_placement.env='0:0-1'", "cluster.component_placement.rollout='1:0-1'"]
COMPARED = ("env/episode_return", "env/return_last20", "train/policy_loss", "train/value_loss", "train/entropy")


def train(run_dir: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "rlplace.train", *TINY, f"hydra.run.dir={run_dir}", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("hybrid")
    train(run_dir, *HYBRID, "runner.save_interval=2")
    return run_dir


@pytest.mark.slow
def test_run_writes_metrics_timeline_and_checkpoints(hybrid_run: Path) -> None:
    rows = metrics(hybrid_run)
    assert [row["step"] for row in rows] == [0, 1, 2]
    for key in (
        "time/step",
        "time/generate_rollouts",
        "time/training",
        "throughput/env_steps_per_s",
        "throughput/env_steps_per_s_per_device",
        "util/device_0/busy_frac",
        "train/policy_loss",
        "env/return_last20",
    ):
        assert key in rows[-1], key
    trace = json.loads((hybrid_run / "timeline.json").read_text())
    names = {event["name"] for event in trace["traceEvents"] if event["ph"] == "X"}
    assert {"env_step", "rollout_infer", "training", "sync_weights"} <= names
    assert sorted(p.name for p in (hybrid_run / "checkpoints").iterdir()) == ["step_000002", "step_000003"]


@pytest.mark.slow
def test_placement_changes_speed_never_results(hybrid_run: Path, tmp_path: Path) -> None:
    train(tmp_path, *COLLOCATED)
    hybrid, collocated = metrics(hybrid_run), metrics(tmp_path)
    for step in range(3):
        for key in COMPARED:
            assert hybrid[step][key] == collocated[step][key], (step, key)


@pytest.mark.slow
def test_env_and_rollout_pipeline_across_devices(hybrid_run: Path) -> None:
    trace = json.loads((hybrid_run / "timeline.json").read_text())
    spans = [
        {
            "name": e["name"],
            "group": e["args"]["group"],
            "rank": e["args"]["rank"],
            "start": e["ts"] / 1e6,
            "end": (e["ts"] + e["dur"]) / 1e6,
        }
        for e in trace["traceEvents"]
        if e["ph"] == "X" and e["name"] in ("env_step", "rollout_infer")
    ]
    timeline = Timeline({})
    timeline.extend(spans)
    end = max(span["end"] for span in spans)
    assert timeline.overlap("env", "rollout", 0.0, end) > 0


@pytest.mark.slow
def test_resume_continues_exactly(hybrid_run: Path, tmp_path: Path) -> None:
    train(tmp_path, *HYBRID, f"runner.resume={hybrid_run / 'checkpoints' / 'step_000002'}")
    resumed, full = metrics(tmp_path), metrics(hybrid_run)
    assert [row["step"] for row in resumed] == [2]
    for key in (*COMPARED, "env/total_steps"):
        assert resumed[0][key] == full[2][key], key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task.total_num_envs=6", "placement=collocated"], "task.total_num_envs = 6 must divide evenly"),
        (["task.env_id=Pong-v9"], "task.env_id = 'Pong-v9'"),
        (["~cluster.component_placement.env"], "env"),
        (["runner.resume=/no/such/checkpoint"], "runner.resume = '/no/such/checkpoint'"),
    ],
)
def test_bad_input_is_refused_before_workers_start(tmp_path: Path, overrides: list[str], message: str) -> None:
    result = train(tmp_path, *overrides, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert "Worker" not in result.stdout + result.stderr
