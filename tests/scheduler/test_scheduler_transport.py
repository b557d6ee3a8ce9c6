"""`GroupFuture` and `wait_all` against the call-transport contract alone: handle kinds made up here, no Ray started.
The Ray and served transports are tested end to end in test_scheduler_worker.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from rlplace.scheduler.errors import WorkerError, WorkerTimeout
from rlplace.scheduler.future import GroupFuture, wait_all
from rlplace.scheduler.transport import CallTransport, RankCall


class Scripted(RankCall):
    """A handle that settles on its `turn`-th collection of its kind: with `value`, or failing when `fails`."""

    __slots__ = ("fails", "result", "turn")
    collections: ClassVar[list[tuple[int, bool]]] = []
    """(calls pending, others_pending) of every `collect`."""

    def __init__(self, group: str, rank: int, method: str, result: Any, turn: int, fails: bool = False) -> None:
        super().__init__(group, rank, method)
        self.result, self.turn, self.fails = result, turn, fails

    @classmethod
    def collect(cls, calls: Sequence[RankCall], timeout: float, others_pending: bool) -> None:
        cls.collections.append((len(calls), others_pending))
        for call in calls:
            assert isinstance(call, Scripted)
            call.turn -= 1
            if call.turn <= 0 and call.fails:
                call.error = WorkerError(call.group, call.rank, call.method, "raised an exception")
            elif call.turn <= 0:
                call.value, call.done = call.result, True


class OtherKind(Scripted):
    collections: ClassVar[list[tuple[int, bool]]] = []


class ScriptedCalls(CallTransport):
    def __init__(self, group: str, kind: type[Scripted], turns: dict[int, int]) -> None:
        self.group, self.kind, self.turns = group, kind, turns

    def send(self, method: str, ranks: Sequence[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[RankCall]:
        return [self.kind(self.group, rank, method, (rank, *args), self.turns.get(rank, 1)) for rank in ranks]


def _future(transport: ScriptedCalls, method: str, ranks: Sequence[int], *args: Any) -> GroupFuture:
    return GroupFuture(transport.group, method, transport.send(method, ranks, args, {}))


def test_wait_all_mixes_kinds_and_returns_results_in_rank_order() -> None:
    Scripted.collections.clear()
    OtherKind.collections.clear()
    first = _future(ScriptedCalls("a", Scripted, {0: 3, 1: 1}), "step", [1, 0], "x")
    second = _future(ScriptedCalls("b", OtherKind, {}), "act", [0])
    assert wait_all(first, second, timeout=5) == [[(1, "x"), (0, "x")], [(0,)]]
    assert first.ranks == (1, 0) and first.done()
    # one collection per kind and turn; each kind is told while the other is pending, so neither blocks long
    assert Scripted.collections == [(2, True), (1, False), (1, False)]
    assert OtherKind.collections == [(1, True)]


def test_the_first_failed_rank_is_raised_without_waiting_for_the_others() -> None:
    calls = ScriptedCalls("g", Scripted, {0: 100})
    handles = calls.send("step", [0], (), {}) + [Scripted("g", 1, "step", None, turn=1, fails=True)]
    future = GroupFuture("g", "step", handles)
    with pytest.raises(WorkerError, match=r"group 'g' rank 1: step\(\) raised an exception"):
        future.wait(timeout=5)
    assert future.done() and "failed" in repr(future)


def test_a_call_that_never_settles_times_out_naming_the_pending_rank() -> None:
    future = _future(ScriptedCalls("g", Scripted, {0: 1, 1: 10**9}), "step", [0, 1])
    with pytest.raises(WorkerTimeout, match=r"group 'g' rank 1: step\(\) did not finish within 0.1 s"):
        future.wait(timeout=0.1)
