"""A worker's environment, written by the driver before the process starts (no Ray needed)."""

from __future__ import annotations

import pytest

from rlplace.placement import Placement
from rlplace.scheduler.context import PINNED_REGISTER, WorkerContext, worker_env


def context(device_type: str) -> WorkerContext:
    placement = Placement(
        rank=1, world_size=2, node_rank=0, devices=(1,), local_devices=(1,), local_rank=1, local_world_size=2
    )
    return WorkerContext("actor", "actor-1", placement, device_type, (), "rendezvous")


def test_a_gpu_worker_sees_only_its_gpu_and_pins_host_memory_from_several_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    env = worker_env(context("gpu"), "10.0.0.1", 29500)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["RANK"] == "1" and env["MASTER_PORT"] == "29500"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == PINNED_REGISTER


def test_the_users_allocator_settings_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    extended = worker_env(context("gpu"), "10.0.0.1", 29500)["PYTORCH_CUDA_ALLOC_CONF"]
    assert extended == f"expandable_segments:True,{PINNED_REGISTER}"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "pinned_use_cuda_host_register:False")
    assert worker_env(context("gpu"), "10.0.0.1", 29500)["PYTORCH_CUDA_ALLOC_CONF"] == (
        "pinned_use_cuda_host_register:False"
    )


def test_a_cpu_worker_sees_no_gpu_and_gets_no_allocator_settings() -> None:
    env = worker_env(context("cpu"), "10.0.0.1", 29500)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
