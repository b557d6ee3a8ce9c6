"""Attaching to a multi-node Ray (`ray.cluster_utils.Cluster`: 2 nodes x 2 GPUs, faked as resources): the run's
reservation (a placement group per node, queued behind other runs), and each rank on its node, with its share of
its device, the right local devices and environment."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster as RayTestCluster
from ray.util.placement_group import placement_group_table

from rlplace.core.config import ClusterConfig
from rlplace.placement.placement import Placement
from rlplace.scheduler import Channel, Cluster, ClusterError, Worker
from rlplace.scheduler.mailbox import mailbox
from rlplace.scheduler.session import remove_session
from tests.scheduler.helpers import on_devices


class Where(Worker):
    def where(self) -> dict[str, Any]:
        names = ("RANK", "NODE_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES")
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "env": {name: os.environ[name] for name in names},
            "device": str(self.device),
            "cores": sorted(os.sched_getaffinity(0)),
            "resources": ray.get_runtime_context().get_assigned_resources(),
        }


class Echo(Worker):
    def echo(self, ping: Channel, pong: Channel, count: int) -> None:
        for _ in range(count):
            pong.put(ping.get(timeout=30), timeout=30)


def free_gpus_become(expected: float, timeout: float = 10.0) -> bool:
    """Whether Ray's view of the free GPUs, which trails the placement groups' changes, reaches `expected`."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("GPU", 0.0) != expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def two_per_node() -> list[Placement]:
    """Four ranks, one per device, node-major: rank r on node r // 2, local device r % 2."""
    return [
        Placement(
            rank=r,
            world_size=4,
            node_rank=r // 2,
            devices=(r,),
            local_devices=(r % 2,),
            local_rank=r % 2,
            local_world_size=2,
        )
        for r in range(4)
    ]


@pytest.fixture(scope="module")
def ray_cluster(no_ray: None) -> Iterator[RayTestCluster]:
    """A second Ray this process attaches to; it may hold no other Ray connection meanwhile."""
    # No dashboard: its processes, stopped with the nodes, would leave a /tmp/pymp-* folder behind.
    nodes = RayTestCluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2, "include_dashboard": False}
    )
    nodes.add_node(num_cpus=2, num_gpus=2)
    nodes.wait_for_nodes()
    session = nodes.head_node.get_session_dir_path()
    yield nodes
    nodes.shutdown()
    remove_session(session)  # Ray keeps it forever; rlplace's Cluster removes only the sessions it starts


def test_ranks_land_on_their_nodes_with_their_gpus(ray_cluster: RayTestCluster) -> None:
    cfg = ClusterConfig(num_nodes=2, num_devices_per_node=2, device_type="gpu", address=ray_cluster.address)
    with Cluster(cfg) as cluster:
        assert cluster.node_ids[0] == ray_cluster.head_node.node_id  # the driver's (head) node is node 0
        group = Where.create_group().launch(cluster, name="where", placement_strategy=two_per_node())
        for rank, seen in enumerate(group.where().wait(timeout=60)):
            node_rank, local = divmod(rank, 2)
            assert seen["node_id"] == cluster.node_ids[node_rank]
            assert seen["env"] == {
                "RANK": str(rank),
                "NODE_RANK": str(node_rank),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": cluster.node_ip(0),
                "CUDA_VISIBLE_DEVICES": str(local),  # ours, not the GPU Ray picked for the share
            }
            assert seen["device"] == "cuda:0"
            assert seen["resources"] == {"GPU": 1.0, "CPU": 1.0}  # one process per device: the whole bundle
        assert free_gpus_become(0.0)  # Ray's accounting shows the run's devices in use
        reserved = [table for table in placement_group_table().values() if table["state"] == "CREATED"]
        assert {frozenset(table["bundles_to_node_id"].values()) for table in reserved} == {
            frozenset({node_id}) for node_id in cluster.node_ids
        }  # one placement group per node, its bundles on that node
    assert not ray.is_initialized()  # disconnected, while the cluster itself keeps running for the next test


def test_cpu_devices_of_a_remote_node_own_its_cores(ray_cluster: RayTestCluster) -> None:
    cfg = ClusterConfig(num_nodes=2, num_devices_per_node=2, address=ray_cluster.address)
    with Cluster(cfg) as cluster:
        placements = on_devices((0,), (1,), node_rank=1)
        group = Where.create_group().launch(cluster, name="where", placement_strategy=placements)
        for local, seen in enumerate(group.where().wait(timeout=60)):
            assert seen["node_id"] == cluster.node_ids[1]
            assert seen["cores"] == list(cluster.cores_of(1, local))  # cores asked of node 1 itself
            assert seen["env"]["CUDA_VISIBLE_DEVICES"] == ""


def test_a_channel_crosses_nodes_directly(ray_cluster: RayTestCluster) -> None:
    """The driver on node 0 and a worker on node 1 ping-pong through two bounded channels (TCP between nodes)."""
    with Cluster(ClusterConfig(num_nodes=2, num_devices_per_node=2, address=ray_cluster.address)) as cluster:
        far = Echo.create_group().launch(cluster, name="far", placement_strategy=on_devices((0,), node_rank=1))
        ping, pong = Channel.create("ping", maxsize=1), Channel.create("pong", maxsize=1)
        echoed = far.echo(ping, pong, 20)
        for i in range(20):
            ping.put(np.full(1024, i), timeout=30)
            assert pong.get(timeout=30)[0] == i
        echoed.wait(timeout=30)
        (reader,) = {address for (channel, _), address in mailbox().readers.items() if channel == ping._id}
        assert reader.node_id == cluster.node_ids[1] and reader.name.startswith("far rank 0")


def test_attaching_refuses_a_cluster_smaller_than_declared(ray_cluster: RayTestCluster) -> None:
    with pytest.raises(ClusterError, match=r"cannot hold 3 node\(s\) x 2 cpu device\(s\): 2 node\(s\) have"):
        Cluster(ClusterConfig(num_nodes=3, num_devices_per_node=2, address=ray_cluster.address))
    with pytest.raises(ClusterError, match=r"cannot hold 2 node\(s\) x 4 gpu device\(s\): 0 node\(s\) have at least 4"):
        Cluster(ClusterConfig(num_nodes=2, num_devices_per_node=4, device_type="gpu", address=ray_cluster.address))
    assert not ray.is_initialized()  # a refused attach disconnects again


def test_inside_an_initialised_ray_the_cluster_uses_it_and_leaves_it_connected(ray_cluster: RayTestCluster) -> None:
    ray.init(address=ray_cluster.address)  # as in a Hydra Ray launcher job
    try:
        with Cluster(ClusterConfig(num_nodes=2, num_devices_per_node=2, address=None)) as cluster:
            assert cluster.node_ids[0] == ray_cluster.head_node.node_id
        assert ray.is_initialized()
    finally:
        ray.shutdown()


HOLDER = """
import sys, time
from rlplace.core.config import ClusterConfig
from rlplace.scheduler import Cluster
Cluster(ClusterConfig(num_nodes=2, num_devices_per_node=2, device_type="gpu", address=sys.argv[1])).reserve()
print("reserved", flush=True)
time.sleep(600)
"""


def test_runs_sharing_a_ray_queue_and_a_killed_run_frees_its_devices(
    ray_cluster: RayTestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, ray_cluster.address], stdout=subprocess.PIPE, text=True)
    ray.init(address=ray_cluster.address)  # both runs below join this connection, as jobs of a Hydra Ray sweep
    try:
        cfg = ClusterConfig(num_nodes=2, num_devices_per_node=2, device_type="gpu")
        assert holder.stdout is not None and holder.stdout.readline() == "reserved\n"
        queued = Cluster(dataclasses.replace(cfg, reserve_timeout_s=30))
        waiter = threading.Thread(target=queued.reserve)
        waiter.start()
        with caplog.at_level(logging.WARNING), pytest.raises(ClusterError, match="did not reserve .* within 1 s"):
            Cluster(dataclasses.replace(cfg, reserve_timeout_s=1)).reserve()
        assert "waiting up to 1 s for Ray to reserve this run's devices (2 node(s), 4 GPU, 4 CPU)" in caplog.text
        assert waiter.is_alive()  # still queued behind the holder
        holder.kill()  # no shutdown: Ray removes a dead driver's placement groups
        waiter.join(timeout=20)
        assert not waiter.is_alive()
        assert free_gpus_become(0.0)
        queued.shutdown()
        assert free_gpus_become(4.0)  # released at shutdown
    finally:
        holder.kill()
        holder.wait()
        ray.shutdown()
