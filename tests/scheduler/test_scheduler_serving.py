"""Served groups on a real embedded Ray: calls through the mailboxes answer as Ray calls do, in order, with the same
errors, and a rank that dies or hangs is reported within seconds."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rlplace.scheduler import Cluster, Worker, WorkerError, WorkerGroup, WorkerTimeout, serve, wait_all
from tests.scheduler.helpers import on_devices


class Counter(Worker):
    """Counts, sleeps, fails and returns what cannot be pickled, on demand."""

    def __init__(self) -> None:
        self.total = 0

    def add(self, amount: int) -> int:
        self.total += amount
        return self.total

    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} refuses")
        return self.rank

    def unpicklable(self) -> Any:
        return threading.Lock()


def _launch(cluster: Cluster, name: str) -> WorkerGroup:
    return Counter.create_group().launch(cluster, name=name, placement_strategy=on_devices((0,), (1,)))


@pytest.fixture(scope="module")
def counter(cluster: Cluster) -> Iterator[WorkerGroup]:
    """One group for the tests that leave it usable (each adds to its count: they compare differences)."""
    group = _launch(cluster, "counter")
    yield group
    group.terminate(graceful_s=1)


def test_served_calls_answer_in_order_like_ray_calls(cluster: Cluster, counter: WorkerGroup) -> None:
    other = Counter.create_group().launch(cluster, name="unserved", placement_strategy=on_devices((0,)))
    try:
        with serve(counter):
            assert counter.serving is not None
            start = counter.add(0).wait(timeout=30)
            futures = [counter.add(1) for _ in range(3)]  # sent without waiting: run in the order sent
            only_one = counter.execute_on(1).add(10)
            by_ray = other.add(5)
            expected = [[start[0] + n, start[1] + n] for n in (1, 2, 3)] + [[start[1] + 13], [5]]
            assert wait_all(*futures, only_one, by_ray) == expected
        assert counter.serving is None
        assert counter.add(0).wait(timeout=30) == [start[0] + 3, start[1] + 13]  # back on Ray calls, same state
    finally:
        other.terminate(graceful_s=1)


def test_a_served_exception_names_group_rank_method_with_cause_and_traceback(counter: WorkerGroup) -> None:
    with serve(counter):
        with pytest.raises(WorkerError) as caught:
            counter.fail_on(1).wait(timeout=30)
        error = caught.value
        assert (error.group, error.rank, error.method) == ("counter", 1, "fail_on")
        assert "group 'counter' rank 1: fail_on() raised an exception" in str(error)
        assert 'raise ValueError(f"rank {rank} refuses")' in error.remote_traceback
        assert isinstance(error.cause, ValueError)
        with pytest.raises(WorkerError, match="unpicklable\\(\\) returned or raised what cannot be sent back"):
            counter.unpicklable().wait(timeout=30)
        before = counter.add(0).wait(timeout=30)
        assert counter.add(1).wait(timeout=30) == [before[0] + 1, before[1] + 1]  # the loop goes on after a failure


def test_a_killed_served_worker_is_reported_dead_within_seconds(cluster: Cluster) -> None:
    victim = _launch(cluster, "victim")  # a group of its own: this test kills a rank
    with serve(victim):
        pids = victim.pid().wait(timeout=30)
        future = victim.sleep(60)
        time.sleep(0.3)
        start = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(WorkerError, match=r"group 'victim' rank 1: sleep\(\) failed: the worker process died"):
            future.wait(timeout=30)  # rank 0 still sleeps: the death is reported without waiting for it
        assert time.monotonic() - start < 5
        with pytest.raises(WorkerError, match=r"group 'victim' rank 1: add\(\) failed: the worker process died"):
            victim.add(1).wait(timeout=30)  # a call sent after the death fails too, at once
    victim.terminate(graceful_s=0)


def test_a_hung_served_worker_misses_its_deadline(counter: WorkerGroup) -> None:
    with serve(counter):
        pid = counter.pid().wait(timeout=30)[0]
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(WorkerTimeout, match=r"group 'counter' rank 0: add\(\) did not finish within 1 s"):
                counter.add(1).wait(timeout=1)
            assert time.monotonic() - start < 3
        finally:
            os.kill(pid, signal.SIGCONT)
