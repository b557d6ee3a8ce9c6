"""A turn's tool calls and interaction replies run concurrently (`generation.calls.Calls`): each started as it is
handed over, at most the given number at once, a call that raises or misses its deadline answered with its error, one
that hangs given up without holding up the others, and the same object reused turn after turn."""

from __future__ import annotations

import threading
import time

import pytest

from rlplace.reasoning.generation.calls import Calls, Outcome


def run(calls: list, concurrency: int, timeout_s: float) -> list[Outcome]:
    """The outcomes of `calls`, started in order on one `Calls`, in that order."""
    pool = Calls(concurrency, timeout_s)
    for key, call in enumerate(calls):
        pool.start(key, call)
    outcomes = pool.outcomes()
    assert sorted(outcomes) == list(range(len(calls)))
    return [outcomes[key] for key in range(len(calls))]


def test_calls_run_at_once_up_to_the_limit_each_answering_its_key():
    together = threading.Barrier(4, timeout=10)  # passed only by 4 calls running at the same time

    def meet(value: int) -> int:
        together.wait()
        return value

    assert [o.value for o in run([lambda v=v: meet(v) for v in range(8)], 4, 30)] == list(range(8))
    lock, running, most = threading.Lock(), [0], [0]

    def counted(value: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return value * 2

    assert [o.value for o in run([lambda v=v: counted(v) for v in range(12)], 3, 30)] == [v * 2 for v in range(12)]
    assert most[0] <= 3
    assert Calls(3, 30).outcomes() == {}


def test_a_call_starts_when_handed_over_not_when_the_turn_waits():
    """What `on_done` relies on: a call handed over while the engine still decodes runs meanwhile."""
    pool, started = Calls(2, 30), threading.Event()
    pool.start("early", started.set)
    assert started.wait(10)
    assert pool.outcomes() == {"early": Outcome(None)}


def test_a_call_that_raises_or_misses_its_deadline_gets_its_error_and_the_others_their_values():
    release = threading.Event()

    def fails() -> str:
        raise ValueError("sandbox unreachable")

    def hangs() -> str:
        release.wait()
        return "late"

    try:
        outcomes = run([lambda: "a", fails, hangs, lambda: "b", lambda: "c"], 2, 0.5)
    finally:
        release.set()
    assert [o.value for o in outcomes] == ["a", None, None, "b", "c"]
    assert isinstance(outcomes[1].error, ValueError) and outcomes[1].message == "ValueError: sandbox unreachable"
    assert isinstance(outcomes[2].error, TimeoutError) and outcomes[2].message == "TimeoutError: no answer within 0.5 s"
    assert Outcome(error=KeyError()).message == "KeyError"


def test_a_call_that_exits_its_thread_still_gets_an_outcome():
    def exits() -> None:
        raise SystemExit(3)

    (outcome,) = run([exits], 1, 30)
    assert isinstance(outcome.error, SystemExit)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_hung_calls_free_their_slots_and_a_late_answer_does_not_reach_the_next_turn(concurrency):
    """Calls that never return hold no slot past their deadline: with one slot, each of 3 hung calls waits its own
    deadline only, and the call after them runs. When a given-up call answers at last, during the next turn's calls
    under the same key, that turn's call keeps its own outcome."""
    release = threading.Event()
    pool = Calls(concurrency, 0.2)
    for key in range(3):
        pool.start(key, release.wait)
    pool.start(3, lambda: "after")
    outcomes = pool.outcomes()
    assert [type(outcomes[key].error) for key in range(3)] == [TimeoutError] * 3 and outcomes[3].value == "after"
    answered = threading.Event()
    pool.start(0, lambda: answered.wait(10) and "next turn")
    release.set()  # the hung calls of key 0, 1, 2 answer now
    answered.set()
    assert pool.outcomes() == {0: Outcome("next turn")}
