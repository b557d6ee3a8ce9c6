"""GPU paths of the scheduler: CUDA_VISIBLE_DEVICES per rank, CUDA IPC on one GPU, NCCL between GPUs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rlplace.core.config import ClusterConfig
from rlplace.scheduler import Cluster, Worker, WorkerGroup, timer
from tests.scheduler.helpers import on_devices

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


def payload(device: torch.device) -> dict[str, Any]:
    return {
        "weight": torch.arange(4096, dtype=torch.float32, device=device).reshape(64, 64),
        "bias": torch.ones(64, dtype=torch.bfloat16, device=device),
        "cpu_step": torch.tensor([5]),
        "version": 2,
    }


class GpuPeer(Worker):
    def visible(self) -> tuple[str, int, str]:
        return os.environ["CUDA_VISIBLE_DEVICES"], torch.cuda.device_count(), str(self.device)

    def broadcast_payload(self, group: str) -> None:
        self.broadcast(payload(self.device), group)

    def recv_payload(self, group: str, rank: int) -> dict[str, Any]:
        received = self.recv(group, rank)
        assert received["weight"].device == self.device and received["cpu_step"].device.type == "cpu"
        return {key: value.cpu() if isinstance(value, torch.Tensor) else value for key, value in received.items()}

    @timer("allocate")
    def allocate(self, mb: int) -> int:
        """Keep `mb` MiB on the device and briefly use as much again (the span's peak and resident bytes)."""
        self.kept = torch.empty(mb * 2**20, dtype=torch.uint8, device=self.device)
        torch.empty(mb * 2**20, dtype=torch.uint8, device=self.device).fill_(1)
        return mb

    def all_reduce(self) -> float:
        self.init_process_group()
        tensor = torch.ones(1, device=self.device)
        dist.all_reduce(tensor)
        return tensor.item()


def assert_payload(received: dict[str, Any]) -> None:
    expected = payload(torch.device("cpu"))
    assert received.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(received[key], value) if isinstance(value, torch.Tensor) else received[key] == value


@pytest.fixture(scope="module")
def cluster(no_ray: None) -> Iterator[Cluster]:
    """A gpu cluster of its own, instead of the session's cpu one."""
    with Cluster(ClusterConfig(device_type="gpu", num_devices_per_node=torch.cuda.device_count())) as running:
        yield running


@pytest.fixture(scope="module")
def same_gpu(cluster: Cluster) -> Iterator[tuple[WorkerGroup, WorkerGroup]]:
    """Two groups whose ranks all share GPU 0, as in a collocated placement."""
    count = cluster.num_devices_per_node
    actor = GpuPeer.create_group().launch(
        cluster, name="actor", placement_strategy=on_devices((0,), devices_per_node=count)
    )
    rollout = GpuPeer.create_group().launch(
        cluster, name="rollout", placement_strategy=on_devices((0,), (0,), devices_per_node=count)
    )
    yield actor, rollout
    actor.terminate()
    rollout.terminate()


def test_each_rank_sees_only_its_gpu(same_gpu: tuple[WorkerGroup, WorkerGroup]) -> None:
    _, rollout = same_gpu
    assert rollout.visible().wait(timeout=60) == [("0", 1, "cuda:0"), ("0", 1, "cuda:0")]


def test_cuda_ipc_between_processes_on_one_gpu(same_gpu: tuple[WorkerGroup, WorkerGroup]) -> None:
    actor, rollout = same_gpu
    received = actor.recv_payload("rollout", 1)
    rollout.execute_on(1).broadcast_payload("actor").wait(timeout=120)  # to a group of one rank
    assert_payload(received.wait(timeout=120)[0])
    received = rollout.recv_payload("actor", 0)
    actor.broadcast_payload("rollout").wait(timeout=120)
    for rank_received in received.wait(timeout=120):
        assert_payload(rank_received)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_nccl_between_gpus_and_mixed_broadcast(cluster: Cluster) -> None:
    count = cluster.num_devices_per_node
    actor = GpuPeer.create_group().launch(
        cluster, name="actor2", placement_strategy=on_devices((0,), devices_per_node=count)
    )
    rollout = GpuPeer.create_group().launch(
        cluster, name="rollout2", placement_strategy=on_devices((1,), (0,), devices_per_node=count)
    )
    received = actor.recv_payload("rollout2", 0)
    rollout.execute_on(0).broadcast_payload("actor2").wait(timeout=120)  # GPU 1 -> GPU 0: NCCL
    assert_payload(received.wait(timeout=120)[0])
    received = rollout.recv_payload("actor2", 0)
    actor.broadcast_payload("rollout2").wait(timeout=120)  # NCCL to rank 0, CUDA IPC to rank 1
    for rank_received in received.wait(timeout=120):
        assert_payload(rank_received)
    assert GpuPeer.create_group().launch(
        cluster, name="ddp", placement_strategy=on_devices((0,), (1,), devices_per_node=count)
    ).all_reduce().wait(timeout=120) == [2.0, 2.0]


def test_timed_methods_of_a_cuda_worker_carry_its_peak_and_resident_memory(
    same_gpu: tuple[WorkerGroup, WorkerGroup],
) -> None:
    actor, _ = same_gpu
    actor.pop_timings().wait(timeout=60)
    actor.allocate(64).wait(timeout=60)
    (span,) = actor.pop_timings().wait(timeout=60)[0]
    mib = 2**20
    assert span["name"] == "allocate"
    assert span["resident_bytes"] >= 64 * mib  # also what earlier tests left
    assert span["peak_bytes"] - span["resident_bytes"] == 64 * mib  # the temporary
