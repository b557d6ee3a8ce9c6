"""Scheduler test fixtures: one embedded Ray shared by all scheduler tests, because starting Ray takes seconds.

Tests take the `cluster` fixture (2 logical cpu devices) and terminate the groups they launch. Tests that need no
Ray in this process (they start or attach to their own, or check what a start refuses) take `no_ray`, which shuts
the shared cluster down; a later `cluster` user would start a new one, but `pytest_collection_modifyitems` runs
those modules last, so the shared cluster starts once. It is package-scoped: shut down after the last scheduler test,
so it never leaks into other tests that start a Ray of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from rlplace.core.config import ClusterConfig
from rlplace.scheduler import Cluster


class SharedCluster:
    """The scheduler tests' cluster, started on first use and again after a `stop`."""

    def __init__(self) -> None:
        self._running: Cluster | None = None

    def get(self) -> Cluster:
        if self._running is None:
            self._running = Cluster(ClusterConfig())
        return self._running

    def stop(self) -> None:
        if self._running is not None:
            self._running.shutdown()
            self._running = None


@pytest.fixture(scope="package")
def shared_cluster() -> Iterator[SharedCluster]:
    shared = SharedCluster()
    yield shared
    shared.stop()


@pytest.fixture(scope="module")
def cluster(shared_cluster: SharedCluster) -> Cluster:
    """An embedded single-node Ray with 2 logical cpu devices."""
    return shared_cluster.get()


@pytest.fixture(scope="module")
def no_ray(shared_cluster: SharedCluster) -> None:
    """No Ray connection in this process: the shared cluster is shut down."""
    shared_cluster.stop()
    assert not ray.is_initialized()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every scheduler test `ray` (`make test-fast` leaves them out), and move the modules whose tests take
    `no_ray` after the others, keeping each module's tests together.

    The hook sees the whole session's items; only those under this folder change places, among themselves.
    """
    here = Path(__file__).parent
    positions = [i for i, item in enumerate(items) if here in item.path.parents]
    for i in positions:
        items[i].add_marker(pytest.mark.ray)
    needs_no_ray = {items[i].path for i in positions if "no_ray" in items[i].fixturenames}
    ordered = sorted((items[i] for i in positions), key=lambda item: item.path in needs_no_ray)
    for i, item in zip(positions, ordered, strict=True):
        items[i] = item
