"""Composition of every option of every config group, and the typed checks next to each field.

A run's family (embodied or reasoning) is the one its task option starts from; every option composes together with
the other options of its family, and `to_typed` builds that family's dataclass.
"""

from __future__ import annotations

import re

import pytest
from hydra.errors import ConfigCompositionException

from rlplace.core.config import to_typed
from rlplace.core.errors import ConfigError
from rlplace.embodied.config import EmbodiedConfig
from rlplace.families import FAMILIES, family_of, resolve
from rlplace.placement import HybridComponentPlacement
from rlplace.reasoning.config import ReasoningConfig
from tests.conftest import group_options

# The devices each placement preset needs: hybrid splits the cluster in halves, disaggregated in quarters.
MIN_DEVICES = {
    "collocated": 1,
    "hybrid": 2,
    "disaggregated": 4,
    "reasoning_collocated": 1,
    "reasoning_disaggregated": 4,
    "reasoning_hybrid": 2,
}
CLUSTER_DEVICES = {"local": 2, "local4": 4, "single_gpu": 1, "node8": 8, "multinode": 16}
# The options a run of each family composes with, besides the one under test (conf/train.yaml's are embodied).
FAMILY_OPTIONS = {
    "embodied": {"task": "cartpole", "model": "mlp_policy", "algorithm": "ppo", "rollout": "policy"},
    "reasoning": {"task": "arithmetic", "model": "tiny_lm", "algorithm": "grpo", "rollout": "hf"},
}
FAMILY_SCHEMA = {"embodied": EmbodiedConfig, "reasoning": ReasoningConfig}


def family_overrides(family: str, **chosen: str) -> list[str]:
    """Overrides selecting `family`'s options, with `chosen` ones (group -> option) in place of its defaults."""
    return [f"{group}={chosen.get(group, option)}" for group, option in FAMILY_OPTIONS[family].items()]


def typed(cfg):
    """The family's typed config, with every section's own checks (resolve adds the placement's and family's)."""
    family = family_of(cfg)
    return to_typed(cfg, family.schema, family.name)


def test_every_group_has_options() -> None:
    for group in ("cluster", "placement", "task", "model", "algorithm", "rollout", "logger"):
        assert group_options(group), group
    assert set(group_options("cluster")) == set(CLUSTER_DEVICES)
    # placement=auto has no devices of its own: the planner places the run (tests/planner/test_planning.py).
    assert set(group_options("placement")) == set(MIN_DEVICES) | {"auto"}
    assert {f.name for f in FAMILIES} == set(FAMILY_OPTIONS)
    for group in ("task", "model", "algorithm", "rollout"):  # every option belongs to exactly one family
        by_family = [family.options(group) for family in FAMILIES]
        assert sorted(o for options in by_family for o in options) == group_options(group), group


@pytest.mark.parametrize("cluster", sorted(CLUSTER_DEVICES))
@pytest.mark.parametrize("placement", sorted(MIN_DEVICES))
def test_placement_presets_scale_with_the_cluster(compose_cfg, cluster: str, placement: str) -> None:
    family = "reasoning" if placement.startswith("reasoning_") else "embodied"
    cfg = compose_cfg(f"cluster={cluster}", f"placement={placement}", *family_overrides(family))
    if CLUSTER_DEVICES[cluster] >= MIN_DEVICES[placement]:
        config = typed(cfg)
        assert isinstance(config, FAMILY_SCHEMA[family])
        assert config.cluster.num_devices == CLUSTER_DEVICES[cluster]
        # The preset places exactly the family's components.
        assert sorted(HybridComponentPlacement(config).components) == sorted(config.components)
    else:
        with pytest.raises(ConfigError, match=r"cluster\.component_placement\.[\w,]+: .*device"):
            typed(cfg)


def test_seed_example_on_node8(compose_cfg) -> None:
    config = resolve(compose_cfg("cluster=node8", "placement=hybrid")).cfg
    assert config.cluster.component_placement == {"actor": "all", "env": "0-3", "rollout": "4-7"}
    assert config.actor.enable_offload and config.env.enable_offload


# conf/train.yaml lists `placement` after the family's option groups, so a preset's `rollout.enable_offload: true`
# is not overwritten by the rollout option's schema default.
@pytest.mark.parametrize("overrides", [["placement=hybrid"], ["placement=collocated"], ["experiment=arithmetic_grpo"]])
def test_placement_presets_offload_the_rollout(compose_cfg, overrides: list[str]) -> None:
    assert resolve(compose_cfg(*overrides)).cfg.rollout.enable_offload


def test_the_reasoning_collocated_preset_offloads_the_inference_group_too(compose_cfg) -> None:
    cfg = resolve(compose_cfg("experiment=arithmetic_grpo", "placement=reasoning_collocated")).cfg
    assert cfg.offloadable == {"actor": True, "rollout": True, "inference": True, "reward": False}
    kept = resolve(compose_cfg("experiment=arithmetic_grpo", "inference.enable_offload=false")).cfg
    assert not kept.offloadable["inference"]
    with pytest.raises(ConfigError, match=r"^inference = .*this embodied run has no inference section"):
        resolve(compose_cfg("placement=collocated", "+inference.enable_offload=true"))


# Options with a mandatory value (`???`) compose once it is given.
REQUIRED_VALUES = {"task=dataset": ["task.train_path=train.jsonl"], "model=hf": ["model.path=/models/qwen"]}


@pytest.mark.parametrize("group", ["task", "model", "algorithm", "rollout", "logger"], ids=lambda g: f"group={g}")
def test_every_option_composes(compose_cfg, group: str) -> None:
    for option in group_options(group):
        choice = f"{group}={option}"
        family = next((f.name for f in FAMILIES if option in f.options(group)), "embodied")  # logger: both
        overrides = family_overrides(family, **{group: option})
        placement = "placement=reasoning_collocated" if family == "reasoning" else "placement=collocated"
        config = typed(compose_cfg(*overrides, placement, *REQUIRED_VALUES.get(choice, [])))
        assert isinstance(config, FAMILY_SCHEMA[family]), choice


@pytest.mark.parametrize("choice", sorted(REQUIRED_VALUES))
def test_a_missing_mandatory_value_names_its_key(compose_cfg, choice: str) -> None:
    group, option = choice.split("=")
    key = REQUIRED_VALUES[choice][0].split("=")[0]
    cfg = compose_cfg(*family_overrides("reasoning", **{group: option}), "placement=reasoning_collocated")
    # `???` under a field with a default leaves the default (None), which the field's own check refuses.
    with pytest.raises(ConfigError, match=f"^{re.escape(key)} = None is invalid"):
        resolve(cfg)


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_experiment_composes(compose_cfg, experiment: str) -> None:
    plan = resolve(compose_cfg(f"experiment={experiment}"))
    assert isinstance(plan.cfg, plan.family.schema)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.num_nodes=abc", "cluster.num_nodes"),
        ("cluster.no_such_key=1", "cluster.no_such_key"),
        ("no_such_section=1", "no_such_section"),
        ("placement=no_such_preset", "no_such_preset"),
        ("task.no_such_key=1", "task.no_such_key"),  # the option's schema types its section
        ("algorithm.lr=fast", "algorithm.lr"),
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
        ("runner.max_steps=0", r"runner.max_steps = 0 is invalid: at least 1"),
        ("runner.save_interval=-1", r"runner.save_interval = -1 is invalid"),
        ("runner.keep_checkpoints=0", r"runner.keep_checkpoints = 0 is invalid: at least 1, or null"),
        ("runner.eval_interval=0", r"runner.eval_interval = 0 is invalid: at least 1"),
        ("runner.max_staleness=-1", r"runner.max_staleness = -1 is invalid: 0 \(synchronous\) or more"),
    ],
)
def test_meaningless_values_are_refused_with_key_and_value(compose_cfg, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(compose_cfg("placement=collocated", override))


def test_a_preset_section_of_the_other_family_is_refused(compose_cfg) -> None:
    # An embodied placement preset sets `env`, which a reasoning run does not have.
    cfg = compose_cfg(*family_overrides("reasoning"), "placement=collocated")
    with pytest.raises(ConfigError, match=r"^env = .*: this reasoning run has no env section"):
        resolve(cfg)


def test_an_embodied_option_on_a_reasoning_task_is_refused_naming_the_section(compose_cfg) -> None:
    cfg = compose_cfg(*family_overrides("reasoning", rollout="policy"), "placement=reasoning_collocated")
    with pytest.raises(
        ConfigError, match=r"^rollout: .* belongs to the embodied family, .*valid: rollout=hf, rollout=vllm"
    ):
        resolve(cfg)
