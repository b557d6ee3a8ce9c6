"""Every value form of `cluster.component_placement` and every refusal, checked through ComponentPlacement.

ComponentPlacement takes the components of the run's task family; these grammar tests use the embodied family's
(env, rollout, actor), or just the ones a config places where the test is about values, not about which components
a family has.
"""

from __future__ import annotations

import re

import pytest

from rlplace.embodied.config import COMPONENTS
from rlplace.placement import ComponentPlacement, PlacementError


def placed(config: dict) -> tuple[str, ...]:
    """The component names the keys of `config` place (the family's components, for a test about values)."""
    return tuple(name.strip() for key, value in config.items() if value is not None for name in key.split(","))


def _devices_per_process(config: dict, name: str, num_nodes: int = 1, per_node: int = 8) -> list[list[int]]:
    placement = ComponentPlacement(config, num_nodes, per_node, components=placed(config))
    return [list(p.devices) for p in placement.get_placements(name)]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("all", [[d] for d in range(8)]),
        (3, [[3]]),  # a YAML integer
        ("3", [[3]]),
        (0, [[0]]),
        ("0,2,3", [[0], [2], [3]]),
        ("0-3,5,7", [[0], [1], [2], [3], [5], [7]]),
        (" 0 - 1 , 4 ", [[0], [1], [4]]),
        ("5,1", [[1], [5]]),  # ranks follow global device order
        ("0-3:0-7", [[0], [0], [1], [1], [2], [2], [3], [3]]),  # 2 processes per device
        ("0-7:0-1", [[0, 1, 2, 3], [4, 5, 6, 7]]),  # 4 devices per process
        ("2:0-2", [[2], [2], [2]]),
        ("all:0", [list(range(8))]),
        ("0-3:0,1,2,3", [[0], [1], [2], [3]]),
    ],
)
def test_device_value_forms(value: object, expected: list[list[int]]) -> None:
    assert _devices_per_process({"env": value}, "env") == expected


def test_all_spans_every_node_node_major() -> None:
    placement = ComponentPlacement({"actor": "all"}, num_nodes=2, num_devices_per_node=4, components=("actor",))
    assert [(p.node_rank, p.devices, p.local_devices) for p in placement.get_placements("actor")] == [
        (0, (0,), (0,)),
        (0, (1,), (1,)),
        (0, (2,), (2,)),
        (0, (3,), (3,)),
        (1, (4,), (0,)),
        (1, (5,), (1,)),
        (1, (6,), (2,)),
        (1, (7,), (3,)),
    ]


@pytest.mark.parametrize("key", ["actor,rollout", "actor, rollout", " actor ,rollout "])
def test_multi_component_key_shares_one_strategy(key: str) -> None:
    placement = ComponentPlacement({key: "0-3", "env": "4-7"}, 1, 8, components=COMPONENTS)
    assert placement.components == ["actor", "rollout", "env"]
    assert placement.get_strategy("actor") == placement.get_strategy("rollout")
    assert placement.get_placements("actor") == placement.get_placements("rollout")
    assert placement.get_world_size("rollout") == 4


def test_two_processes_per_device_share_local_device() -> None:
    placements = ComponentPlacement({"env": "0-1:0-3"}, 1, 2, components=("env",)).get_placements("env")
    assert [(p.rank, p.local_devices, p.local_rank, p.local_world_size) for p in placements] == [
        (0, (0,), 0, 4),
        (1, (0,), 1, 4),
        (2, (1,), 2, 4),
        (3, (1,), 3, 4),
    ]


@pytest.mark.parametrize(
    ("placement", "num_nodes", "expected"),
    [
        # (node_rank, local_rank, local_world_size) per process
        ("0:0-3", 2, [(0, 0, 4), (0, 1, 4), (0, 2, 4), (0, 3, 4)]),
        ("0-1:0-3", 2, [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]),
        ("all:0-1", 2, [(0, 0, 1), (1, 0, 1)]),
        ("0-1", 2, [(0, 0, 1), (1, 0, 1)]),
        (1, 2, [(1, 0, 1)]),
    ],
)
def test_node_group_form(placement: object, num_nodes: int, expected: list[tuple[int, int, int]]) -> None:
    config = {"env": {"node_group": "node", "placement": placement}, "actor": "all"}
    component = ComponentPlacement(config, num_nodes, 4, components=placed(config))
    placements = component.get_placements("env")
    assert [(p.node_rank, p.local_rank, p.local_world_size) for p in placements] == expected
    assert all(p.devices == () and p.local_devices == () for p in placements)
    assert component.devices_of("env") == []


def _refused(config: dict, num_nodes: int = 2, per_node: int = 4, components: tuple[str, ...] = COMPONENTS) -> str:
    """The message of the PlacementError that `config` raises; it must be a single line."""
    with pytest.raises(PlacementError) as info:
        ComponentPlacement(config, num_nodes, per_node, components=components)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0-9", "device 9 is out of range; this cluster has 8 devices (valid: 0-7)"),
        ("all:0-2", "8 devices and 3 processes: one count must divide the other"),
        (8, "device 8 is out of range"),
        (-1, "device -1 is out of range"),
        ("0,2,2", "device 2 is listed twice"),
        ("0-3,2", "device 2 is listed twice"),
        ("3-1", "range '3-1' is descending; write it as '1-3'"),
        ("0-5:0-3", "6 devices and 4 processes: one count must divide the other (valid process counts: 1, 2, 3, 6"),
        ("0-3:1-8", "process ranks must be contiguous from 0 (got 1-8; valid: 0-7)"),
        ("0-3:0,2", "process ranks must be contiguous from 0 (got 0,2; valid: 0-1)"),
        ("0-3:0,0", "process 0 is listed twice"),
        ("0-3:all", "'all' is not valid for process ranks"),
        ("", "the value is empty"),
        ("  ", "the value is empty"),
        ("a", "'a' is not a device rank or range"),
        ("-1", "'-1' is not a device rank or range"),
        ("1-", "'1-' is not a device rank or range"),
        ("0,,1", "empty item in '0,,1'"),
        ("0:1:2", "more than one ':'"),
        ("0-3:", "both sides of ':' must be non-empty"),
        (1.5, "must be an integer or a string, not float"),
        (True, "must be an integer or a string, not bool"),
        ([0, 1], "must be an integer or a string, not list"),
        ({"node_group": "node", "placement": "0-2"}, "node 2 is out of range; this cluster has 2 nodes (valid: 0-1)"),
        ({"node_group": "node", "placement": "0-1:0-2"}, "3 processes cannot be split evenly across 2 node(s)"),
        ({"node_group": "gpu", "placement": "0"}, "node_group must be 'node'"),
        ({"node_group": "node"}, "placement is missing"),
        ({"node_group": "node", "placement": "0", "extra": 1}, "unknown field(s) extra"),
        ({"node_group": "node", "placement": ""}, "the value is empty"),
    ],
)
def test_bad_value_names_key_value_and_problem(value: object, problem: str) -> None:
    # The cluster is 2 nodes x 4 devices.
    with pytest.raises(PlacementError, match=re.escape(f"cluster.component_placement.env = {value!r}: ")) as info:
        ComponentPlacement({"env": value}, num_nodes=2, num_devices_per_node=4, components=("env",))
    assert problem in str(info.value)
    assert "\n" not in str(info.value)


def test_process_spanning_nodes_is_refused() -> None:
    # 6 devices into 2 processes of 3: process 1 gets devices 3, 4, 5 across nodes 0 and 1.
    message = _refused({"actor": "0-5:0-1"}, num_nodes=2, per_node=4, components=("actor",))
    assert message.startswith("cluster.component_placement.actor = '0-5:0-1': process 1 would span nodes 0, 1")


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        ({"actor": "0-3", "actor,rollout": "4-7"}, "actor,rollout = '4-7': component 'actor' is already placed"),
        ({"actor,actor": "0"}, "key 'actor,actor' names actor more than once"),
        ({"actor,": "0"}, "key 'actor,' has an empty component name"),
        ({"critc": "0"}, "critc = '0': unknown component 'critc' for this task (valid: env, rollout, actor)"),
        ({1: "0"}, "key 1 is not a string"),
    ],
)
def test_bad_keys_are_refused(config: dict, pattern: str) -> None:
    assert pattern in _refused(config)


def test_required_component_left_unplaced() -> None:
    with pytest.raises(PlacementError, match=r"required component\(s\) env not placed \(placed: actor, rollout\)"):
        ComponentPlacement({"actor,rollout": "all"}, 1, 8, components=("actor", "env", "rollout"))


def test_a_component_of_another_family_is_refused() -> None:
    # `reward` is a reasoning component: an embodied run has no such worker group.
    message = _refused({"actor,env,rollout": "all", "reward": "0"}, num_nodes=1, per_node=8)
    assert "reward = '0': unknown component 'reward' for this task (valid: env, rollout, actor)" in message


def test_unplaced_component_lookup_names_placed_ones() -> None:
    placement = ComponentPlacement({"actor": "all"}, 1, 8, components=("actor",))
    with pytest.raises(PlacementError, match=r"component 'critic' is not placed \(placed: actor\)"):
        placement.get_strategy("critic")


@pytest.mark.parametrize(("num_nodes", "per_node"), [(0, 8), (1, -1), (True, 8), (1, "8")])
def test_bad_cluster_shape(num_nodes: object, per_node: object) -> None:
    with pytest.raises(PlacementError, match=r"cluster\.num_"):
        ComponentPlacement({"actor": "all"}, num_nodes, per_node, components=("actor",))  # type: ignore[arg-type]


def test_not_a_mapping() -> None:
    with pytest.raises(PlacementError, match="must be a mapping"):
        ComponentPlacement("actor: all", 1, 8, components=("actor",))  # type: ignore[arg-type]
