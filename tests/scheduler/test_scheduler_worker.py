"""Worker groups on a real embedded Ray: placement and environment per rank, fan-out and futures, failures; served
groups, whose calls go through the mailboxes, answering as Ray calls do, with the same errors, deaths and hangs."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rlplace.placement import Placement, PlacementStrategy
from rlplace.scheduler import (
    Cluster,
    Worker,
    WorkerError,
    WorkerGroup,
    WorkerTimeout,
    serve,
    timer,
    wait_all,
    wait_started,
)
from tests.scheduler.helpers import on_devices

ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


class Probe(Worker):
    """Reports what a rank sees, and sleeps or fails on demand."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def env(self) -> dict[str, str | None]:
        names = (*ENV_NAMES, "CUDA_VISIBLE_DEVICES", "RLPLACE_LOCAL_DEVICES", "OMP_NUM_THREADS")
        return {name: os.environ.get(name) for name in names}

    def affinity(self) -> tuple[list[list[int]], int]:
        """The CPU affinity of every thread of the process, and the thread count of a torch imported only now (the
        probes' processes otherwise never load it: this module is what they import)."""
        import torch

        threads = [sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")]
        return threads, torch.get_num_threads()

    def garbage_collection(self) -> tuple[bool, bool, bool]:
        """Whether the cyclic garbage collector is on; whether it still walks this module's globals (imported
        before the worker was built); whether it walks this worker's own state (made after)."""
        walked = {id(obj) for obj in gc.get_objects()}
        return gc.isenabled(), id(globals()) in walked, id(self) in walked

    def identity(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "group": self.group_name,
            "placement": self.placement,
            "device": str(self.device),
            "tag": self.tag,
        }

    def pid(self) -> int:
        return os.getpid()

    def echo(self, value: Any) -> tuple[int, Any]:
        return self.rank, value

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @timer("step")
    def step(self, seconds: float) -> int:
        with self.span("sleep"):
            time.sleep(seconds)
        return self.rank

    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} refuses")
        return self.rank

    def _helper(self) -> None:
        """Private: not callable through the group."""


class Broken(Worker):
    def __init__(self) -> None:
        raise RuntimeError("missing config")


class Clashing(Worker):
    def terminate(self) -> None:
        """Would be shadowed by WorkerGroup.terminate."""


class FixedStrategy(PlacementStrategy):
    """The smallest placement strategy: the same placements whatever the cluster."""

    def __init__(self, placements: list[Placement]) -> None:
        self.placements = placements

    @property
    def num_processes(self) -> int:
        return len(self.placements)

    def get_placements(self, num_nodes: int, num_devices_per_node: int) -> list[Placement]:
        return self.placements


@pytest.fixture(scope="module")
def probe(cluster: Cluster) -> Iterator[WorkerGroup]:
    """Ranks 0 and 1 on one logical device each, rank 2 on both devices."""
    strategy = FixedStrategy(on_devices((0,), (1,), (0, 1)))
    probe = Probe.create_group("t").launch(cluster, name="probe", placement_strategy=strategy)
    yield probe
    probe.terminate()


def test_each_rank_gets_its_environment(probe: WorkerGroup) -> None:
    envs = probe.env().wait()
    assert [env["RANK"] for env in envs] == ["0", "1", "2"]
    assert {env["WORLD_SIZE"] for env in envs} == {"3"}
    assert {env["LOCAL_WORLD_SIZE"] for env in envs} == {"3"}
    assert {env["NODE_RANK"] for env in envs} == {"0"}
    assert {env["MASTER_ADDR"] for env in envs} == {"127.0.0.1"}  # the embedded Ray is bound to loopback
    assert len({env["MASTER_PORT"] for env in envs}) == 1
    assert [env["RLPLACE_LOCAL_DEVICES"] for env in envs] == ["0", "1", "0,1"]
    assert {env["CUDA_VISIBLE_DEVICES"] for env in envs} == {""}  # logical cpu devices are no CUDA devices
    assert [env["OMP_NUM_THREADS"] for env in envs] == ["1", "1", "2"]


def test_what_a_process_imported_before_its_worker_is_frozen_out_of_garbage_collection(probe: WorkerGroup) -> None:
    assert probe.garbage_collection().wait() == [(True, False, True)] * 3


def test_each_rank_is_pinned_to_its_devices_cores(cluster: Cluster, probe: WorkerGroup) -> None:
    expected = [cluster.cores_of(0, 0), cluster.cores_of(0, 1), cluster.cores_of(0, 0) + cluster.cores_of(0, 1)]
    for (threads, num_threads), cores in zip(probe.affinity().wait(), expected, strict=True):
        assert all(thread == sorted(cores) for thread in threads)  # every thread, not only the calling one
        assert num_threads == len(cores)


PINNED_BEFORE_TORCH = """
import os
from rlplace.scheduler.worker import pin_process
os.environ["OMP_NUM_THREADS"] = "1"  # as a rank sets it, after the process started
pin_process((min(os.sched_getaffinity(0)),))
import torch
print(torch.get_num_threads())
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to tell 1 thread from all")
def test_a_rank_pinned_where_openmp_was_preloaded_gets_one_thread_per_core() -> None:
    """OpenMP preloaded (LD_PRELOAD, as a user's shell may set it, and as vLLM sets it in a process that built an
    engine, whose later children inherit it) reads OMP_NUM_THREADS when the process starts, before the rank sets it:
    pinning must size torch's pool itself."""
    import torch

    libgomp = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    if not os.path.exists(libgomp):
        pytest.skip("this torch build brings no libgomp of its own")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"LD_PRELOAD": libgomp}
    done = subprocess.run([sys.executable, "-c", PINNED_BEFORE_TORCH], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1"]


def test_worker_knows_its_placement(probe: WorkerGroup) -> None:
    identities = probe.identity().wait()
    assert [i["placement"] for i in identities] == probe.placements
    assert {(i["world_size"], i["group"], i["device"], i["tag"]) for i in identities} == {(3, "probe", "cpu", "t")}
    assert probe.world_size == 3 and probe.name == "probe" and len(probe.workers) == 3


def test_wait_returns_results_in_rank_order_and_done_polls(probe: WorkerGroup) -> None:
    future = probe.sleep(0.5)
    assert not future.done()
    assert future.wait(timeout=30) == [0, 1, 2]
    assert future.done()


def test_wait_times_out_without_losing_results(probe: WorkerGroup) -> None:
    future = probe.sleep(1.0)
    with pytest.raises(TimeoutError, match=r"group 'probe' rank 0: sleep\(\) did not finish within 0.1 s"):
        future.wait(timeout=0.1)
    assert future.wait(timeout=30) == [0, 1, 2]


def test_calls_waited_without_a_timeout_keep_the_groups_hang_deadline(probe: WorkerGroup) -> None:
    probe.call_timeout_s = 0.2
    try:
        with pytest.raises(WorkerTimeout, match=r"group 'probe' rank 0: sleep\(\) did not finish within 0.2 s \(hung"):
            (slow := probe.sleep(1.0)).wait()
        assert slow.wait(timeout=30) == [0, 1, 2]  # the deadline reports the call; the call itself goes on
        with pytest.raises(WorkerTimeout, match=r"group 'probe' rank 1: sleep\(\) did not finish within 0.2 s"):
            wait_all(probe.execute_on(0).echo("fast"), probe.execute_on(1).sleep(1.0))
    finally:
        probe.call_timeout_s = None
    assert probe.sleep(0.3).wait() == [0, 1, 2]


def test_execute_on_calls_a_subset_in_the_order_given(probe: WorkerGroup) -> None:
    assert probe.execute_on(2, 0).echo("a").wait() == [(2, "a"), (0, "a")]
    assert probe.echo("same").wait() == [(0, "same"), (1, "same"), (2, "same")]
    with pytest.raises(ValueError, match="cannot execute on"):
        probe.execute_on(3)


def test_unknown_or_private_methods_raise_attribute_error(probe: WorkerGroup) -> None:
    with pytest.raises(
        AttributeError, match=r"Probe has no public method 'nope'; group 'probe' can call: affinity, .*, echo, env"
    ):
        probe.nope()
    with pytest.raises(AttributeError):
        probe._helper()
    with pytest.raises(AttributeError, match="no public method 'create_group'"):
        probe.create_group()  # a class method stays on the driver
    with pytest.raises(AttributeError, match="no public method 'rank'"):
        probe.execute_on(0).rank()  # a property stays in the worker


def test_constructing_a_worker_directly_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"Probe\.create_group\(\.\.\.\)\.launch\(cluster"):
        Probe("direct")


def test_worker_exception_names_group_rank_method_and_remote_traceback(probe: WorkerGroup) -> None:
    with pytest.raises(WorkerError) as caught:
        probe.fail_on(1).wait(timeout=30)
    error = caught.value
    assert (error.group, error.rank, error.method) == ("probe", 1, "fail_on")
    assert "group 'probe' rank 1: fail_on() raised" in str(error)
    assert 'in fail_on\n    raise ValueError(f"rank {rank} refuses")' in str(error)
    assert isinstance(error.cause, ValueError)
    assert probe.echo(1).wait() == [(0, 1), (1, 1), (2, 1)]  # a failed call leaves the group usable


def test_wait_all_fails_fast_across_futures(probe: WorkerGroup) -> None:
    assert wait_all(probe.echo("a"), probe.execute_on(1).echo("b")) == [[(0, "a"), (1, "a"), (2, "a")], [(1, "b")]]
    slow, failing = probe.execute_on(0).sleep(2.0), probe.execute_on(1).fail_on(1)
    start = time.monotonic()
    with pytest.raises(WorkerError, match="group 'probe' rank 1: fail_on"):
        wait_all(slow, failing, timeout=30)
    assert time.monotonic() - start < 2.0  # did not wait for the sleeping rank
    assert slow.wait(timeout=30) == [0]


def test_timer_and_span_records_are_drained_by_the_driver(probe: WorkerGroup) -> None:
    probe.pop_timings().wait()
    before = time.time()
    probe.step(0.05).wait()
    spans_by_rank = probe.pop_timings().wait()
    expected = [[("sleep", "probe", rank), ("step", "probe", rank)] for rank in range(3)]  # the inner span ends first
    assert [[(s["name"], s["group"], s["rank"]) for s in spans] for spans in spans_by_rank] == expected
    for sleep, step in spans_by_rank:
        assert set(step) == {"name", "group", "rank", "start", "end"}  # a metrics.timeline.Span
        assert before <= step["start"] <= sleep["start"] < sleep["end"] and step["end"] <= time.time()
        assert step["end"] - step["start"] >= sleep["end"] - sleep["start"] >= 0.05
    assert probe.pop_timings().wait() == [[], [], []]


def test_timer_refuses_async_methods() -> None:
    async def step() -> None: ...

    with pytest.raises(TypeError, match=r"@timer\('step'\) on .*step: worker methods are timed only when sync"):
        timer("step")(step)


def test_sigkilled_worker_is_reported_dead_within_30s(cluster: Cluster) -> None:
    victim = Probe.create_group("v").launch(cluster, name="victim", placement_strategy=on_devices((0,), (1,)))
    pids = victim.pid().wait()
    future = victim.sleep(60)
    time.sleep(0.5)
    start = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"group 'victim' rank 1: sleep\(\) failed: the worker process died"):
        future.wait(timeout=30)  # rank 0 is still sleeping: wait() must not wait for it
    assert time.monotonic() - start < 30
    victim.terminate(graceful_s=0)


def test_launch_checks_placements_before_starting_anything(cluster: Cluster, probe: WorkerGroup) -> None:
    wrong_node = on_devices((0,), node_rank=1)
    with pytest.raises(ValueError, match="group 'bad': rank 0 is on node 1, but the cluster has 1"):
        Probe.create_group("x").launch(cluster, name="bad", placement_strategy=wrong_node)
    with pytest.raises(ValueError, match=r"rank 0 uses local devices \[2\], but nodes have 2"):
        Probe.create_group("x").launch(cluster, name="bad", placement_strategy=on_devices((2,)))
    with pytest.raises(ValueError, match="ranks must be 0..1 in order"):
        Probe.create_group("x").launch(cluster, name="bad", placement_strategy=on_devices((0,), (1,))[::-1])
    with pytest.raises(ValueError, match="a worker group named 'probe' is already running"):
        Probe.create_group("x").launch(cluster, name="probe", placement_strategy=on_devices((0,)))
    with pytest.raises(TypeError, match=r"Clashing methods \['terminate'\] are WorkerGroup attributes"):
        Clashing.create_group().launch(cluster, name="clash", placement_strategy=on_devices((0,)))


def test_failing_init_is_reported_at_launch(cluster: Cluster) -> None:
    with pytest.raises(WorkerError, match=r"(?s)group 'broken' rank 0: __init__\(\) failed.*missing config"):
        Broken.create_group().launch(cluster, name="broken", placement_strategy=on_devices((0,)))


def test_groups_started_together_are_ready_together(cluster: Cluster) -> None:
    first = Probe.create_group("a").start(cluster, name="first", placement_strategy=on_devices((0,)))
    second = Probe.create_group("b").start(cluster, name="second", placement_strategy=on_devices((1,)))
    groups = wait_started(first, second)
    assert groups == [first.group, second.group]
    assert [group.identity().wait()[0]["tag"] for group in groups] == ["a", "b"]
    for group in groups:
        group.terminate()


def test_a_failing_init_tears_down_every_group_started_with_it(cluster: Cluster) -> None:
    healthy = Probe.create_group("h").start(cluster, name="healthy", placement_strategy=on_devices((0,)))
    broken = Broken.create_group().start(cluster, name="broken", placement_strategy=on_devices((1,)))
    with pytest.raises(WorkerError, match=r"(?s)group 'broken' rank 0: __init__\(\) failed.*missing config"):
        wait_started(healthy, broken)
    assert healthy.group.terminated and broken.group.terminated


class Counter(Probe):
    """A probe that also counts, and returns what cannot be pickled."""

    def __init__(self) -> None:
        super().__init__("counter")
        self.total = 0

    def add(self, amount: int) -> int:
        self.total += amount
        return self.total

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


def test_a_stopped_process_is_named_rather_than_a_call_waiting_for_it(cluster: Cluster) -> None:
    # A run's inference worker stopped (SIGSTOP) while the actor broadcasts weights to it: both calls miss the
    # deadline, and the one to name is the process that does not answer, not the first call waited on.
    waiting, stopped = _launch(cluster, "waiting"), _launch(cluster, "stopped")
    assert [pid for _, pid in stopped.processes] == stopped.pid().wait(timeout=30)
    pid = stopped.processes[1][1]
    os.kill(pid, signal.SIGSTOP)
    try:
        message = r"group 'stopped' rank 1: add\(\) did not finish within 2 s \(the caller's timeout; its process is"
        with pytest.raises(WorkerTimeout, match=message):
            wait_all(waiting.sleep(60), stopped.add(1), timeout=2)
    finally:
        os.kill(pid, signal.SIGCONT)
        waiting.terminate(graceful_s=0)
        stopped.terminate(graceful_s=0)
