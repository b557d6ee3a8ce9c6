"""Registry: names in, one-line refusals out, each name taken once."""

from __future__ import annotations

import pytest

from rlplace.core.errors import ConfigError
from rlplace.core.registry import Registry, load


def test_entries_by_name_and_the_refusal_names_key_value_and_valid_names() -> None:
    shapes: Registry[int] = Registry("model.shape")
    shapes.register("small", 1)

    @shapes.register("large")
    def large() -> int:
        return 2

    assert shapes["small"] == 1 and shapes["large"] is large and shapes.names() == ("small", "large")
    assert "small" in shapes and list(shapes) == ["small", "large"]
    with pytest.raises(ConfigError, match=r"^model.shape = 'medium' is invalid: valid: small, large$"):
        shapes.check("medium")


def test_a_name_is_taken_once() -> None:
    shapes: Registry[int] = Registry("model.shape")
    shapes.register("small", 1)
    shapes.register("small", 1)  # the same entry again (a module imported twice): no change
    with pytest.raises(ValueError, match="'small' is registered already"):
        shapes.register("small", 2)


def test_load_imports_an_entry_by_path_and_refuses_a_bad_one_in_one_line() -> None:
    assert load("rlplace.core.registry:Registry") is Registry
    for path in ("rlplace.core.registry:Nothing", "no_such_module:f", "rlplace.core.registry"):
        with pytest.raises(ConfigError, match=rf"^algorithm.estimator = '{path}' cannot be imported \(") as refused:
            load(path, "algorithm.estimator")
        assert "\n" not in str(refused.value)


def test_the_config_names_come_from_the_registries() -> None:
    from rlplace.embodied.algorithms import ADVANTAGE_ESTIMATORS
    from rlplace.embodied.config import PPOConfig
    from rlplace.reasoning.algorithms import ALGORITHMS
    from rlplace.reasoning.config import ReasoningAlgorithmConfig

    ADVANTAGE_ESTIMATORS.register("test_only", ADVANTAGE_ESTIMATORS["gae"])
    try:
        assert PPOConfig(adv_estimator="test_only").adv_estimator == "test_only"
    finally:
        ADVANTAGE_ESTIMATORS._entries.pop("test_only")
    valid = "grpo, ppo, reinforce_pp, rloo, reinforce"
    with pytest.raises(ConfigError, match=rf"^algorithm.name = 'dpo' is invalid: valid: {valid}$"):
        ReasoningAlgorithmConfig(name="dpo")
    assert ALGORITHMS["ppo"].critic and ReasoningAlgorithmConfig(name="ppo").has_critic
    with pytest.raises(ConfigError, match="algorithm.group_size = 1 is invalid: at least 2: grpo compares"):
        ReasoningAlgorithmConfig(name="grpo", group_size=1)
