"""Shared fixtures: compose configs the way `rlplace-train` does, without starting anything."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rlplace.core.config import CONF_DIR, ClusterConfig
from rlplace.families import register
from rlplace.scheduler import Cluster

ROOT = Path(__file__).resolve().parents[1]


def group_options(group: str) -> list[str]:
    """Every option of a config group, by file name."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models and tensors: one thread is as fast, and on a busy 2-core machine threads spinning for a core that
    another process holds can make a 10 ms update take seconds. Worker processes set their own threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def shared_ray() -> Iterator[None]:
    """One embedded Ray for a module's in-process runs (`rlplace.train.train`): each run's Cluster joins it instead
    of starting and stopping its own, which costs seconds, and takes over the devices and worker processes that the
    run before it left (`scheduler/parking.py`) where it has the same devices. A Ray this process is already
    connected to is joined and left running."""
    if ray.is_initialized():
        yield
        return
    with Cluster(ClusterConfig()):
        yield


@pytest.fixture
def compose_cfg() -> Callable[..., DictConfig]:
    register()

    def _compose(*overrides: str) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="train", overrides=list(overrides))

    return _compose
