"""Runs of one process on the embedded Ray it started (`parking.py`): the next run takes over the devices and worker
processes of the last one when it has the same shape; a run of another shape, or one that fails, leaves none."""

from __future__ import annotations

import time

import pytest
import ray

from rlplace.core.config import ClusterConfig
from rlplace.scheduler import Cluster
from tests.scheduler.helpers import on_devices
from tests.scheduler.test_scheduler_hosts import Rank, gone


def test_the_next_run_of_this_process_takes_over_the_last_ones_devices_and_processes(no_ray: None) -> None:
    with Cluster(ClusterConfig()):  # the embedded Ray of this process, which its runs join (a multirun's jobs)
        two = on_devices((0,), (1,))
        with Cluster(ClusterConfig(), placements=two) as first:
            ranks = Rank.create_group().launch(first, name="ranks", placement_strategy=two)
            pids = [pid for pid, *_ in ranks.where().wait()]
        assert ray.available_resources().get("CPU", 0.0) < 1.0  # the devices stay reserved while parked

        with Cluster(ClusterConfig(), placements=two) as second:  # the same shape: takes both over
            ranks = Rank.create_group().launch(second, name="ranks", placement_strategy=two)
            assert [pid for pid, *_ in ranks.where().wait()] == pids
            assert ranks.mean_rank().wait() == [0.5, 0.5]

        one = on_devices((0,), devices_per_node=1)
        with Cluster(ClusterConfig(num_devices_per_node=1), placements=one) as third:  # another shape
            ranks = Rank.create_group().launch(third, name="ranks", placement_strategy=one)
            ((pid, *_),) = ranks.where().wait()
            assert pid not in pids and all(gone(old) for old in pids)  # what was parked is released

        with (
            pytest.raises(RuntimeError, match="the run fails"),
            Cluster(ClusterConfig(num_devices_per_node=1), placements=one) as failing,
        ):
            ranks = Rank.create_group().launch(failing, name="ranks", placement_strategy=one)
            assert [p for p, *_ in ranks.where().wait()] == [pid]
            raise RuntimeError("the run fails")
        assert gone(pid)  # a run that fails parks nothing
        assert all_cpus_free_within(10.0)


def all_cpus_free_within(seconds: float) -> bool:
    """Whether every CPU of the cluster is available again within `seconds`: Ray removes a placement group at once but
    its resource view catches up asynchronously (later on a loaded machine)."""
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU", 0.0) != ray.cluster_resources()["CPU"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
