"""ComponentPlacement as the runner and CLI see it: mode detection, queries, the JSON shape, config-driven builds.

A placement knows its task family's components (`components=`); a config-driven placement reads them from the config
(`cfg.components`, a class attribute of EmbodiedConfig and ReasoningConfig).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from rlplace.core.config import ClusterConfig
from rlplace.embodied.config import COMPONENTS, EmbodiedConfig
from rlplace.placement import (
    ComponentPlacement,
    FlexiblePlacementStrategy,
    HybridComponentPlacement,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementError,
)
from rlplace.reasoning.config import ReasoningConfig


def placed(config: dict) -> tuple[str, ...]:
    """The component names the keys of `config` place (the components, for a test about modes)."""
    return tuple(name.strip() for key in config for name in key.split(","))


@pytest.mark.parametrize(
    ("config", "num_nodes", "per_node", "mode"),
    [
        ({"actor,rollout,env": "all"}, 1, 8, "collocated"),
        ({"actor": "all", "rollout": "0-7", "env": "0-7:0-15"}, 1, 8, "collocated"),
        ({"actor": "0-3", "rollout": "4-5", "env": "6-7"}, 1, 8, "disaggregated"),
        ({"actor": "0-3", "rollout": "4-7"}, 2, 4, "disaggregated"),
        ({"actor": "0-7", "env": "0-3", "rollout": "4-7"}, 1, 8, "hybrid"),  # the RLinf seed example
        ({"actor,rollout": "0-3", "env": "4-7"}, 1, 8, "hybrid"),
        ({"actor": "0-3", "rollout": "2-5"}, 1, 8, "hybrid"),
        ({"actor": "all", "rollout": "all", "env": {"node_group": "node", "placement": "0:0-3"}}, 1, 8, "collocated"),
        ({"actor": "0-3", "rollout": "4-7", "env": {"node_group": "node", "placement": 0}}, 1, 8, "disaggregated"),
        ({"actor": "all"}, 1, 8, "collocated"),
    ],
)
def test_mode(config: dict, num_nodes: int, per_node: int, mode: str) -> None:
    assert ComponentPlacement(config, num_nodes, per_node, components=placed(config)).mode == mode


@pytest.fixture
def seed_placement() -> ComponentPlacement:
    return ComponentPlacement({"actor": "0-7", "env": "0-3", "rollout": "4-7"}, 1, 8, components=COMPONENTS)


def test_queries(seed_placement: ComponentPlacement) -> None:
    assert seed_placement.num_devices == 8
    assert seed_placement.components == ["actor", "env", "rollout"]
    assert "env" in seed_placement and "critic" not in seed_placement
    assert seed_placement.get_world_size("actor") == 8
    assert seed_placement.devices_of("rollout") == [4, 5, 6, 7]
    assert seed_placement.device_sharing() == {
        **{d: ["actor", "env"] for d in range(4)},
        **{d: ["actor", "rollout"] for d in range(4, 8)},
    }
    assert seed_placement.get_strategy("env") == PackedPlacementStrategy(0, 3)


def test_device_sharing_lists_idle_devices() -> None:
    sharing = ComponentPlacement({"actor": "0,2"}, 1, 4, components=("actor",)).device_sharing()
    assert sharing == {0: ["actor"], 1: [], 2: ["actor"], 3: []}


@pytest.mark.parametrize(
    ("value", "strategy"),
    [
        ("0-3", PackedPlacementStrategy(0, 3)),
        ("0-7:0-1", PackedPlacementStrategy(0, 7, num_devices_per_process=4)),
        ("0,2", FlexiblePlacementStrategy([[0], [2]])),
        ("0-1:0-3", FlexiblePlacementStrategy([[0], [0], [1], [1]])),
        ({"node_group": "node", "placement": "0:0-2"}, NodePlacementStrategy([0, 0, 0])),
    ],
)
def test_strategy_kind_follows_value(value: object, strategy: object) -> None:
    assert ComponentPlacement({"env": value}, 1, 8, components=("env",)).get_strategy("env") == strategy


def test_to_dict_shape(seed_placement: ComponentPlacement) -> None:
    config = {"actor": "0-7:0-1", "env": {"node_group": "node", "placement": "1"}}
    summary = ComponentPlacement(config, 2, 4, components=("actor", "env")).to_dict()
    assert summary == {
        "mode": "collocated",
        "num_devices": 8,
        "components": {
            "actor": [{"rank": 0, "node": 0, "devices": [0, 1, 2, 3]}, {"rank": 1, "node": 1, "devices": [4, 5, 6, 7]}],
            "env": [{"rank": 0, "node": 1, "devices": []}],
        },
    }
    assert json.loads(json.dumps(seed_placement.to_dict()))["mode"] == "hybrid"


CONFIG_YAML = """
components: [env, rollout, actor]
cluster:
  num_nodes: 1
  num_devices_per_node: 8
  component_placement:
    actor: 0-7
    env: 0-3
    rollout: 4-7
"""


def test_hybrid_from_dictconfig_with_yaml_ints() -> None:
    cfg = OmegaConf.create(CONFIG_YAML)
    cfg.cluster.component_placement.rollout = 5  # a YAML int
    placement = HybridComponentPlacement(cfg)
    assert placement.mode == "hybrid"
    assert placement.devices_of("rollout") == [5]


def test_hybrid_from_dictconfig_with_node_group() -> None:
    cfg = OmegaConf.create(CONFIG_YAML)
    cfg.cluster.component_placement.env = {"node_group": "node", "placement": "0:0-3"}
    placement = HybridComponentPlacement(cfg)
    assert placement.get_world_size("env") == 4
    assert placement.devices_of("env") == []
    assert placement.mode == "hybrid"  # actor 0-7 still overlaps rollout 4-7


def test_hybrid_requires_env_rollout_actor() -> None:
    cfg = OmegaConf.create(CONFIG_YAML)
    del cfg.cluster.component_placement["env"]
    with pytest.raises(PlacementError, match=r"required component\(s\) env not placed"):
        HybridComponentPlacement(cfg)


def test_live_cluster_overrides_config_shape() -> None:
    cfg = OmegaConf.create(CONFIG_YAML)
    cfg.cluster.component_placement = {"actor,env,rollout": "all"}
    placement = HybridComponentPlacement(cfg, SimpleNamespace(num_nodes=2, num_devices_per_node=2))
    assert placement.num_devices == 4
    assert [p.node_rank for p in placement.get_placements("actor")] == [0, 0, 1, 1]


@dataclass
class _ClusterConfig:
    component_placement: dict = field(default_factory=lambda: {"actor,rollout": "0-1", "env": "2-3"})
    num_nodes: int = 1
    num_devices_per_node: int = 4


@dataclass
class _Config:
    # A field rather than a class attribute (as in EmbodiedConfig), so that the structured DictConfig has it too.
    components: list[str] = field(default_factory=lambda: list(COMPONENTS))
    cluster: _ClusterConfig = field(default_factory=_ClusterConfig)


@pytest.mark.parametrize("cfg", [_Config(), OmegaConf.structured(_Config)])
def test_hybrid_from_dataclass_config(cfg: object) -> None:
    assert HybridComponentPlacement(cfg).mode == "hybrid"


def test_missing_cluster_shape_is_refused() -> None:
    cfg = OmegaConf.create({"cluster": {"component_placement": {"actor": "all"}, "num_nodes": 1}})
    with pytest.raises(PlacementError, match=r"cfg\.cluster\.num_devices_per_node is missing"):
        HybridComponentPlacement(cfg)


def test_placement_layer_never_imports_ray_or_hydra() -> None:
    code = "import sys, rlplace.placement; print(sorted(m for m in ('ray', 'hydra') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_null_value_removes_a_preset_key() -> None:
    placement = ComponentPlacement(
        {"actor,env,rollout": None, "actor,rollout": 0, "env": 1}, 1, 2, components=COMPONENTS
    )
    assert placement.components == ["actor", "rollout", "env"]
    assert placement.mode == "hybrid"  # actor and rollout share device 0


def test_hybrid_places_the_components_of_the_configs_family() -> None:
    embodied = EmbodiedConfig(cluster=ClusterConfig(component_placement={"actor": "all", "env": "0", "rollout": "1"}))
    assert HybridComponentPlacement(embodied).components == ["actor", "env", "rollout"]
    # The same mapping is no reasoning run: env is not one of its components, and reward and inference are unplaced.
    reasoning = ReasoningConfig(cluster=embodied.cluster)
    with pytest.raises(
        PlacementError, match=r"unknown component 'env' for this task \(valid: rollout, reward, inference"
    ):
        HybridComponentPlacement(reasoning)
    reasoning.cluster.component_placement = {"actor,rollout": "all"}
    with pytest.raises(PlacementError, match=r"required component\(s\) reward, inference not placed"):
        HybridComponentPlacement(reasoning)


def test_config_without_components_is_refused() -> None:
    cfg = OmegaConf.create(CONFIG_YAML)
    del cfg["components"]
    with pytest.raises(PlacementError, match=r"cfg\.components is missing"):
        HybridComponentPlacement(cfg)
