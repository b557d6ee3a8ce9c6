"""A turn's tool calls and interaction replies run concurrently (`generation.calls.run_calls`): at most the given
number at once, outcomes in call order, a call that raises or misses its deadline answered with its error, and one
that hangs left behind without holding up the others."""

from __future__ import annotations

import threading
import time

import pytest

from rlplace.reasoning.generation.calls import Outcome, run_calls


def test_calls_run_at_once_up_to_the_limit_and_answer_in_call_order():
    together = threading.Barrier(4, timeout=10)  # passed only by 4 calls running at the same time

    def meet(value: int) -> int:
        together.wait()
        return value

    assert [o.value for o in run_calls([lambda v=v: meet(v) for v in range(8)], 4, 30)] == list(range(8))
    lock, running, most = threading.Lock(), [0], [0]

    def counted(value: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return value * 2

    outcomes = run_calls([lambda v=v: counted(v) for v in range(12)], 3, 30)
    assert [o.value for o in outcomes] == [v * 2 for v in range(12)] and most[0] <= 3
    assert run_calls([], 3, 30) == []


def test_a_call_that_raises_or_misses_its_deadline_gets_its_error_and_the_others_their_values():
    release = threading.Event()

    def fails() -> str:
        raise ValueError("sandbox unreachable")

    def hangs() -> str:
        release.wait()
        return "late"

    try:
        outcomes = run_calls([lambda: "a", fails, hangs, lambda: "b", lambda: "c"], 2, 0.5)
    finally:
        release.set()
    assert [o.value for o in outcomes] == ["a", None, None, "b", "c"]
    assert isinstance(outcomes[1].error, ValueError) and outcomes[1].message == "ValueError: sandbox unreachable"
    assert isinstance(outcomes[2].error, TimeoutError) and outcomes[2].message == "TimeoutError: no answer within 0.5 s"
    assert Outcome(error=KeyError()).message == "KeyError"


def test_a_call_that_exits_its_thread_still_gets_an_outcome():
    def exits() -> None:
        raise SystemExit(3)

    (outcome,) = run_calls([exits], 1, 30)
    assert isinstance(outcome.error, SystemExit)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_hung_calls_free_their_slots_for_the_next(concurrency):
    """Calls that never return hold no slot past their deadline: with one slot, each of 3 hung calls waits its own
    deadline only, and the call after them runs."""
    release = threading.Event()
    try:
        outcomes = run_calls([release.wait] * 3 + [lambda: "after"], concurrency, 0.2)
    finally:
        release.set()
    assert [type(o.error) for o in outcomes[:3]] == [TimeoutError] * 3 and outcomes[3].value == "after"
