"""Shared fixtures: compose configs the way `rlplace-train` does, without starting anything; the embedded Ray that
the modules of one pytest process share."""

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


class SessionRay:
    """This pytest process's embedded Ray (2 logical cpu devices), started by the first module that needs one and
    kept for the modules after it: a start costs seconds and a set of Ray's own processes, and a run takes over the
    devices and worker processes that the run before it parked (`scheduler/parking.py`), also across modules. A
    module that needs no Ray in this process stops it (`no_ray`); the next one that needs it starts it again."""

    def __init__(self) -> None:
        self._owner: Cluster | None = None

    def start(self) -> None:
        """Start it unless this process is connected to a Ray, this one or another (which is then joined)."""
        if not ray.is_initialized():
            self._owner = Cluster(ClusterConfig())

    def stop(self) -> None:
        if self._owner is not None:
            self._owner.shutdown()
            self._owner = None


@pytest.fixture(scope="session")
def session_ray() -> Iterator[SessionRay]:
    shared = SessionRay()
    yield shared
    shared.stop()


@pytest.fixture(scope="module")
def shared_ray(session_ray: SessionRay) -> None:
    """The embedded Ray for a module's in-process runs (`rlplace.train.train`): each run's Cluster joins it instead
    of starting and stopping its own."""
    session_ray.start()


@pytest.fixture(scope="module")
def no_ray(session_ray: SessionRay) -> None:
    """No Ray connection in this process, for a module whose tests start or attach to their own, or check that a
    refusal comes before anything starts."""
    session_ray.stop()
    assert not ray.is_initialized()


@pytest.fixture
def compose_cfg() -> Callable[..., DictConfig]:
    register()

    def _compose(*overrides: str) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="train", overrides=list(overrides))

    return _compose
