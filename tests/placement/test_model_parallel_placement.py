"""ModelParallelComponentPlacement: tensor-parallel grouping of rollout and actor devices, and its refusals."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig, OmegaConf

from rlplace.placement import ModelParallelComponentPlacement, PackedPlacementStrategy, PlacementError


def _cfg(
    placement: dict, rollout_tp: int | None = 1, actor_tp: int | None = 1, num_nodes: int = 1, per_node: int = 8
) -> DictConfig:
    return OmegaConf.create(
        {
            "cluster": {"num_nodes": num_nodes, "num_devices_per_node": per_node, "component_placement": placement},
            "rollout": {} if rollout_tp is None else {"tensor_parallel_size": rollout_tp},
            "actor": {} if actor_tp is None else {"tensor_parallel_size": actor_tp},
        }
    )


def _devices(placement: ModelParallelComponentPlacement, name: str) -> list[tuple[int, ...]]:
    return [p.devices for p in placement.get_placements(name)]


@pytest.mark.parametrize(
    ("config", "rollout_tp", "actor_tp", "rollout", "actor"),
    [
        ({"rollout": "0-7", "actor": "0-7"}, 2, 4, [(0, 1), (2, 3), (4, 5), (6, 7)], [(0, 1, 2, 3), (4, 5, 6, 7)]),
        ({"actor,rollout": "all"}, 2, 2, [(0, 1), (2, 3), (4, 5), (6, 7)], [(0, 1), (2, 3), (4, 5), (6, 7)]),
        ({"actor,rollout": "all"}, 1, 8, [(d,) for d in range(8)], [tuple(range(8))]),
        ({"rollout": "0-5", "actor": "6-7"}, 3, 2, [(0, 1, 2), (3, 4, 5)], [(6, 7)]),  # disaggregated: any TP
        ({"rollout": "0-3:0-1", "actor": "4-7"}, 2, 1, [(0, 1), (2, 3)], [(4,), (5,), (6,), (7,)]),
        ({"rollout": "0,2,4,6", "actor": "1,3,5,7"}, 2, 1, [(0, 2), (4, 6)], [(1,), (3,), (5,), (7,)]),
        ({"rollout": "0-7", "actor": "0-7"}, None, None, [(d,) for d in range(8)], [(d,) for d in range(8)]),
    ],
)
def test_tensor_parallel_grouping(
    config: dict, rollout_tp: int | None, actor_tp: int | None, rollout: list, actor: list
) -> None:
    placement = ModelParallelComponentPlacement(_cfg(config, rollout_tp, actor_tp))
    assert placement.rollout_tp_size == (rollout_tp or 1)
    assert placement.actor_tp_size == (actor_tp or 1)
    assert _devices(placement, "rollout") == rollout
    assert _devices(placement, "actor") == actor


def test_other_components_keep_one_process_per_device() -> None:
    placement = ModelParallelComponentPlacement(_cfg({"actor,rollout": "0-3", "reward": "4-5"}, 2, 2))
    assert placement.get_strategy("rollout") == PackedPlacementStrategy(0, 3, num_devices_per_process=2)
    assert placement.get_world_size("reward") == 2
    assert placement.mode == "hybrid"


def test_tp_groups_on_two_nodes() -> None:
    placement = ModelParallelComponentPlacement(_cfg({"actor,rollout": "all"}, 2, 4, num_nodes=2, per_node=4))
    assert [(p.node_rank, p.local_devices, p.local_rank) for p in placement.get_placements("rollout")] == [
        (0, (0, 1), 0),
        (0, (2, 3), 1),
        (1, (0, 1), 0),
        (1, (2, 3), 1),
    ]


@pytest.mark.parametrize(
    ("config", "rollout_tp", "actor_tp", "shape", "pattern"),
    [
        (
            {"rollout": "0-5", "actor": "6-7"},
            4,
            1,
            (1, 8),
            r"rollout = '0-5': rollout\.tensor_parallel_size = 4 does not divide its 6 device\(s\) "
            r"\(valid tensor_parallel_size: 1, 2, 3, 6\)",
        ),
        (
            {"actor,rollout": "all"},
            4,
            2,
            (1, 8),
            r"actor,rollout = 'all': rollout is collocated with actor on devices 0-7, so rollout\.tensor_parallel_size "
            r"\(4\) must divide actor\.tensor_parallel_size \(2\) \(valid: 1, 2\)",
        ),
        (
            {"rollout": "0-5", "actor": "6-7"},
            3,
            2,
            (2, 4),
            r"rollout = '0-5': process 1 would span nodes 0, 1",
        ),
        (
            {"actor": "all", "rollout": "0-3:0-7"},
            2,
            1,
            (1, 8),
            r"rollout = '0-3:0-7': each rollout process must own exactly rollout\.tensor_parallel_size = 2 device",
        ),
        (
            {"actor": "all", "rollout": {"node_group": "node", "placement": "0"}},
            1,
            1,
            (1, 8),
            r"rollout needs devices",
        ),
        ({"actor": "all"}, 1, 1, (1, 8), r"required component\(s\) rollout not placed \(placed: actor\)"),
        ({"actor,rollout": "all"}, 0, 1, (1, 8), r"cfg\.rollout\.tensor_parallel_size = 0: must be an integer >= 1"),
    ],
)
def test_model_parallel_refusals(
    config: dict, rollout_tp: int, actor_tp: int, shape: tuple[int, int], pattern: str
) -> None:
    with pytest.raises(PlacementError, match=pattern):
        ModelParallelComponentPlacement(_cfg(config, rollout_tp, actor_tp, *shape))
