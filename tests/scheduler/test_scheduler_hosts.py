"""Worker processes kept across a re-placement (`Cluster.replace`): the new ranks take over the old processes on their
devices, re-pinned, with a fresh torch.distributed group; the processes no rank takes stop; shares kept from the old
placement leave room for the new processes; a process that loaded vLLM is not reused; a rank that dies in a kept
process is named like any other failure."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlplace.scheduler import Cluster, Worker, WorkerError
from tests.scheduler.helpers import on_devices


class Rank(Worker):
    """Says which process it runs in and where, and averages a number over its group with torch.distributed."""

    def where(self) -> tuple[int, str, int, list[int]]:
        return os.getpid(), self.group_name, self.rank, sorted(os.sched_getaffinity(0))

    def mean_rank(self) -> float:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            self.init_process_group(timeout_s=60)
        tensor = torch.tensor([float(self.rank)])
        dist.all_reduce(tensor)
        return tensor.item() / self.world_size

    def load_vllm(self) -> str:
        """Stand in for a rollout that built a vLLM engine: the host looks for the module; the engine's scratch
        folder, which `close` removes, is returned."""
        sys.modules.setdefault("vllm", types.ModuleType("vllm"))
        self.scratch = tempfile.mkdtemp(prefix="rlplace-test-engine-")
        return self.scratch

    def close(self) -> None:
        if hasattr(self, "scratch"):
            shutil.rmtree(self.scratch)


class DiesOnStart(Worker):
    """A worker whose process exits while the worker is being built."""

    def __init__(self) -> None:
        os._exit(1)


def gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_re_placed_run_starts_its_ranks_in_the_old_ranks_processes(cluster: Cluster) -> None:
    old = Rank.create_group().launch(cluster, name="old", placement_strategy=on_devices((0,), (1,), (1,)))
    before = [pid for pid, *_ in old.where().wait()]
    assert old.mean_rank().wait() == [1.0] * 3  # the old ranks hold a process group

    # Device 1 wants one of its two processes, device 0 one more than its own: device 1's spare one, re-pinned.
    cluster.replace(on_devices((1,), (0,), (0,)))
    new = Rank.create_group().launch(cluster, name="new", placement_strategy=on_devices((1,), (0,), (0,)))
    after = new.where().wait()
    pids = [pid for pid, *_ in after]
    assert sorted(pids) == sorted(before)  # no process started, none stopped
    # Device 1's rank in a process of device 1, device 0's in its own and in device 1's spare one.
    assert pids[0] in before[1:] and before[0] in pids[1:]
    assert [(group, rank, cores) for _, group, rank, cores in after] == [
        ("new", 0, list(cluster.cores_of(0, 1))),
        ("new", 1, list(cluster.cores_of(0, 0))),
        ("new", 2, list(cluster.cores_of(0, 0))),
    ]
    assert new.mean_rank().wait() == [1.0] * 3  # a process group of the new ranks, in the same processes

    # Four ranks on device 0: the three processes are kept (two of them started in device 1's bundle) and one more
    # starts, asking for what the shares kept in device 0's bundle leave.
    cluster.replace(on_devices((0,), (0,), (0,), (0,)))
    new = Rank.create_group().start(cluster, name="third", placement_strategy=on_devices((0,), (0,), (0,), (0,)))
    new.init.wait(timeout=60)
    third = new.group.where().wait()
    assert sorted(pid in pids for pid, *_ in third) == [False, True, True, True]
    assert all(cores == list(cluster.cores_of(0, 0)) for *_, cores in third)
    assert new.group.mean_rank().wait() == [1.5] * 4

    # One rank on device 1: it takes a process of device 1's bundle; the three that no rank takes stop.
    cluster.replace(on_devices((1,)))
    last = Rank.create_group().launch(cluster, name="last", placement_strategy=on_devices((1,)))
    ((pid, *_),) = last.where().wait()
    assert pid in before[1:]
    assert all(gone(other) for other, *_ in third if other != pid)

    cluster.replace([])
    assert gone(pid)


def test_a_process_that_loaded_vllm_is_not_reused(cluster: Cluster) -> None:
    old = Rank.create_group().launch(cluster, name="old", placement_strategy=on_devices((0,), (1,)))
    scratch = Path(old.execute_on(1).load_vllm().wait()[0])
    pids = [pid for pid, *_ in old.where().wait()]

    cluster.replace(on_devices((0,), (1,)))
    new = Rank.create_group().launch(cluster, name="new", placement_strategy=on_devices((0,), (1,)))
    after = [pid for pid, *_ in new.where().wait()]
    assert after[0] == pids[0] and after[1] != pids[1]
    assert gone(pids[1])
    assert not scratch.exists()  # the worker was closed before its process was killed (no exit handler runs then)


def test_a_rank_that_dies_in_a_kept_process_during_a_switch_is_named(cluster: Cluster) -> None:
    old = Rank.create_group().launch(cluster, name="old", placement_strategy=on_devices((0,), (1,)))
    pids = [pid for pid, *_ in old.where().wait()]

    cluster.replace(on_devices((0,), (1,)))  # both processes kept: the new ranks die in them, as they are built
    with pytest.raises(WorkerError, match=r"group 'new' rank \d: __init__\(\) failed: the worker process died"):
        DiesOnStart.create_group().launch(cluster, name="new", placement_strategy=on_devices((0,), (1,)))
    assert all(gone(pid) for pid in pids)


@pytest.fixture(autouse=True)
def _leave_no_process(cluster: Cluster) -> Iterator[None]:
    """Each test ends with no worker process left, and the shared cluster sharing its devices as when it started."""
    yield
    cluster.replace([])
