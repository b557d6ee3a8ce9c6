"""Scheduler test fixtures: real Ray clusters, shared per test module because starting Ray takes seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlplace.config import ClusterConfig
from rlplace.scheduler import Cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """An embedded single-node Ray with 2 logical cpu devices, for the whole test module."""
    with Cluster(ClusterConfig()) as running:
        yield running
