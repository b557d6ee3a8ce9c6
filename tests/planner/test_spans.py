"""What a profiled run's workers would have needed alone (`planner.spans`): processes sharing a core share it in
turn, so a span's work alone is its length over the busy processes on its cores, moment by moment."""

from __future__ import annotations

import json

import pytest

from rlplace.metrics.logger import WARMUP_STEPS
from rlplace.planner.spans import Trace

CORES = {0: [0], 1: [0], 2: [1]}
"""Devices 0 and 1 share core 0; device 2 has core 1."""


def timeline(*spans: tuple[str, str, int, int, float, float]) -> str:
    """A timeline.json: the driver's steps (one second each, the warm-up ones first) and worker spans (name, group,
    rank, device, start s, end s) in the last step."""
    steps = WARMUP_STEPS + 1
    events = [
        {"name": "step", "ph": "X", "ts": s * 1e6, "dur": 1e6, "args": {"group": "driver", "rank": 0}}
        for s in range(steps)
    ]
    last = (steps - 1) * 1e6
    events += [
        {
            "name": name,
            "ph": "X",
            "ts": last + start * 1e6,
            "dur": (end - start) * 1e6,
            "args": {"group": group, "rank": rank, "devices": [device]},
        }
        for name, group, rank, device, start, end in spans
    ]
    return json.dumps({"traceEvents": events})


def test_two_processes_busy_on_one_core_each_needed_half_of_their_spans() -> None:
    text = timeline(("rollout_generate", "rollout", 0, 0, 0.0, 0.4), ("inference", "inference", 0, 1, 0.0, 0.4))
    work = Trace(text).alone_work(CORES, ["rollout_generate", "inference"])
    assert work[("rollout", "rollout_generate")] == pytest.approx(0.2)
    assert work[("inference", "inference")] == pytest.approx(0.2)


def test_a_span_is_shared_only_while_another_process_is_busy_on_its_core() -> None:
    text = timeline(
        ("rollout_generate", "rollout", 0, 0, 0.0, 0.4),  # shares core 0 for its first 0.2 s
        ("inference", "inference", 0, 1, 0.0, 0.2),
        ("training", "actor", 0, 2, 0.0, 0.4),  # alone on core 1
    )
    work = Trace(text).alone_work(CORES, ["rollout_generate", "inference", "training"])
    assert work[("rollout", "rollout_generate")] == pytest.approx(0.1 + 0.2)
    assert work[("inference", "inference")] == pytest.approx(0.1)
    assert work[("actor", "training")] == pytest.approx(0.4)


def test_spans_of_every_rank_add_up_and_only_the_measured_steps_count() -> None:
    events = json.loads(timeline(("reward", "reward", 0, 2, 0.0, 0.1), ("reward", "reward", 1, 2, 0.5, 0.6)))
    warm_up = {
        "name": "reward",
        "ph": "X",
        "ts": 0.0,
        "dur": 5e5,
        "args": {"group": "reward", "rank": 0, "devices": [2]},
    }
    events["traceEvents"].append(warm_up)  # in step 0: left out
    work = Trace(json.dumps(events)).alone_work(CORES, ["reward"])
    assert work == {("reward", "reward"): pytest.approx(0.2)}
