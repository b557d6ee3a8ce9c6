"""Shared fixtures: compose configs the way `rlplace-train` does, without starting anything; the embedded Ray that
the modules of one pytest process share; and the order in which `make test` hands test files to its pytest
processes (`SHARED_RUNS`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from xdist.scheduler import LoadFileScheduling

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


SHARED_RUNS = {
    "embodied runs": (
        "tests/test_report.py",
        "tests/planner/test_planning.py",
        "tests/embodied/test_runner.py",
        "tests/faults/test_faults.py",
    ),
    "reasoning runs": (
        "tests/test_extending.py",
        "tests/reasoning/test_gsm8k.py",
        "tests/reasoning/test_runner.py",
        "tests/reasoning/test_placements.py",
    ),
}
"""Test files whose runs train in the pytest process on its shared Ray, in an order in which each run's devices are
mostly those of the run before it, so that it takes over that run's worker processes (`scheduler/parking.py`)
instead of starting its own: a worker process costs seconds of CPU to import torch (and transformers). Each group
runs in this order, one file after another in one pytest process (`SharedRunsFirst`)."""
UNIT_OF = {path: unit for unit, paths in SHARED_RUNS.items() for path in paths}


@pytest.hookimpl(trylast=True)  # after tests/scheduler/conftest.py has marked its tests `ray`
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The order in which `make test` hands out test files (`SharedRunsFirst`): `SHARED_RUNS` first, in their order;
    then the files with end-to-end runs or Ray processes (`slow`, `ray`), those that stop the shared Ray (`no_ray`)
    after the others, then the rest, each most tests first, so that the quick files come last and fill in while the
    other pytest process finishes its last file. Each file's tests keep their order."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = [path for paths in SHARED_RUNS.values() for path in paths]

    def key(path: str) -> tuple[int, bool, bool, int]:
        heavy = any(item.get_closest_marker(mark) for item in files[path] for mark in ("slow", "ray"))
        stops_ray = any("no_ray" in item.fixturenames for item in files[path])
        return (order.index(path) if path in order else len(order), not heavy, stops_ray, -len(files[path]))

    items[:] = [item for path in sorted(files, key=key) for item in files[path]]


class SharedRunsFirst(LoadFileScheduling):
    """`--dist loadfile` (a test file at a time to each pytest process, `make test`) in the order of the collection
    (`pytest_collection_modifyitems`), with each group of `SHARED_RUNS` as one unit of work: they are the longest
    units, one to each process, handed out first."""

    def __init__(self, config: pytest.Config, log) -> None:
        config.option.loadscopereorder = False  # xdist (3.8 on) would order the units by their number of tests
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return UNIT_OF.get(path, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadFileScheduling | None:
    return SharedRunsFirst(config, log) if config.getvalue("dist") == "loadfile" else None
