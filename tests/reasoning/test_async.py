"""Asynchronous reasoning training (runner.max_staleness = 1) end to end: the same numbers in every placement.

Two runs of 4 PPO steps start together: every component on device 0, where generation and training take turns, and
the actor alone on device 1, where step t + 1's micro-batches are generated while the actor trains on step t. PPO:
its critic's advantages are not all 0 even when every reward is (the tiny LM is untrained), so the weights change and
the behaviour weights π_prox / π_behav differ from 1 once the batches are a step old. (An asynchronous run resuming
exactly from a checkpoint that holds the batch generated ahead: `test_runner.test_resume_continues_exactly`.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reasoning.runs import compared, start

STAGES_ON_DEVICE_0 = [
    "placement=reasoning_disaggregated",
    "cluster=local",
    *(f"cluster.component_placement.{name}=0" for name in ("rollout", "reward", "inference")),
]
ASYNC = ["algorithm=reasoning_ppo", "runner.max_staleness=1", "runner.max_steps=4"]
PLACEMENTS = {
    "collocated": [*STAGES_ON_DEVICE_0, "cluster.component_placement.actor=0"],
    "overlapped": [*STAGES_ON_DEVICE_0, "cluster.component_placement.actor=1"],
}


@pytest.mark.slow
def test_async_training_gives_the_same_numbers_in_every_placement(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    runs = {
        name: start(tmp_path_factory.mktemp(name), model_path, *ASYNC, *placement)
        for name, placement in PLACEMENTS.items()
    }
    try:
        metrics = {name: run.finished().metrics() for name, run in runs.items()}
    finally:
        for run in runs.values():
            run.stop()
    collocated, overlapped = metrics["collocated"], metrics["overlapped"]
    assert [compared(row) for row in collocated] == [compared(row) for row in overlapped]
    assert [row["async/staleness"] for row in collocated] == [0.0, 1.0, 1.0, 1.0]  # step 0: the initial weights
    assert collocated[0]["train/behaviour_weight"] == 1.0  # π_behav is π_prox, to the last bit
    assert any(row["train/behaviour_weight"] != 1.0 for row in collocated[1:])
    # Training beside generation only where the actor has a device of its own (steps 0-2 generate steps 1-3 while
    # training; step 3 generates nothing).
    overlap = {name: [row["time/overlap"] for row in rows] for name, rows in metrics.items()}
    assert overlap["collocated"] == [0.0] * 4, overlap
    assert sum(overlap["overlapped"][:3]) > 0 and overlap["overlapped"][3] == 0.0, overlap
