"""The sizes a run profiles its components at, and the timing loop each worker uses (`rlplace.embodied.profile`)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rlplace.cli import compose_run
from rlplace.core import timing
from rlplace.embodied import profile
from rlplace.families import resolve


@pytest.mark.parametrize(
    ("last", "first", "sizes"),
    [
        (1, 1, [1]),
        (8, 1, [1, 2, 4, 8]),
        (12, 1, [1, 2, 4, 8, 12]),  # the run's own size, though not a power of two
        (32, 1, [1, 2, 4, 8, 16, 32]),
        (256, 8, [8, 16, 32, 64, 128, 256]),
        (24, 8, [8, 16, 24]),
        (5, 8, [5]),  # below the first size: just the run's own
    ],
)
def test_sizes_double_up_to_the_run_s_own(last: int, first: int, sizes: list[int]) -> None:
    assert timing.sizes_up_to(last, first) == sizes


@pytest.mark.parametrize(("last", "first"), [(0, 1), (8, 3), (8, 0)])
def test_sizes_refuse_what_has_no_doubling(last: int, first: int) -> None:
    with pytest.raises(ValueError, match="is not"):
        timing.sizes_up_to(last, first)


def test_the_actor_is_profiled_up_to_the_minibatch_of_the_default_run() -> None:
    cfg = resolve(compose_run([])).cfg  # CartPole: 32 envs x 32 steps over 4 minibatches
    assert profile.minibatch_size(cfg) == 256
    assert timing.sizes_up_to(profile.minibatch_size(cfg), profile.FIRST_ACTOR_SIZE) == [8, 16, 32, 64, 128, 256]


@pytest.mark.parametrize(
    ("seconds", "repeats"),
    [(1e-7, timing.MAX_REPEATS), (0.004, 50), (0.05, 4), (2.0, timing.MIN_REPEATS)],
)
def test_repeats_fill_about_the_target_time(seconds: float, repeats: int) -> None:
    assert timing.repeats_for(seconds) == repeats


def test_median_seconds_warms_up_then_times_the_chosen_number_of_calls() -> None:
    calls = []
    assert timing.median_seconds(lambda: calls.append(1), repeats=5) > 0
    assert len(calls) == timing.WARMUP + 5
    calls.clear()
    timing.median_seconds(lambda: calls.append(1))  # a probe, then as many as fill TARGET_S (a fast call: all)
    assert len(calls) == timing.WARMUP + 1 + timing.MAX_REPEATS


def test_sizes_are_timed_in_turns_after_every_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    medians = timing.interleaved_medians([lambda: calls.append("a"), lambda: calls.append("b")], repeats=3)
    assert len(medians) == 2 and all(m > 0 for m in medians)
    assert "".join(calls) == "a" * timing.WARMUP + "b" * timing.WARMUP + "ab" * 3
    calls.clear()

    def unit() -> None:
        calls.append("u")
        time.sleep(0.02)

    # Each call's count from its probe: the slow unit gets 4 timed calls, the fast one the most; the unit's four
    # take turns with the fast one's first four, which goes on alone after them.
    monkeypatch.setattr(timing, "repeats_for", lambda seconds: 4 if seconds >= 0.02 else timing.MAX_REPEATS)
    timing.interleaved_medians([unit, lambda: calls.append("f")], warmup=0)
    assert "".join(calls) == "uf" + "uf" * 4 + "f" * (timing.MAX_REPEATS - 4)


class Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def wait(self) -> Any:
        return self.value


class RecordingGroup:
    """Stands in for a WorkerGroup: records which ranks each call reached, in order, and answers one value per rank."""

    def __init__(self, name: str, world_size: int, calls: list[str]) -> None:
        self.name, self.world_size, self.calls, self.ranks = name, world_size, calls, range(world_size)

    def execute_on(self, *ranks: int) -> RecordingGroup:
        selected = RecordingGroup(self.name, self.world_size, self.calls)
        selected.ranks = ranks
        return selected

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any) -> Done:
            self.calls.append(f"{self.name}{list(self.ranks)}.{method}")
            sizes = args[0] if args else None
            if sizes:
                return Done([[0.001] * len(sizes) for _ in self.ranks])
            return Done([{"seconds": 0.002 + rank / 1000, "bytes": 4096} for rank in self.ranks])

        return call


def test_each_component_is_timed_alone_after_switching_through_the_loop_s_phases() -> None:
    plan = resolve(compose_run(["cluster.component_placement.actor=0-1"]))  # two actor ranks: a collective to time
    calls: list[str] = []
    groups = {name: RecordingGroup(name, plan.placement.get_world_size(name), calls) for name in plan.placement}
    cores = {0: [0], 1: [1]}
    measured = profile.measure(
        plan.cfg, plan.placement, cores, {0: [0, 1]}, **groups, switch=lambda phase: calls.append(phase)
    )
    # The run ended in training; the switch plan holds only for the loop's order of phases (with offload on a GPU, a
    # jump from training to generation would leave the rollout's weights on the CPU).
    assert calls == [
        "sync_weights",
        "generate_rollouts",
        "env[0].profile_step",
        "rollout[0].profile_infer",
        "training",
        "actor[0].profile_update",
        "actor[0, 1].profile_average",
    ]
    assert measured["env"] == {"sizes": [1, 2, 4, 8, 16, 32], "seconds": [0.001] * 6}
    assert measured["actor"]["sizes"] == [8, 16, 32, 64, 128, 256]
    assert measured["average"] == {"ranks": 2, "seconds": 0.003, "bytes": 4096}  # the slowest rank: all wait for it
    assert measured["devices"] == {"0": [0], "1": [1]}
