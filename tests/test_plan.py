"""`rlplace-plan` as users run it: a subprocess, its table, its JSON, and exit code 2 on bad input.

Bad input is checked in-process through `resolve` (what `rlplace-plan` and `rlplace-train` both call), one
subprocess case shows the CLI turning a refusal into exit code 2 and one line on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from hydra.errors import ConfigCompositionException

from rlplace.cli import compose_run, describe_compose_error
from rlplace.core.errors import ConfigError
from rlplace.families import resolve
from rlplace.placement import PlacementError


def run_plan(*overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlplace.plan", *overrides], capture_output=True, text=True, timeout=60, check=False
    )


def test_json_shows_the_seed_example() -> None:
    result = run_plan("cluster=node8", "placement=hybrid", "plan.format=json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["mode"] == "hybrid" and plan["num_devices"] == 8
    devices = {name: [d for rank in ranks for d in rank["devices"]] for name, ranks in plan["components"].items()}
    assert devices == {"actor": list(range(8)), "env": [0, 1, 2, 3], "rollout": [4, 5, 6, 7]}
    assert plan["components"]["rollout"][0] == {"rank": 0, "node": 0, "devices": [4]}


def test_table_names_components_sharing_and_mode() -> None:
    result = run_plan()
    assert result.returncode == 0, result.stderr
    assert "hybrid mode, 2 devices" in result.stdout
    assert "actor, env" in result.stdout and "actor, rollout" in result.stdout


def test_multinode_devices_are_node_major() -> None:
    result = run_plan("cluster=multinode", "placement=collocated", "plan.format=json")
    ranks = json.loads(result.stdout)["components"]["env"]
    assert ranks[8] == {"rank": 8, "node": 1, "devices": [8]}


def test_bad_input_exits_2_with_one_line() -> None:
    start = time.monotonic()
    result = run_plan("cluster.component_placement.env=0-9")
    assert result.returncode == 2
    assert result.stderr == (
        "rlplace: error: cluster.component_placement.env = '0-9': device 9 is out of range; this cluster has 2 "
        "devices (valid: 0-1)\n"
    )
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (["cluster=single_gpu", "placement=hybrid"], ConfigError, "cluster.component_placement.env"),
        (["placement=disaggregated"], ConfigError, "cluster.component_placement.env"),
        (["~cluster.component_placement.rollout"], PlacementError, r"required component\(s\) rollout not placed"),
        (["+cluster.component_placement.critic_model=0"], PlacementError, "unknown component 'critic_model'"),
        (["plan.format=xml"], ConfigError, "plan.format = 'xml'"),
    ],
)
def test_bad_input_is_refused_naming_key_and_value(
    compose_cfg, overrides: list[str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as info:
        resolve(compose_cfg(*overrides))
    assert "\n" not in str(info.value)  # the CLIs print it as one line


def test_a_component_the_embodied_family_lacks_is_refused(compose_cfg) -> None:
    # `rlplace-plan +cluster.component_placement.critic=0` (embodied): there is no critic worker group to place.
    with pytest.raises(
        PlacementError,
        match=r"cluster\.component_placement\.critic = 0: unknown component 'critic' for this task "
        r"\(valid: env, rollout, actor\)",
    ):
        resolve(compose_cfg("+cluster.component_placement.critic=0"))


@pytest.mark.parametrize(
    ("override", "section"),
    [("algorithm=grpo", "algorithm"), ("rollout=hf", "rollout"), ("model=tiny_lm", "model")],
)
def test_reasoning_options_on_an_embodied_task_are_refused_naming_the_section(
    compose_cfg, override: str, section: str
) -> None:
    with pytest.raises(
        ConfigError, match=rf"^{section}: the chosen option .* belongs to the reasoning family, .*cartpole"
    ):
        resolve(compose_cfg(override))


def test_a_reasoning_placement_on_an_embodied_task_is_refused(compose_cfg) -> None:
    with pytest.raises(ConfigError, match=r"^inference = .*no inference section .*preset of the other task family"):
        resolve(compose_cfg("placement=reasoning_collocated"))


def test_a_value_of_the_wrong_type_is_refused_while_composing(capsys: pytest.CaptureFixture[str]) -> None:
    # Composition errors never reach resolve: compose_run reports them as one line and exits 2.
    with pytest.raises(SystemExit) as info:
        compose_run(["cluster.num_nodes=x"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("rlplace: error: ") and "cluster.num_nodes=x" in err
    assert len(err.strip().splitlines()) == 1


def test_compose_error_description_is_one_line(compose_cfg) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose_cfg("cluster.num_nodes=x")
    description = describe_compose_error(info.value)
    assert "cluster.num_nodes=x" in description and "\n" not in description


def test_a_module_of_the_start_directory_is_importable_by_name(tmp_path, monkeypatch) -> None:
    """`reward.function=my_rewards:graded` run from the folder holding my_rewards.py: a console script, unlike
    `python -m`, does not put that folder on sys.path, so the commands do (and on PYTHONPATH, for the workers)."""
    from rlplace.cli import import_from_start_directory
    from rlplace.reasoning.rewards import reward_function

    (tmp_path / "start_dir_rewards.py").write_text("def graded(prompt, response, answer, extra):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    import_from_start_directory()
    assert reward_function("start_dir_rewards:graded")("1+1=", "2", "2", {}) == {"score": 1.0}
    assert os.environ["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/elsewhere"
    sys.modules.pop("start_dir_rewards")
