"""Strategies turn a cluster shape into Placement records: packing, node splits, and their refusals."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlplace.placement import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Placement,
    PlacementError,
    PlacementStrategy,
)


def _devices(strategy: PlacementStrategy, num_nodes: int = 1, per_node: int = 8) -> list[tuple[int, ...]]:
    return [p.devices for p in strategy.get_placements(num_nodes, per_node)]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (PackedPlacementStrategy(0, 3), [(0,), (1,), (2,), (3,)]),
        (PackedPlacementStrategy(2, 5, num_devices_per_process=2), [(2, 3), (4, 5)]),
        (FlexiblePlacementStrategy([[0, 1], [5]]), [(0, 1), (5,)]),
        (FlexiblePlacementStrategy([[0], [0], [1], [1]]), [(0,), (0,), (1,), (1,)]),
    ],
)
def test_device_strategies(strategy: PlacementStrategy, expected: list[tuple[int, ...]]) -> None:
    assert _devices(strategy) == expected
    assert strategy.num_processes == len(expected)


def test_packed_splits_across_two_nodes() -> None:
    placements = PackedPlacementStrategy(2, 7).get_placements(num_nodes=2, num_devices_per_node=4)
    assert placements[0] == Placement(
        rank=0, world_size=6, node_rank=0, devices=(2,), local_devices=(2,), local_rank=0, local_world_size=2
    )
    assert [(p.node_rank, p.local_devices, p.local_rank, p.local_world_size) for p in placements] == [
        (0, (2,), 0, 2),
        (0, (3,), 1, 2),
        (1, (0,), 0, 4),
        (1, (1,), 1, 4),
        (1, (2,), 2, 4),
        (1, (3,), 3, 4),
    ]


def test_packed_multi_device_processes_on_two_nodes() -> None:
    placements = PackedPlacementStrategy(0, 7, num_devices_per_process=4).get_placements(2, 4)
    assert [(p.node_rank, p.devices, p.local_devices) for p in placements] == [
        (0, (0, 1, 2, 3), (0, 1, 2, 3)),
        (1, (4, 5, 6, 7), (0, 1, 2, 3)),
    ]


@pytest.mark.parametrize(
    "strategy",
    [
        PackedPlacementStrategy(1, 6, num_devices_per_process=2),  # (1, 2) (3, 4): process 1 spans
        PackedPlacementStrategy(0, 7, num_devices_per_process=8),
        FlexiblePlacementStrategy([[3, 4]]),
    ],
)
def test_process_spanning_nodes_is_refused(strategy: PlacementStrategy) -> None:
    with pytest.raises(PlacementError, match=r"would span nodes 0, 1 .*node 0 holds 0-3; node 1 holds 4-7"):
        strategy.get_placements(num_nodes=2, num_devices_per_node=4)


@pytest.mark.parametrize(
    ("strategy", "pattern"),
    [
        (PackedPlacementStrategy(4, 8), r"device 8 of process 4 is out of range; this cluster has 8 devices"),
        (FlexiblePlacementStrategy([[0], [9]]), r"device 9 of process 1 is out of range"),
        (
            NodePlacementStrategy([0, 2]),
            r"node 2 of process 1 is out of range; this cluster has 2 nodes \(valid: 0-1\)",
        ),
    ],
)
def test_out_of_cluster_is_refused(strategy: PlacementStrategy, pattern: str) -> None:
    with pytest.raises(PlacementError, match=pattern):
        strategy.get_placements(num_nodes=2, num_devices_per_node=4)


@pytest.mark.parametrize(
    ("build", "pattern"),
    [
        (lambda: PackedPlacementStrategy(3, 1), "end 1 is before start 3"),
        (lambda: PackedPlacementStrategy(0, 5, num_devices_per_process=4), "6 devices .* not divisible"),
        (lambda: PackedPlacementStrategy(0, 3, num_devices_per_process=0), "num_devices_per_process = 0 must be"),
        (lambda: PackedPlacementStrategy(-1, 3), "start = -1"),
        (lambda: FlexiblePlacementStrategy([]), "at least one process"),
        (lambda: FlexiblePlacementStrategy([[0], []]), "process 1 has no devices"),
        (lambda: FlexiblePlacementStrategy([[0, 0]]), "lists a device twice"),
        (lambda: FlexiblePlacementStrategy([[-1]]), "must be integers >= 0"),
        (lambda: NodePlacementStrategy([]), "at least one process"),
        (lambda: NodePlacementStrategy([-1]), "must be integers >= 0"),
    ],
)
def test_bad_strategy_arguments(build: Callable[[], PlacementStrategy], pattern: str) -> None:
    with pytest.raises(PlacementError, match=pattern):
        build()


def test_node_strategy_counts_ranks_per_node() -> None:
    placements = NodePlacementStrategy([0, 0, 1, 0]).get_placements(num_nodes=2, num_devices_per_node=4)
    assert [(p.rank, p.world_size, p.node_rank, p.local_rank, p.local_world_size) for p in placements] == [
        (0, 4, 0, 0, 3),
        (1, 4, 0, 1, 3),
        (2, 4, 1, 0, 1),
        (3, 4, 0, 2, 3),
    ]
    assert all(p.devices == () == p.local_devices for p in placements)


def test_bad_cluster_shape_is_refused() -> None:
    with pytest.raises(PlacementError, match="num_nodes = 0"):
        PackedPlacementStrategy(0, 1).get_placements(0, 8)
