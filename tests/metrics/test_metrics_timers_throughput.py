"""PhaseTimer with a fake clock, the process's uptime, and throughput per device over the whole device budget."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlplace.metrics import PhaseTimer, Timeline, per_device, process_uptime_s, throughput, throughput_metrics


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_phase_timer_records_step_times_and_spans() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with timer.phase("step"):
        with timer.phase("generate_rollouts"):
            clock.now += 2.0
        for _ in range(2):  # a phase entered twice accumulates
            with timer.phase("training"):
                clock.now += 0.5
    timer.record("env", 1.25)
    assert timer.step_metrics() == pytest.approx(
        {"time/step": 3.0, "time/generate_rollouts": 2.0, "time/training": 1.0, "time/env": 1.25}
    )
    assert timer.step_metrics() == {}  # cleared

    spans = timer.drain_spans()
    assert [(s["name"], s["start"], s["end"]) for s in spans] == [
        ("generate_rollouts", 100.0, 102.0),
        ("training", 102.0, 102.5),
        ("training", 102.5, 103.0),
        ("step", 100.0, 103.0),
    ]
    assert all(s["group"] == "driver" and s["rank"] == 0 for s in spans)
    assert timer.drain_spans() == []
    Timeline({}, start=100.0).extend(spans)  # driver spans are valid timeline spans


def test_phase_timer_records_a_failing_phase() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with pytest.raises(RuntimeError), timer.phase("sync_weights"):
        clock.now += 1.0
        raise RuntimeError("boom")
    assert timer.step_metrics() == {"time/sync_weights": 1.0}


def test_throughput_per_device_divides_by_the_whole_budget() -> None:
    assert throughput(1024, 2.0) == 512.0
    assert per_device(512.0, 8) == 64.0
    # 4096 env steps in 2 s on a run holding 8 devices -> 2048 /s, 256 /s per device (even if only 2 were busy)
    assert throughput_metrics(2.0, 8, env_steps=4096) == {
        "throughput/env_steps_per_s": 2048.0,
        "throughput/env_steps_per_s_per_device": 256.0,
    }
    assert throughput_metrics(0.5, 4, tokens=1000) == {
        "throughput/tokens_per_s": 2000.0,
        "throughput/tokens_per_s_per_device": 500.0,
    }
    with pytest.raises(ValueError, match="positive duration"):
        throughput(10, 0.0)
    with pytest.raises(ValueError, match="at least one device"):
        per_device(10.0, 0)


def test_process_uptime_counts_from_the_process_start() -> None:
    # A child that sleeps 0.5 s before it first asks: the interpreter's start and the sleep are counted.
    code = "import time; time.sleep(0.5); from rlplace.metrics import process_uptime_s; print(process_uptime_s())"
    uptime = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.5 <= uptime < 30
    assert 0 < process_uptime_s()
