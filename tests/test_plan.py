"""`rlplace-plan` as users run it: a subprocess, its table, its JSON, and exit code 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest


def run_plan(*overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlplace.plan", *overrides], capture_output=True, text=True, timeout=60, check=False
    )


def test_json_shows_the_seed_example() -> None:
    result = run_plan("cluster=node8", "placement=hybrid", "plan.format=json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["mode"] == "hybrid" and plan["num_devices"] == 8
    devices = {name: [d for rank in ranks for d in rank["devices"]] for name, ranks in plan["components"].items()}
    assert devices == {"actor": list(range(8)), "env": [0, 1, 2, 3], "rollout": [4, 5, 6, 7]}
    assert plan["components"]["rollout"][0] == {"rank": 0, "node": 0, "devices": [4]}


def test_table_names_components_sharing_and_mode() -> None:
    result = run_plan()
    assert result.returncode == 0, result.stderr
    assert "hybrid mode, 2 devices" in result.stdout
    assert "actor, env" in result.stdout and "actor, rollout" in result.stdout


def test_multinode_devices_are_node_major() -> None:
    result = run_plan("cluster=multinode", "placement=collocated", "plan.format=json")
    ranks = json.loads(result.stdout)["components"]["env"]
    assert ranks[8] == {"rank": 8, "node": 1, "devices": [8]}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.component_placement.env=0-9"], "cluster.component_placement.env = '0-9': device 9 is out of range"),
        (["cluster=single_gpu", "placement=hybrid"], "cluster.component_placement.env"),
        (["placement=disaggregated"], "cluster.component_placement.env"),
        (["~cluster.component_placement.rollout"], "rollout"),
        (["+cluster.component_placement.critic_model=0"], "critic_model"),
        (["cluster.num_nodes=x"], "cluster.num_nodes=x"),
        (["plan.format=xml"], "plan.format = 'xml'"),
    ],
)
def test_bad_input_exits_2_with_one_line(overrides: list[str], message: str) -> None:
    start = time.monotonic()
    result = run_plan(*overrides)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert time.monotonic() - start < 10
