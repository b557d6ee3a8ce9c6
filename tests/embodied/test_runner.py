"""The embodied loop end to end on a real (embedded, local) Ray, as `rlplace-train` runs it.

Each run is 2 tiny steps (4 CartPole envs x 16 steps, one actor process) so that the checks are about
behaviour, not speed: the math gives pinned numbers, placement does not change results, pipelining overlaps env and
rollout, checkpoints resume exactly, bad input is refused early. Runs go through `rlplace.train.train` in this
process (what `rlplace-train` calls after resolving), sharing one embedded Ray that each run joins; one subprocess
case checks the CLI's refusal. The runs are module fixtures, each shared by the tests that read it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from rlplace.cli import compose_run
from rlplace.core.errors import ConfigError
from rlplace.core.schedule import AsyncSchedule
from rlplace.embodied.launch import check_checkpoint
from rlplace.embodied.profile import PROFILE_FILE
from rlplace.families import resolve
from rlplace.metrics import Timeline
from rlplace.placement import PlacementError
from rlplace.replace import OWN_PROFILES, switches
from rlplace.train import RUN_INFO, train
from tests import TEST_PRESETS
from tests.planner.synthetic import write_profile

ROOT = Path(__file__).resolve().parents[2]

TINY = [
    "task.total_num_envs=4",
    "rollout.num_steps=16",
    "rollout.pipeline_stage_num=2",
    "algorithm.num_minibatches=2",
    "algorithm.update_epochs=4",
    "algorithm.lr=0.01",  # large enough for the ratio to leave the clip range: the pinned clip_frac is not 0
    "runner.max_steps=2",
    "logger=jsonl",
]
# The same processes in both modes (1 actor, 2 env and 2 rollout processes, each on one logical device: one core),
# so the numbers must match exactly; only which device each process shares changes. Hybrid: actor and env on device
# 0, the rollout on device 1, so env and rollout overlap. Collocated: all on device 0 (the hybrid preset's keys, with
# other values; the mode is derived from the devices). Two processes each for env and rollout keep enough going on
# that env steps overlap inference although a channel hand-off costs more than a CartPole step or an MLP forward
# (with one rollout process the overlap is a tenth as long).
HYBRID = [
    "placement=hybrid",
    "cluster.component_placement.actor=0",
    "cluster.component_placement.env=0:0-1",
    "cluster.component_placement.rollout=1:0-1",
]
COLLOCATED = [*HYBRID[:3], "cluster.component_placement.rollout=0:0-1"]
COMPARED = (
    "env/episode_return",
    "env/return_last20",
    "train/policy_loss",
    "train/value_loss",
    "train/entropy",
    "train/kl",
    "train/clip_frac",
    "train/grad_norm",
)

# The numbers a tiny run must produce, step by step. They were computed once with the single-process reference,
# which implements the same math in one loop (CartPole seed 1, 4 envs x 16 steps, gamma 0.98 and lambda 0.8 from
# conf/algorithm/ppo.yaml, lr 0.01 annealed over the 2 steps, 4 epochs x 2 minibatches, clip 0.2, vf 0.5, ent 0, max
# grad norm 0.5, 64x64 tanh), and pasted here:
#   python benchmarks/ppo_reference.py train --task CartPole-v1 --seeds 1 --num-envs 4 --num-steps 16 --lr 0.01 \
#       --anneal-steps 2 --update-epochs 4 --num-minibatches 2 --ent-coef 0 --vf-coef 0.5 --clip-coef 0.2 \
#       --max-grad-norm 0.5 --gamma 0.98 --gae-lambda 0.8 --max-steps 2 --stats
# (--stats prints each step's train/* and env/* as the runner names them.) With one actor rank the distributed run
# computes the same math; only the order of float sums may differ (threads, batch splits, and the CPU's vector
# code paths: AVX2 or AVX-512), so the tolerance is relative 1e-5 and, for the policy loss and the KL, whose terms
# cancel to about 1e-4 and 1e-2, absolute 1e-6 (CANCELLING).
REFERENCE = (
    "train --task CartPole-v1 --seeds 1 --num-envs 4 --num-steps 16 --lr 0.01 --anneal-steps 2 --update-epochs 4 "
    "--num-minibatches 2 --ent-coef 0 --vf-coef 0.5 --clip-coef 0.2 --max-grad-norm 0.5 --gamma 0.98 "
    "--gae-lambda 0.8 --max-steps 2 --stats"
).split()
PINNED = [
    {
        "train/policy_loss": 0.0007213479839265347,
        "train/value_loss": 4.930653095245361,
        "train/entropy": 0.6864839196205139,
        "train/kl": 0.006666479632258415,
        "train/clip_frac": 0.09765625,
        "train/grad_norm": 0.9776884913444519,
        "train/lr": 0.01,
        "env/episode_return": 10.666666666666666,
        "env/episodes": 3,
        "env/return_last20": 10.666666666666666,
        "env/total_steps": 64,
    },
    {
        "train/policy_loss": -0.00013097794726490974,
        "train/value_loss": 5.472129821777344,
        "train/entropy": 0.691685676574707,
        "train/kl": 0.0035706672351807356,
        "train/clip_frac": 0.0546875,
        "train/grad_norm": 1.2157665491104126,
        "train/lr": 0.005,
        "env/episode_return": 15.0,
        "env/episodes": 1,
        "env/return_last20": 11.75,  # the 4 episodes so far
        "env/total_steps": 128,
    },
]


def run(run_dir: Path, *overrides: str) -> list[dict[str, float]]:
    """A tiny run, resolved and trained as `rlplace-train` does (re-placed where it says so); its metrics.jsonl
    rows."""
    plan = resolve(compose_run([*TINY, *overrides]))
    train(plan, run_dir, resolved_config={}, switches=switches(plan, [*TINY, *overrides]))
    return metrics(run_dir)


def mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


CANCELLING = ("train/policy_loss", "train/kl")
"""Means of terms that cancel: compared to an absolute 1e-6 besides the relative 1e-5."""


def assert_matches(rows: list[dict[str, float]], expected_rows: list[dict[str, float]]) -> None:
    """The rows carry the expected numbers (PINNED's keys), step by step."""
    assert len(rows) == len(expected_rows) == len(PINNED)
    for step, (row, expected) in enumerate(zip(rows, expected_rows, strict=True)):
        for key in PINNED[step]:
            tolerance = 1e-6 if key in CANCELLING else 0.0
            assert row[key] == pytest.approx(expected[key], rel=1e-5, abs=tolerance), (step, key)


@pytest.fixture(scope="module")
def reference() -> list[dict[str, float]]:
    """benchmarks/ppo_reference.py's rows for the tiny run, computed in this process (a tenth of a second), for
    comparing runs with it on the machine that runs them."""
    spec = importlib.util.spec_from_file_location("ppo_reference", ROOT / "benchmarks" / "ppo_reference.py")
    module = importlib.util.module_from_spec(spec)
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
        patch.setattr(sys, "argv", ["ppo_reference.py", *REFERENCE])
        spec.loader.exec_module(module)
        module.main()
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    assert [row["step"] for row in rows] == [0, 1]
    return rows


@pytest.fixture(scope="module")
def hybrid_run(shared_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("hybrid")
    run(run_dir, *HYBRID, "runner.save_interval=1", "runner.profile=true")  # profiling follows the loop: no change
    return run_dir


@pytest.fixture(scope="module")
def collocated_run(shared_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("collocated")
    run(run_dir, *COLLOCATED)
    return run_dir


@pytest.mark.slow
def test_run_writes_metrics_timeline_and_checkpoints(hybrid_run: Path) -> None:
    assert json.loads((hybrid_run / RUN_INFO).read_text()) == {
        "mode": "hybrid",
        "num_devices": 2,
        "stages": 2,
        "staleness": 0,
    }
    rows = metrics(hybrid_run)
    assert [row["step"] for row in rows] == [0, 1]
    for key in (
        "time/step",
        "time/generate_rollouts",
        "time/training",
        "time/offload",
        "time/onload",
        "throughput/env_steps_per_s",
        "throughput/env_steps_per_s_per_device",
        "util/device_0/busy_frac",
        "util/device_1/busy_frac",
        "train/policy_loss",
        "env/return_last20",
    ):
        assert key in rows[-1], key
    trace = json.loads((hybrid_run / "timeline.json").read_text())
    names = {event["name"] for event in trace["traceEvents"] if event["ph"] == "X"}
    assert {"env_step", "rollout_infer", "training", "sync_weights", "offload", "onload"} <= names
    assert sorted(p.name for p in (hybrid_run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    summary = json.loads((hybrid_run / "summary.json").read_text())
    assert summary["run/startup_s"] > 0 and summary["run/teardown_s"] > 0


@pytest.mark.slow
def test_losses_match_the_single_process_reference(hybrid_run: Path, reference: list[dict[str, float]]) -> None:
    assert_matches(metrics(hybrid_run), reference)


def test_the_reference_still_gives_the_pinned_numbers(reference: list[dict[str, float]]) -> None:
    # Keeps benchmarks/ppo_reference.py running and in step with PINNED.
    assert_matches(reference, PINNED)


@pytest.mark.slow
def test_placement_changes_speed_never_results(hybrid_run: Path, collocated_run: Path) -> None:
    assert json.loads((collocated_run / RUN_INFO).read_text())["mode"] == "collocated"
    hybrid, collocated = metrics(hybrid_run), metrics(collocated_run)
    assert len(hybrid) == len(collocated) == 2
    for step in range(2):
        for key in COMPARED:
            assert hybrid[step][key] == collocated[step][key], (step, key)


@pytest.mark.slow
def test_the_actor_rank_count_does_not_change_results(hybrid_run: Path, tmp_path: Path) -> None:
    # hybrid_run with the actor data-parallel over both devices: 2 ranks train the update 1 rank does (global
    # minibatches, advantages normalised over them, losses weighted by each rank's share: `ppo.Shard`). Sums over
    # ranks round differently from one tensor's mean, by about 1e-7 relative: hence the tolerance.
    two_ranks = run(tmp_path, *HYBRID[:1], "cluster.component_placement.actor=0-1", *HYBRID[2:])
    one_rank = metrics(hybrid_run)
    assert len(two_ranks) == len(one_rank) == 2
    for step in range(2):
        for key in COMPARED:
            assert two_ranks[step][key] == pytest.approx(one_rank[step][key], rel=1e-5, abs=1e-6), (step, key)


@pytest.mark.slow
def test_the_return_window_and_the_stop_step_do_not_depend_on_placement(shared_ray: None, tmp_path: Path) -> None:
    # The default presets on cluster=local: hybrid runs 1 env process, collocated 2, so finished episodes arrive split
    # differently over env ranks (32 CartPole envs finish about 45 episodes a step). The 20-episode window that decides
    # when the task is solved must not see that. When episodes were joined env rank by env rank, collocated gave the
    # windows 21.3, 20.7, 27.25 here, hybrid 22.25, 22.85, 28.6 (and with solved_return 22 hybrid stopped 2 steps
    # earlier).
    # A checkpoint every step, the newest one kept (runner.keep_checkpoints): the earlier ones are removed.
    windows = {}
    for preset in ("hybrid", "collocated"):
        run_dir = tmp_path / preset
        run_dir.mkdir()
        overrides = [f"placement={preset}", "task.solved_return=24", "runner.seed=3", "algorithm.update_epochs=4"]
        overrides += ["runner.save_interval=1", "runner.keep_checkpoints=1", "runner.max_steps=6", "logger=jsonl"]
        train(resolve(compose_run(overrides)), run_dir, resolved_config={})
        windows[preset] = [row["env/return_last20"] for row in metrics(run_dir)]
        assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000003"]
    assert windows["hybrid"] == windows["collocated"]
    assert len(windows["hybrid"]) == 3  # the third window reaches 24: solved, stopped in both


@pytest.mark.slow
def test_env_and_rollout_pipeline_across_devices(hybrid_run: Path) -> None:
    trace = json.loads((hybrid_run / "timeline.json").read_text())
    spans = [
        {
            "name": e["name"],
            "group": e["args"]["group"],
            "rank": e["args"]["rank"],
            "start": e["ts"] / 1e6,
            "end": (e["ts"] + e["dur"]) / 1e6,
        }
        for e in trace["traceEvents"]
        if e["ph"] == "X" and e["name"] in ("env_step", "rollout_infer")
    ]
    timeline = Timeline({})
    timeline.extend(spans)
    end = max(span["end"] for span in spans)
    assert timeline.overlap("env", "rollout", 0.0, end) > 0


# Resuming hybrid_run's checkpoint with one env and one rollout process instead of two each: its sub-envs are stored
# by global index, so any split takes them back. Four stages keep one env per stream as in hybrid_run, so the rollout
# infers on batches of the same shape and the numbers match to the bit (with two envs per stream the MLP's batched
# matmul rounds differently: the policy loss moves by 1e-8). A resume under the same placement is the easier case of
# this one.
ONE_ENV_PROCESS = [
    *HYBRID[:2],
    "cluster.component_placement.env=0",
    "cluster.component_placement.rollout=1",
    "rollout.pipeline_stage_num=4",
]


@pytest.mark.slow
def test_resume_under_another_placement_continues_exactly(hybrid_run: Path, tmp_path: Path) -> None:
    resumed = run(tmp_path, *ONE_ENV_PROCESS, f"runner.resume={hybrid_run / 'checkpoints' / 'step_000001'}")
    full = metrics(hybrid_run)
    assert [row["step"] for row in resumed] == [1]
    for key in (*COMPARED, "env/total_steps", "train/lr"):
        assert resumed[0][key] == full[1][key], key


# Asynchronous training, K = 1: the actor on device 1 alone, so training overlaps generation; collocated, everything
# on device 0, so they take turns. Either way step t trains on rollouts acted on with weights v(max(0, t - 1)). One
# env and one rollout process each (the env/rollout overlap across processes is test_env_and_rollout_pipeline's):
# three processes to start per run instead of five.
ONE_EACH = ["placement=hybrid", "cluster.component_placement.env=0", "cluster.component_placement.rollout=0"]
OVERLAPPED = [*ONE_EACH, "cluster.component_placement.actor=1"]
ONE_EACH_COLLOCATED = [*ONE_EACH, "cluster.component_placement.actor=0"]
ASYNC = ["runner.max_staleness=1", "runner.max_steps=4"]
REPLACE = [TEST_PRESETS, "runner.replace_at=[2:one_device]"]
"""Re-placed after step 2 into the tests' own preset: env, rollout and actor on device 0 (as ONE_EACH_COLLOCATED)."""


@pytest.mark.slow
def test_async_training_resumes_exactly_under_another_placement(shared_ray: None, tmp_path: Path) -> None:
    # The actor's device is its own, so steps 0-2 generate the next step's rollouts beside training (how much they
    # overlap in time depends on the machine's load: benchmarks/async_speed.py measures it).
    placement = resolve(compose_run([*TINY, *OVERLAPPED, *ASYNC])).placement
    assert AsyncSchedule.of(placement, max_staleness=1, max_steps=4, trainer="actor").overlap
    overlapped = run(mkdir(tmp_path / "overlapped"), *OVERLAPPED, *ASYNC, "runner.save_interval=2")
    assert [row["async/staleness"] for row in overlapped] == [0.0, 1.0, 1.0, 1.0]  # step 0: the initial weights
    # Resumed collocated from the step-2 checkpoint, which holds the batch generated ahead: the actor now takes turns
    # with env and rollout instead of training beside them, and the numbers stay the same.
    checkpoint = tmp_path / "overlapped" / "checkpoints" / "step_000002"
    assert sorted(p.name for p in (checkpoint / "pending").iterdir()) == ["0.pt"]
    resumed = run(mkdir(tmp_path / "resumed"), *ONE_EACH_COLLOCATED, *ASYNC, f"runner.resume={checkpoint}")
    assert json.loads((tmp_path / "resumed" / RUN_INFO).read_text())["mode"] == "collocated"
    assert [row["step"] for row in resumed] == [2, 3]
    assert [row["time/overlap"] for row in resumed] == [0.0, 0.0]
    for row, full in zip(resumed, overlapped[2:], strict=True):
        for key in (*COMPARED, "env/total_steps", "train/lr", "train/behaviour_weight"):
            assert row.get(key) == full.get(key), key  # the last step generates nothing
    # The same switch in one run (runner.replace_at): after step 2 it checkpoints, stops its workers, starts them
    # on device 0 alone (a preset of the tests' own) from that checkpoint, and goes on: one metrics.jsonl, the same
    # numbers as the run that never moved, the switch on the timeline and in run.json.
    switched = run(mkdir(tmp_path / "switched"), *OVERLAPPED, *ASYNC, *REPLACE)
    assert [row["step"] for row in switched] == [0, 1, 2, 3]
    for row, full in zip(switched, overlapped, strict=True):
        for key in (*COMPARED, "env/total_steps", "train/lr", "train/behaviour_weight", "async/staleness"):
            assert row.get(key) == full.get(key), (row["step"], key)
    (replaced,) = json.loads((tmp_path / "switched" / RUN_INFO).read_text())["replaced"]
    assert (replaced["step"], replaced["to"]) == (2, "one_device") and replaced["seconds"] > 0
    # The run's rate covers the whole run: every env step over the loop's time in both placements and the switch.
    rate = json.loads((tmp_path / "switched" / "summary.json").read_text())["run/env_steps_per_s"]
    seconds = sum(row["time/step"] for row in switched) + replaced["seconds"]
    assert max(row.get("env/total_steps", 0) for row in switched) / rate >= 0.99 * seconds
    trace = json.loads((tmp_path / "switched" / "timeline.json").read_text())["traceEvents"]
    assert [e["name"] for e in trace if e.get("ph") == "X" and e["name"] == "replace"] == ["replace"]
    assert {e["name"] for e in trace if e.get("ph") == "X" and e["args"]["group"] == "actor"} >= {"training"}
    # The planner's own move (runner.replan_interval): started with everything on device 0, after step 2 it asks the
    # planner (a synthetic profile of a 2-device run) and, the margin being tiny, moves to the predicted fastest
    # placement. Its stage count may differ, and with it the batch shapes, which round differently: equal to 1e-5
    # (the CANCELLING ones to 1e-6 absolute, as in assert_matches).
    profile = write_profile(tmp_path / "profile")
    replan = [f"plan.profile={profile}", "runner.replan_interval=2", "runner.replan_margin=1e-9"]
    planned = run(mkdir(tmp_path / "planned"), *ONE_EACH_COLLOCATED, *ASYNC, *replan)
    info = json.loads((tmp_path / "planned" / RUN_INFO).read_text())
    (decision,) = info["replans"]  # after step 2 only: no switch is asked about after the last step
    assert decision["step"] == 2 and decision["switched"] and decision["predicted_gain_s"] > 0
    # It planned from a profile of its own steps 0-1: the synthetic profile's units with the run's placement, sizes,
    # metrics and timeline, on which the model calibrates, so that it predicts the placement they ran in about as
    # they measured (as close as the synthetic units alone leave room for).
    assert decision["profile"] == str(tmp_path / "planned" / OWN_PROFILES / "step_000002")
    own = resolve(compose_run([*TINY, *ONE_EACH_COLLOCATED, *ASYNC, f"plan.profile={decision['profile']}"]))
    measured = statistics.median(row["time/step"] for row in planned[:2])
    assert own.family.predict(own.cfg, own.placement).step_s == pytest.approx(measured, rel=0.15)
    assert [r["step"] for r in info["replaced"]] == [2] and info["replaced"][0]["to"] == decision["to"]
    assert [row["step"] for row in planned] == [0, 1, 2, 3]
    for row, full in zip(planned, overlapped, strict=True):
        for key in (*COMPARED, "env/total_steps", "train/lr", "async/staleness"):
            expected = full.get(key)  # None: the last step generates nothing
            tolerance = 1e-6 if key in CANCELLING else 0.0
            wanted = expected if expected is None else pytest.approx(expected, rel=1e-5, abs=tolerance)
            assert row.get(key) == wanted, key


# The HalfCheetah preset (MuJoCo, continuous actions, env and rollout pipelined in 2 stages) re-placed the same way at
# K = 1: env on device 0, rollout and actor on device 1, then everything on device 0. One process per component in
# both placements, so the batch shapes, and with them the numbers, stay the same bit for bit. Observations and rewards
# are normalised as CleanRL's continuous-control PPO does: the statistics travel with each sub-env's state.
CHEETAH = ["experiment=halfcheetah_pipeline", "rollout.num_steps=8", "model.hidden_sizes=[32,32]", *ASYNC]
CHEETAH += ["task.normalize_observation=true", "task.normalize_reward=true"]
CHEETAH += ["cluster.component_placement.env=0", "cluster.component_placement.rollout=1"]
CHEETAH += ["cluster.component_placement.actor=1"]


@pytest.mark.slow
def test_the_halfcheetah_preset_re_placed_while_it_runs_continues_exactly(shared_ray: None, tmp_path: Path) -> None:
    pytest.importorskip("mujoco")
    stayed = run(mkdir(tmp_path / "stayed"), *CHEETAH)
    switched = run(mkdir(tmp_path / "switched"), *CHEETAH, *REPLACE)
    (replaced,) = json.loads((tmp_path / "switched" / RUN_INFO).read_text())["replaced"]
    assert (replaced["step"], replaced["to"]) == (2, "one_device")
    assert [row["step"] for row in switched] == [row["step"] for row in stayed] == [0, 1, 2, 3]
    assert {"train/policy_loss", "train/grad_norm", "env/total_steps"} <= results(stayed[0]).keys()
    for row, full in zip(switched, stayed, strict=True):
        assert results(row) == results(full), row["step"]


def results(row: dict[str, float]) -> dict[str, float]:
    """A metrics row's numbers that placement must not change (not its times and rates)."""
    return {key: value for key, value in row.items() if key.startswith(("train/", "env/", "rollout/", "async/"))}


@pytest.mark.slow
def test_profile_times_each_component_after_the_run(hybrid_run: Path, collocated_run: Path) -> None:
    assert not (collocated_run / PROFILE_FILE).exists()  # only with runner.profile=true
    profile = json.loads((hybrid_run / PROFILE_FILE).read_text())
    assert profile.keys() == {
        *("family", "env_id", "device_type", "devices", "node_cores", "placement", "config"),
        *("env", "rollout", "actor", "average"),
    }
    assert (profile["family"], profile["env_id"], profile["device_type"]) == ("embodied", "CartPole-v1", "cpu")
    assert profile["devices"].keys() == {"0", "1"} and all(profile["devices"].values())  # each device's cores
    assert profile["placement"]["mode"] == "hybrid"
    assert [p["devices"] for p in profile["placement"]["components"]["actor"]] == [[0]]
    assert profile["config"] == {
        "total_num_envs": 4,
        "num_steps": 16,
        "pipeline_stage_num": 2,
        "update_epochs": 4,
        "num_minibatches": 2,
        "hidden_sizes": [64, 64],
        "max_staleness": 0,
        "offload": {"env": True, "rollout": True, "actor": True},
    }
    # Sizes: env and rollout up to task.total_num_envs; actor from 8 up to the minibatch, 4 x 16 / 2 samples.
    expected = {"env": [1, 2, 4], "rollout": [1, 2, 4], "actor": [8, 16, 32]}
    for component, sizes in expected.items():
        measured = profile[component]
        assert measured["sizes"] == sizes, component
        assert len(measured["seconds"]) == len(sizes) and all(s > 0 for s in measured["seconds"]), component
    env = profile["env"]["seconds"]
    assert env[-1] >= env[0] * 0.5  # 4 simulators take no less than 1, up to noise
    assert profile["average"] is None  # one actor rank: nothing to average (tests/embodied/test_profile.py: two)


@pytest.mark.slow
def test_a_checkpoint_refuses_another_number_of_envs_or_normalisation(compose_cfg, hybrid_run: Path) -> None:
    folder = hybrid_run / "checkpoints" / "step_000001"
    check_checkpoint(resolve(compose_cfg(*TINY, *ONE_ENV_PROCESS)).cfg, folder)  # another placement: accepted
    with pytest.raises(ConfigError, match="written with task.total_num_envs = 4, this run has 8") as refused:
        check_checkpoint(resolve(compose_cfg(*TINY, "task.total_num_envs=8")).cfg, folder)
    assert str(refused.value).startswith(f"runner.resume = {str(folder)!r}")
    assert "\n" not in str(refused.value)
    # Its sub-envs carry no normalisation statistics: a run that normalises cannot continue it exactly.
    with pytest.raises(ConfigError, match="written with task.normalize_reward = None, this run has True"):
        check_checkpoint(resolve(compose_cfg(*TINY, "task.normalize_reward=true")).cfg, folder)


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (["task.total_num_envs=6", "placement=collocated"], ConfigError, "task.total_num_envs = 6 must divide evenly"),
        (["task.env_id=Pong-v9"], ConfigError, "task.env_id = 'Pong-v9': 'Pong-v9' is not a registered gymnasium"),
        (["~cluster.component_placement.env"], PlacementError, r"required component\(s\) env not placed"),
        (["+cluster.component_placement.critic=0"], PlacementError, "unknown component 'critic'"),
        (["runner.resume=/no/such/checkpoint"], ConfigError, "runner.resume = '/no/such/checkpoint'"),
        (["algorithm.num_minibatches=64"], ConfigError, "algorithm.num_minibatches = 64 is too many"),
    ],
)
def test_bad_input_is_refused_before_workers_start(
    compose_cfg, overrides: list[str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        resolve(compose_cfg(*TINY, *overrides))


def test_cli_refuses_bad_input_with_exit_2_and_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rlplace.train", *TINY, f"hydra.run.dir={tmp_path}", "task.env_id=Pong-v9"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("rlplace: error: task.env_id = 'Pong-v9': 'Pong-v9' is not a registered gymnasium")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Worker" not in result.stdout + result.stderr
    assert not (tmp_path / RUN_INFO).exists()  # refused before the run started
