"""Asynchronous reasoning training (runner.max_staleness = 1) end to end: the same numbers in every placement, and a
resume under another placement that continues exactly.

Two runs of 4 PPO steps start together: every component on device 0, where generation and training take turns, and
the actor alone on device 1, where step t + 1's micro-batches are generated while the actor trains on step t. PPO:
its critic's advantages are not all 0 even when every reward is (the tiny LM is untrained), so the weights change and
the behaviour weights π_prox / π_behav differ from 1 once the batches are a step old. A third run, in this process,
resumes the overlapped one from its step-2 checkpoint (which holds step 2's micro-batches, generated during step 1)
in the other placement.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlplace.cli import compose_run
from rlplace.families import resolve
from rlplace.train import train
from tests.reasoning.runs import TINY, compared, published, start

STAGES_ON_DEVICE_0 = [
    "placement=reasoning_disaggregated",
    "cluster=local",
    *(f"cluster.component_placement.{name}=0" for name in ("rollout", "reward", "inference")),
]
ASYNC = ["algorithm=reasoning_ppo", "runner.max_staleness=1", "runner.max_steps=4", "runner.save_interval=2"]
PLACEMENTS = {
    "collocated": [*STAGES_ON_DEVICE_0, "cluster.component_placement.actor=0"],
    "overlapped": [*STAGES_ON_DEVICE_0, "cluster.component_placement.actor=1"],
}


@pytest.mark.slow
def test_async_training_gives_the_same_numbers_in_every_placement_and_resumes_exactly(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    runs = {
        name: start(tmp_path_factory.mktemp(name), model_path, *ASYNC, *placement)
        for name, placement in PLACEMENTS.items()
    }
    try:
        overlapped = runs["overlapped"]
        checkpoint = published(overlapped, overlapped.run_dir / "checkpoints" / "step_000002")
        # The step-2 batch, generated while step 1 trained, is in flight: the checkpoint holds it.
        assert (checkpoint / "pending" / "0.pt").is_file()
        overrides = ["experiment=arithmetic_grpo", *TINY, f"model.path={model_path}", *ASYNC, *PLACEMENTS["collocated"]]
        plan = resolve(compose_run([*overrides, f"runner.resume={checkpoint}"]))
        train(plan, tmp_path, resolved_config={})
        metrics = {name: run.finished().metrics() for name, run in runs.items()}
    finally:
        for run in runs.values():
            run.stop()
    collocated, overlapped_rows = metrics["collocated"], metrics["overlapped"]
    assert [compared(row) for row in collocated] == [compared(row) for row in overlapped_rows]
    assert [row["async/staleness"] for row in collocated] == [0.0, 1.0, 1.0, 1.0]  # step 0: the initial weights
    assert collocated[0]["train/behaviour_weight"] == 1.0  # π_behav is π_prox, to the last bit
    assert any(row["train/behaviour_weight"] != 1.0 for row in collocated[1:])
    # Training beside generation only where the actor has a device of its own (steps 0-2 generate steps 1-3 while
    # training; step 3 generates nothing).
    overlap = {name: [row["time/overlap"] for row in rows] for name, rows in metrics.items()}
    assert overlap["collocated"] == [0.0] * 4 and sum(overlap["overlapped"][:3]) > 0 == overlap["overlapped"][3], (
        overlap
    )
    resumed = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in resumed] == [2, 3]
    assert [compared(row) for row in resumed] == [compared(row) for row in collocated[2:]]
