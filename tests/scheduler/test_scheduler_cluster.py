"""Cluster checks that need no running Ray: how logical devices split a node's cores, and refused configs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from rlplace.core.config import ClusterConfig
from rlplace.scheduler import Cluster, ClusterError
from rlplace.scheduler.cluster import split_cores


def test_cores_split_evenly_between_logical_devices() -> None:
    assert split_cores([0, 1, 2, 3, 4], num_devices=2, cpus_per_device=None) == [(0, 1), (2, 3)]
    assert split_cores([4, 5, 6, 7], num_devices=4, cpus_per_device=None) == [(4,), (5,), (6,), (7,)]


def test_more_devices_than_cores_wrap_round_robin() -> None:
    assert split_cores([0, 1], num_devices=5, cpus_per_device=None) == [(0,), (1,), (0,), (1,), (0,)]


def test_explicit_cores_per_device_must_fit_the_node() -> None:
    assert split_cores([0, 1, 2, 3], num_devices=2, cpus_per_device=1) == [(0,), (1,)]
    with pytest.raises(ClusterError, match=r"cpus_per_device = 3: 2 devices x 3 need 6 cores, but a node has 4"):
        split_cores([0, 1, 2, 3], num_devices=2, cpus_per_device=3)


def test_embedded_ray_refuses_several_nodes_before_starting(no_ray: None) -> None:
    with pytest.raises(ClusterError, match="embedded local Ray has one node, but cluster.num_nodes=2"):
        Cluster(ClusterConfig(num_nodes=2))
    assert not ray.is_initialized()


def test_unknown_device_type_is_refused() -> None:
    # Cluster also takes untyped configs (a DictConfig), which the typed ClusterConfig would have refused earlier.
    untyped = SimpleNamespace(**{**vars(ClusterConfig()), "device_type": "tpu"})
    with pytest.raises(ClusterError, match="device_type must be 'cpu' or 'gpu', got 'tpu'"):
        Cluster(untyped)
