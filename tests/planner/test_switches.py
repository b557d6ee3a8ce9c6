"""Phase switch costs per group and direction (`rlplace.planner.switches`): a call waits for the slowest group it
moves, the profiled run's own plan is predicted at what its driver measured, and keeping a group resident saves what
its moves cost where it was the slowest."""

from __future__ import annotations

import json

import pytest

from rlplace.core.schedule import Switch
from rlplace.planner.spans import Trace
from rlplace.planner.switches import SwitchCosts

MOVES = {
    ("actor", "offload"): 0.30,
    ("actor", "onload"): 0.20,
    ("rollout", "offload"): 0.10,
    ("rollout", "onload"): 0.12,
    ("inference", "offload"): 0.05,
    ("inference", "onload"): 0.04,
}
"""Seconds each group's offload and onload took in the profiled step (a reasoning run, collocated)."""
COLLOCATED = {
    "sync_weights": Switch(onload=("rollout", "inference")),
    "generate_rollouts": Switch(offload=("actor",)),
    "training": Switch(offload=("rollout", "inference"), onload=("actor",)),
}
MEASURED_S = 0.80
"""The driver's offload and onload calls of the step: its four calls' slowest groups (0.72 s) and 0.02 s a call."""


def _trace(moves: dict[tuple[str, str], float]) -> Trace:
    """A one-step timeline in which each group's rank 0 and 1 made its moves (rank 1 the slower, by 10%)."""
    events = [{"name": "step", "ph": "X", "ts": 0, "dur": 10e6, "args": {"group": "driver", "rank": 0}}]
    for (group, direction), seconds in moves.items():
        for rank, share in ((0, 1.0), (1, 1.1)):
            args = {"group": group, "rank": rank, "devices": [0]}
            events.append({"name": direction, "ph": "X", "ts": 1e6, "dur": seconds * share * 1e6, "args": args})
    return Trace(json.dumps({"traceEvents": events}))


def _kept(group: str) -> dict[str, Switch]:
    """The collocated plan with `group` resident."""
    return {
        phase: Switch(tuple(g for g in s.offload if g != group), tuple(g for g in s.onload if g != group))
        for phase, s in COLLOCATED.items()
    }


def test_the_profiled_plan_is_predicted_at_what_its_driver_measured() -> None:
    costs = SwitchCosts.of(_trace(MOVES), COLLOCATED, MEASURED_S)
    assert costs.spans["actor", "offload"] == pytest.approx(0.33)  # the slower rank's
    assumptions: list[str] = []
    assert costs.seconds(COLLOCATED, 0.01, assumptions) == pytest.approx(MEASURED_S)
    assert assumptions == []


def test_keeping_a_group_resident_saves_its_moves_where_they_were_the_slowest() -> None:
    costs = SwitchCosts.of(_trace(MOVES), COLLOCATED, MEASURED_S)
    per_call = (MEASURED_S - 1.1 * (0.12 + 0.30 + 0.10 + 0.20)) / 4
    # The inference group moves beside the rollout engine, which is slower both ways: keeping it resident saves
    # nothing. Keeping the engine resident leaves the inference group's moves the slowest of those calls.
    assert costs.seconds(_kept("inference"), 0.01, []) == pytest.approx(MEASURED_S)
    assert costs.seconds(_kept("rollout"), 0.01, []) == pytest.approx(4 * per_call + 1.1 * (0.04 + 0.30 + 0.05 + 0.20))
    # A group the profile never moved costs its direction's mean, an assumption the prediction names.
    assumptions: list[str] = []
    with_reward = {**COLLOCATED, "training": Switch(offload=("reward",), onload=("actor",))}
    expected = 4 * per_call + 1.1 * (0.12 + 0.30 + (0.30 + 0.10 + 0.05) / 3 + 0.20)
    assert costs.seconds(with_reward, 0.01, assumptions) == pytest.approx(expected)
    assert assumptions == ["the reward's offload costs what the profiled groups' did on average (the profile had none)"]


def test_a_profile_without_switches_assumes_a_default_per_group() -> None:
    still = dict.fromkeys(COLLOCATED, Switch())
    costs = SwitchCosts.of(_trace({}), still, 0.0)
    assumptions: list[str] = []
    assert costs.seconds(COLLOCATED, 0.01, assumptions) == pytest.approx(0.06)  # six group moves
    assert assumptions == ["phase switches 10 ms a group (the profile had none)"]
    assert costs.seconds(still, 0.01, []) == 0.0
