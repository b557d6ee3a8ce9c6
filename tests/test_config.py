"""Composition of every option of every config group, and the typed checks next to each field."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from rlplace.config import ConfigError, TrainConfig, to_typed
from tests.conftest import group_options

# The devices each placement preset needs: hybrid splits the cluster in halves, disaggregated in quarters.
MIN_DEVICES = {
    "collocated": 1,
    "hybrid": 2,
    "disaggregated": 4,
    "reasoning_collocated": 1,
    "reasoning_disaggregated": 4,
}
CLUSTER_DEVICES = {"local": 2, "single_gpu": 1, "node8": 8, "multinode": 16}


def test_every_group_has_options() -> None:
    for group in ("cluster", "placement", "task", "model", "algorithm", "rollout", "logger"):
        assert group_options(group), group
    assert set(group_options("cluster")) == set(CLUSTER_DEVICES)
    assert set(group_options("placement")) == set(MIN_DEVICES)


@pytest.mark.parametrize("cluster", sorted(CLUSTER_DEVICES))
@pytest.mark.parametrize("placement", sorted(MIN_DEVICES))
def test_placement_presets_scale_with_the_cluster(compose_cfg, cluster: str, placement: str) -> None:
    cfg = compose_cfg(f"cluster={cluster}", f"placement={placement}")
    if CLUSTER_DEVICES[cluster] >= MIN_DEVICES[placement]:
        typed = to_typed(cfg)
        assert typed.cluster.num_devices == CLUSTER_DEVICES[cluster]
    else:
        with pytest.raises(ConfigError, match=r"cluster\.component_placement\.\w+: .*device"):
            to_typed(cfg)


def test_seed_example_on_node8(compose_cfg) -> None:
    typed = to_typed(compose_cfg("cluster=node8", "placement=hybrid"))
    assert typed.cluster.component_placement == {"actor": "all", "env": "0-3", "rollout": "4-7"}
    assert typed.actor.enable_offload and typed.env.enable_offload and typed.rollout.enable_offload


# Options with a mandatory value (`???`) compose once it is given.
REQUIRED_VALUES = {"task=jsonl": ["task.train_path=train.jsonl"], "model=hf": ["model.path=/models/qwen"]}


@pytest.mark.parametrize("group", ["task", "model", "algorithm", "rollout", "logger"], ids=lambda g: f"group={g}")
def test_every_option_composes(compose_cfg, group: str) -> None:
    for option in group_options(group):
        choice = f"{group}={option}"
        assert isinstance(to_typed(compose_cfg(choice, *REQUIRED_VALUES.get(choice, []))), TrainConfig)


@pytest.mark.parametrize("choice", sorted(REQUIRED_VALUES))
def test_a_missing_mandatory_value_names_its_key(compose_cfg, choice: str) -> None:
    key = REQUIRED_VALUES[choice][0].split("=")[0]
    with pytest.raises(Exception, match=key.replace(".", r"\.")):
        to_typed(compose_cfg(choice))


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_experiment_composes(compose_cfg, experiment: str) -> None:
    assert isinstance(to_typed(compose_cfg(f"experiment={experiment}")), TrainConfig)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.num_nodes=abc", "cluster.num_nodes"),
        ("cluster.no_such_key=1", "cluster.no_such_key"),
        ("no_such_section=1", "no_such_section"),
        ("placement=no_such_preset", "no_such_preset"),
    ],
)
def test_wrong_type_or_unknown_key_is_refused_while_composing(compose_cfg, override: str, message: str) -> None:
    with pytest.raises(ConfigCompositionException, match=message):
        compose_cfg(override)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.device_type=tpu", r"cluster.device_type = 'tpu' is invalid: valid: cpu, gpu"),
        ("cluster.num_devices_per_node=0", r"cluster.num_devices_per_node = 0"),
        ("algorithm.update_epochs=0", r"algorithm.update_epochs = 0"),
        ("algorithm.adv_estimator=vtrace", r"valid: gae, group_norm"),
        ("rollout.pipeline_stage_num=0", r"rollout.pipeline_stage_num = 0"),
        ("logger.wandb.mode=sometimes", r"logger.wandb.mode = 'sometimes'"),
        ("plan.format=xml", r"plan.format = 'xml'"),
    ],
)
def test_meaningless_values_are_refused_with_key_and_value(compose_cfg, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        to_typed(compose_cfg("placement=collocated", override))
