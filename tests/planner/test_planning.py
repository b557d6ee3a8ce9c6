"""The planner: cost curves, contention, a profile's refusals, the embodied step model and `rlplace-plan`'s
prediction and search.

A synthetic profile folder stands in for a profiled run (profile.json, metrics.jsonl, timeline.json as a run writes
them), so the arithmetic can be checked by hand; `tests/embodied/test_profile.py` runs a real profiling run.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rlplace.cli import compose_run
from rlplace.embodied import planning
from rlplace.families import resolve
from rlplace.placement import ComponentPlacement
from rlplace.plan import main as plan_main
from rlplace.planner import Curve, ProfileError, busiest, load_profile
from tests.planner.synthetic import ENVS, EPOCHS, MEASURED, MINIBATCHES, STEPS, write_profile
from tests.train_here import train_here


@pytest.fixture
def profile_dir(tmp_path: Path) -> Path:
    return write_profile(tmp_path / "run")


@pytest.fixture
def model(profile_dir: Path) -> planning.StepModel:
    return planning.load_model(profile_dir, "CartPole-v1")


def test_curve_interpolates_and_extends_the_last_slope() -> None:
    curve = Curve((1, 4, 8), (1.0, 4.0, 6.0))
    assert [curve.at(n) for n in (0.5, 1, 2.5, 4, 6, 12)] == [1.0, 1.0, 2.5, 4.0, 5.0, 8.0]


def test_work_on_shared_resources_adds_up() -> None:
    a, b, both = frozenset({"core0"}), frozenset({"core1"}), frozenset({"core0", "core1"})
    assert busiest([(a, 1.0), (b, 2.0)]) == 2.0
    assert busiest([(a, 1.0), (a, 1.5), (b, 2.0)]) == 2.5
    assert busiest([(both, 1.0), (a, 0.5)]) == 1.5
    assert busiest([]) == 0.0


def test_a_missing_or_foreign_profile_is_refused_naming_the_key(tmp_path: Path, profile_dir: Path) -> None:
    with pytest.raises(ProfileError, match=r"plan.profile = .*no profile.json there .*runner.profile=true"):
        load_profile(tmp_path / "nothing", "embodied", "CartPole-v1")
    with pytest.raises(
        ProfileError,
        match=r"plan.profile = .*'CartPole-v1' \(embodied family\), not this embodied run of 'HalfCheetah-v5'",
    ):
        load_profile(profile_dir, "embodied", "HalfCheetah-v5")


def test_the_model_reproduces_the_profiled_run(profile_dir: Path, model: planning.StepModel) -> None:
    own = planning.Layout.of(json.loads((profile_dir / "profile.json").read_text())["placement"], model.cores)
    shape = planning.Shape(ENVS, STEPS, 1, EPOCHS, MINIBATCHES, 0)
    prediction = model.predict(shape, own, {"env": True, "rollout": True, "actor": True})
    assert prediction.step_s == pytest.approx(MEASURED["step"], rel=1e-6)
    assert prediction.phases["generate_rollouts"] == pytest.approx(MEASURED["generate_rollouts"], rel=1e-6)
    assert prediction.phases["training"] == pytest.approx(MEASURED["training"], rel=1e-6)
    assert model.profile.generation_overhead_s == pytest.approx(0.002)
    assert model.hop_s > 0


def layout(where: dict[str, str], devices: int, model: planning.StepModel) -> planning.Layout:
    placement = ComponentPlacement(where, 1, devices, components=("env", "rollout", "actor"))
    return planning.Layout.of(placement, planning.cpu_cores(model, 1, devices))


def test_contention_and_pipelining_move_the_prediction(model: planning.StepModel) -> None:
    offload = {"env": True, "rollout": True, "actor": True}
    apart = layout({"env": "0", "rollout": "1", "actor": "0-1"}, 2, model)
    one_core = layout({"env": "0", "rollout": "0", "actor": "0"}, 2, model)
    one = planning.Shape(ENVS, STEPS, 1, EPOCHS, MINIBATCHES, 0)
    two = planning.Shape(ENVS, STEPS, 2, EPOCHS, MINIBATCHES, 0)
    gen = {
        (name, s.stages): model.predict(s, where, offload).phases["generate_rollouts"]
        for name, where in (("apart", apart), ("one core", one_core))
        for s in (one, two)
    }
    assert gen["apart", 2] < gen["apart", 1]  # two stages overlap env and rollout on their own cores
    assert gen["one core", 2] > gen["apart", 2]  # on one core they cannot
    async_apart = model.predict(
        planning.Shape(ENVS, STEPS, 1, EPOCHS, MINIBATCHES, 1),
        layout({"env": "0", "rollout": "0", "actor": "1"}, 2, model),
        offload,
    )
    sync_apart = model.predict(one, layout({"env": "0", "rollout": "0", "actor": "1"}, 2, model), offload)
    assert async_apart.step_s < sync_apart.step_s and "overlapped" in async_apart.phases


def run_plan(*overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlplace.plan", *overrides], capture_output=True, text=True, timeout=60, check=False
    )


def test_rlplace_plan_predicts_and_searches_a_larger_cluster(profile_dir: Path) -> None:
    result = run_plan(f"plan.profile={profile_dir}", "plan.search=true", "cluster=node8", "plan.format=json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["prediction"]["step_s"] > 0 and set(plan["prediction"]["phases"]) >= {"generate_rollouts", "training"}
    ranked = plan["search"]
    assert len(ranked) == 5 and [r["prediction"]["step_s"] for r in ranked] == sorted(
        r["prediction"]["step_s"] for r in ranked
    )
    assert any("GPU" in a for a in ranked[0]["prediction"]["assumptions"])
    best = ranked[0]["overrides"]
    assert best.startswith("placement=hybrid 'cluster.component_placement={")
    # The override line runs what was ranked: composing it gives that placement.
    overrides = ["cluster=node8", *shlex.split(best)]
    resolved = resolve(compose_run(overrides))
    assert resolved.cfg.rollout.pipeline_stage_num == ranked[0]["stages"]
    assert resolved.placement.mode == ranked[0]["mode"]


def test_rlplace_plan_prints_the_prediction_and_the_ranked_table(profile_dir: Path, capsys) -> None:
    plan_main([f"plan.profile={profile_dir}", "plan.search=true"])
    printed = capsys.readouterr().out
    assert "predicted:" in printed and "fastest placements" in printed and "#1: placement=hybrid" in printed


def test_rlplace_plan_refuses_a_bad_profile_with_exit_2(tmp_path: Path, capsys) -> None:
    result = run_plan(f"plan.profile={tmp_path}")  # the CLI's exit code and its one line
    assert result.returncode == 2 and "plan.profile" in result.stderr and len(result.stderr.splitlines()) == 1
    other = write_profile(tmp_path / "cheetah", env_id="HalfCheetah-v5")
    for overrides, named in (([f"plan.profile={other}"], "HalfCheetah-v5"), (["plan.search=true"], "plan.search")):
        with pytest.raises(SystemExit) as exited:
            plan_main(overrides)
        assert exited.value.code == 2 and named in capsys.readouterr().err


def test_placement_auto_runs_the_fastest_candidate_at_the_runs_own_staleness(profile_dir: Path) -> None:
    plan = resolve(compose_run(["placement=auto", f"plan.profile={profile_dir}", "runner.max_staleness=1"]))
    assert plan.ranking and all(r.max_staleness == 1 for r in plan.ranking)
    times = [r.prediction.step_s for r in plan.ranking]
    assert times == sorted(times) and plan.prediction.step_s == pytest.approx(times[0])
    # What it runs is what its override line runs by hand: the same typed config but for the plan section.
    by_hand = resolve(compose_run([*shlex.split(plan.ranking[0].overrides), f"plan.profile={profile_dir}"]))
    assert replace(plan.cfg, plan=by_hand.cfg.plan) == by_hand.cfg
    assert plan.placement.to_dict() == by_hand.placement.to_dict()


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["placement=auto"], "placement = 'auto' is invalid: placement=auto with plan.profile="),  # rlplace-plan
        (["experiment=arithmetic_grpo", "placement=auto", "plan.profile=/x"], "plan.profile = '/x': no profile.json"),
    ],
    ids=["no profile", "no profile there"],
)
def test_placement_auto_without_a_usable_profile_is_refused(overrides, named, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        plan_main(overrides)
    assert exited.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")
def test_an_auto_placed_run_profiles_first_records_its_choice_and_checks_its_prediction_every_step(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    tiny = ["task.total_num_envs=4", "rollout.num_steps=16", "algorithm.update_epochs=4", "algorithm.num_minibatches=2"]
    # No profile: a short run makes one first. One step after warm-up.
    done = train_here("placement=auto", *tiny, "runner.max_steps=3", "logger=jsonl", f"hydra.run.dir={run_dir}")
    assert "placement=auto without plan.profile: profiling 6 steps of the hybrid placement" in done.stderr
    assert (tmp_path / "run-profile" / "profile.json").is_file()
    assert "rlplace: profiled env, rollout and actor" in (tmp_path / "run-profile" / "train.log").read_text()
    info = json.loads((run_dir / "run.json").read_text())
    assert f"placement=auto runs #1, the fastest predicted: {info['auto']['overrides']}\n" in done.stdout
    assert info["auto"]["overrides"].startswith("placement=")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["plan/predicted_step_s"] == pytest.approx(info["auto"]["predicted_step_s"])
        assert row["plan/error"] == pytest.approx(row["time/step"] / row["plan/predicted_step_s"] - 1)
    assert "plan/error" in json.loads((run_dir / "summary.json").read_text())
