"""Scheduler test fixtures: tests take the `cluster` fixture (2 logical cpu devices, on the Ray that this pytest process
shares between modules, `tests/conftest.py`) and terminate the groups they launch. Tests that need no Ray in this
process (they start or attach to their own, or check what a start refuses) take `no_ray`, which stops the shared
one; `pytest_collection_modifyitems` runs those modules after the others, so that it starts once in a run of
the scheduler tests alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlplace.core.config import ClusterConfig
from rlplace.scheduler import Cluster
from tests.conftest import SessionRay


@pytest.fixture(scope="module")
def cluster(session_ray: SessionRay) -> Iterator[Cluster]:
    """A run's Cluster with 2 logical cpu devices on the shared Ray; its groups, processes and reservation go at the
    module's end."""
    session_ray.start()
    joined = Cluster(ClusterConfig())
    yield joined
    joined.shutdown()


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
