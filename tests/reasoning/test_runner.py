"""The reasoning loop end to end, from a tiny LM folder built here (not pretrained: these tests are about behaviour,
not accuracy; the accuracy gain is measured by the experiment itself and recorded in benchmarks/RESULTS.md).

Two runs cover the end-to-end tests, each trained in this process on the module's Ray when a test first reads it. The
collocated run trains as `rlplace-train` does once it has resolved the config: every component on one device with PPO
(critic and reference model included, both models training LoRA adapters), one step off (runner.max_staleness=1) and a
checkpoint after every step. Two more runs go from the same state to another placement, the actor alone on a device,
training beside generation: one resumes the collocated run's step-2 checkpoint, which holds the micro-batches
generated ahead, and one re-places itself after step 2 (`runner.replace_at`). Both must continue the collocated run
exactly, which checks resume, re-placement and placement independence under asynchronous training at once. The
synchronous disaggregated preset, with two data-parallel actor ranks and generating with vLLM where it is installed,
runs through the command's entry point as users start it (`rlplace-train experiment=arithmetic_grpo_disagg ...`,
`tests/train_here.py`), after the collocated runs: its 4 devices are the shape of the sweep of
tests/reasoning/test_placements.py, which takes over its processes. Runs of this process take over the devices and
worker processes of the run before (`scheduler/parking.py`). Config and placement refusals (and checkpoints a run
cannot resume) are checked in-process through `resolve`, as both CLIs do, and one of them through the CLI.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import logging
import shlex
import shutil
import statistics
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from rlplace.cli import EXIT_BAD_CONFIG, compose_run
from rlplace.core.errors import ConfigError
from rlplace.core.schedule import AsyncSchedule
from rlplace.families import resolve
from rlplace.metrics import Timeline
from rlplace.placement import PlacementError
from rlplace.planner import PROFILE_FILE
from rlplace.reasoning import lora
from rlplace.reasoning.export import main as export_main
from rlplace.reasoning.launch import check_checkpoint, checkpoint_identity
from rlplace.reasoning.memory import predict_memory
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.replace import switches
from rlplace.train import train
from tests import TEST_PRESETS
from tests.reasoning.runs import ON_DEVICE_0, arguments, command, compared, metrics, same, tiny_overrides, trained
from tests.train_here import train_here

VLLM = importlib.util.find_spec("vllm") is not None
ASYNC_PPO = [
    "experiment=arithmetic_grpo",
    "algorithm=reasoning_ppo",
    "runner.max_staleness=1",
    "runner.max_steps=4",
    "reward.overlong_buffer=2",  # DAPO's overlong penalty over the last 2 of the 4 new tokens
    "algorithm.kl_ctrl=adaptive",  # the KL coefficient, part of the actor's state, moves every step ...
    "algorithm.kl_horizon=16",  # ... by up to 20%: a step's 16 responses
    "actor.lora.rank=8",  # LoRA adapters on the policy and the critic: resumed and re-placed exactly too
]
SPLIT_ROLLOUT = [  # a vLLM engine split over 2 rollout ranks, on a device and a core each: 5 devices, the rest moved up
    "rollout=vllm",
    "rollout.tensor_parallel_size=2",
    "cluster.num_devices_per_node=5",
    "cluster.component_placement.rollout=0-1",
    "cluster.component_placement.actor=2:0-1",
    "cluster.component_placement.inference=3",
    "cluster.component_placement.reward=4",
]
RUNS = {
    # Every component on device 0 (of one core), taking turns: the actor, rollout and inference offload while the
    # others work.
    # PPO: its critic's GAE advantages are not all 0 even when every reward is (an untrained model answers nothing
    # right), so the weights change every step and a resume has real state to continue from. One step off
    # (runner.max_staleness=1): each checkpoint holds the micro-batches of the next step, generated ahead. Device 1
    # stays idle: the cluster is the one the runs after it re-place the actor into.
    "collocated": [
        *ASYNC_PPO,
        "runner.save_interval=1",
        *ON_DEVICE_0,
        "actor.enable_offload=true",
        "rollout.enable_offload=true",
        "inference.enable_offload=true",
    ],
    # Each stage on its own device, 16 micro-batches of 8-token responses per step streaming through them (enough
    # for the stages to overlap even when generation is quick), routed over 2 actor ranks that average their
    # gradients and train LoRA adapters, which weight sync sends alone (the engines apply them; the inference group's
    # policy copy scores the KL term's reference with them off); generation with vLLM, one engine split over 2
    # rollout ranks (hf on 1 rank without vLLM), its tokens' log-probs the behaviour policy's; profiled for the
    # planner (the actor's passes timed on both ranks at once after the run).
    "disaggregated": [
        "experiment=arithmetic_grpo_disagg",
        "task.prompts_per_step=16",
        "rollout.micro_batch_prompts=1",
        "rollout.max_new_tokens=8",
        "cluster.component_placement.actor=1:0-1",
        "actor.lora.rank=8",
        "actor.lora.sync=adapters",
        "algorithm.kl_coef=0.01",
        "algorithm.ent_coef=0.01",  # a gradient even where every reward of the untrained model is 0
        "algorithm.behaviour_logprobs=rollout",  # the update weighs tokens by the engine's own log-probs of them,
        "algorithm.off_policy_correction=truncated_is",  # truncated at 2 (the rollout-training mismatch)
        "algorithm.behaviour_weight_cap=2.0",
        *(SPLIT_ROLLOUT if VLLM else []),
        "runner.profile=true",
    ],
}
APART = [TEST_PRESETS, "placement=actor_apart"]
"""The collocated run with the actor alone on device 1 (a preset of the tests' own): it trains on step t while the
others generate step t + 1."""


def trained_state(checkpoint: Path, scratch: Path) -> dict:
    """The actor's models and optimizers of a checkpoint (`torch.distributed.checkpoint` files), as one dict."""
    dcp_to_torch_save(checkpoint / "actor", scratch)
    return torch.load(scratch, weights_only=False)


class Runs:
    """The module's two runs, each trained on first use (`runs[variant]` is its folder); what the disaggregated
    command wrote to stdout is kept beside it."""

    def __init__(self, model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.model_path, self.tmp_path_factory = model_path, tmp_path_factory
        self.folders: dict[str, Path] = {}
        self.stdout = ""

    def __getitem__(self, variant: str) -> Path:
        if variant not in self.folders:
            folder = self.tmp_path_factory.mktemp(variant)
            if variant == "collocated":
                trained(folder, self.model_path, *RUNS[variant])
            else:
                self.stdout = train_here(*arguments(folder, self.model_path, *RUNS[variant])).stdout
            self.folders[variant] = folder
        return self.folders[variant]


@pytest.fixture(scope="module")
def runs(shared_ray: None, model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(model_path, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["collocated"])
def test_resume_under_another_placement_continues_exactly(
    variant: str, runs: Runs, model_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    full = runs[variant]
    checkpoint = full / "checkpoints" / "step_000002"
    overrides = tiny_overrides(model_path, *ASYNC_PPO, *APART)
    plan = resolve(compose_run([*overrides, f"runner.resume={checkpoint}"]))
    check_checkpoint(plan.cfg, checkpoint)
    with caplog.at_level(logging.INFO):
        train(plan, tmp_path, resolved_config={})
    assert f"rlplace: resumed from {checkpoint} at step 2" in caplog.messages
    state = json.loads((checkpoint / "runner.json").read_text())
    assert (state["family"], state["step"], state["version"]) == ("reasoning", 2, 2)
    assert [step for step, _ in state["accuracy"]] == [0, 1, 2]  # before the first step, and after each
    assert state["identity"]["algorithm.name"] == "ppo" and state["identity"]["task.prompts_per_step"] == 4
    assert [p.name for p in (checkpoint / "pending").iterdir()] == ["0.pt"]  # step 2's batch, generated in step 1
    actor = torch.load(checkpoint / "actor.pt", weights_only=False)
    assert set(actor) == {"generator", "rng", "version", "kl_coef"}
    assert set(actor["rng"]) == {"torch", "numpy", "python"} and actor["version"] == 2
    models = trained_state(checkpoint, tmp_path / "step2.pt")
    assert set(models) == {"policy", "policy_optimizer", "critic", "critic_optimizer"}
    # Steps 2 and 3 again, from the restored policy, critic, optimizers, generators and pending micro-batches, with
    # the actor on a device of its own: the same numbers to the last bit. Step 2 generates step 3 beside training
    # (how much they overlap in time depends on the machine's load); step 3 generates nothing.
    assert AsyncSchedule.of(plan.placement, max_staleness=1, max_steps=4, trainer="actor").overlap
    rows = metrics(tmp_path)
    assert [row["step"] for row in rows] == [2, 3]
    assert [compared(row) for row in rows] == [compared(row) for row in metrics(full)[2:]]
    assert rows[1]["time/overlap"] == 0.0
    assert {"train/value_loss", "train/grad_norm", "rollout/response_length", "eval/accuracy"} <= set(compared(rows[0]))
    # The same final state, and an accuracy history without a second evaluation before the first step. The numpy and
    # Python streams aside: nothing seeds them and the run never draws from them (two fresh runs differ there too).
    final = "checkpoints/step_000004"
    assert (tmp_path / final / "runner.json").read_text() == (full / final / "runner.json").read_text()
    actors = [torch.load(folder / final / "actor.pt", weights_only=False) for folder in (tmp_path, full)]
    for state in actors:
        del state["rng"]["numpy"], state["rng"]["python"]
    assert same(*actors)
    models = [trained_state(folder / final, tmp_path / f"{n}.pt") for n, folder in enumerate((tmp_path, full))]
    assert same(*models)
    again, once = (json.loads((folder / "summary.json").read_text()) for folder in (tmp_path, full))
    for key in ("eval/accuracy_before", "eval/accuracy_after"):
        assert again[key] == once[key], key


# The same move, made by the run itself (runner.replace_at): the collocated run for steps 0-1, then, from the
# checkpoint the switch writes, the actor alone on device 1 for steps 2-3, in one run.
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["collocated"])
def test_a_run_re_placed_while_it_runs_continues_exactly(
    variant: str, runs: Runs, model_path: Path, tmp_path: Path
) -> None:
    overrides = tiny_overrides(model_path, *RUNS[variant])
    overrides += [TEST_PRESETS, "runner.replace_at=[2:actor_apart]"]
    plan = resolve(compose_run(overrides))
    (switch,) = switches(plan, overrides)
    assert plan.placement.mode == "collocated" and switch.plan.placement.devices_of("actor") == [1]
    train(plan, tmp_path, resolved_config={}, switches=[switch])
    rows = metrics(tmp_path)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert [compared(row) for row in rows] == [compared(row) for row in metrics(runs[variant])]
    assert json.loads((tmp_path / "run.json").read_text())["replaced"][0]["to"] == "actor_apart"


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["collocated", "disaggregated"])
def test_runs_in_both_modes_and_writes_metrics_timeline_and_model(variant: str, runs: Runs) -> None:
    run = runs[variant]
    assert json.loads((run / "run.json").read_text())["mode"] == variant
    if variant == "disaggregated":  # the command's last words
        assert "rlplace: done: disaggregated placement, held-out accuracy" in runs.stdout
    steps = 4 if variant == "collocated" else 2
    saved = [f"step_{step:06d}" for step in range(1, steps + 1)] if variant == "collocated" else ["step_000002"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == saved  # save_interval 1, 0
    rows = metrics(run)
    assert len(rows) == steps
    # One step off (collocated), the last step generates nothing: there is no step ahead of it.
    generating = rows[:-1] if variant == "collocated" else rows
    assert all("time/generate_rollouts" not in row for row in rows[len(generating) :])
    for row in rows:
        for key in (
            "time/step",
            "time/sync_weights",
            "time/rollout",
            "time/reward",
            "time/inference",
            "time/training",
            "throughput/tokens_per_s",
            "throughput/tokens_per_s_per_device",
            "rollout/response_length",
            "rollout/reward",
            "train/policy_loss",
            "train/kl",
            "train/clip_frac",
            "eval/accuracy",
            *(("time/generate_rollouts", "throughput/generation_tokens_per_s") if row in generating else ()),
        ):
            assert key in row, key
        max_new_tokens = 8 if variant == "disaggregated" else 4
        rule = row["rollout/reward"] - row.get("reward/overlong_penalty", 0.0)  # the penalty is part of the reward
        assert 0 <= rule <= 1 and 0 < row["rollout/response_length"] <= max_new_tokens
        if variant == "collocated":  # each response's penalty is 0, -0.5 (3 tokens) or -1 (4, cut off or not)
            assert -1 <= row["reward/overlong_penalty"] <= -row["rollout/clip_ratio"]
            assert row["reward/score"] == pytest.approx(row["rollout/reward"])
            # The adaptive KL coefficient: each step's KL in the reward is far under the target (0.1), so it shrinks
            # by the most a step allows, 20% (its 16 responses are kl_horizon's): 0.001 x 0.8^step.
            assert row["train/reward_kl"] < 0.08
            assert row["train/kl_coef"] == pytest.approx(0.001 * 0.8 ** row["step"], rel=1e-9)
        # Responses cut at max_new_tokens: each of them has max_new_tokens tokens.
        assert 0 <= row["rollout/clip_ratio"] * max_new_tokens <= row["rollout/response_length"]
        if variant == "disaggregated":  # an untrained model's 8 tokens seldom include its end token
            assert row["rollout/clip_ratio"] > 0
    spans = [
        {
            "name": e["name"],
            "group": e["args"]["group"],
            "rank": e["args"]["rank"],
            "start": e["ts"] / 1e6,
            "end": (e["ts"] + e["dur"]) / 1e6,
        }
        for e in json.loads((run / "timeline.json").read_text())["traceEvents"]
        if e["ph"] == "X"
    ]
    assert {"rollout_generate", "reward", "inference", "training", "sync_weights"} <= {s["name"] for s in spans}
    if variant == "disaggregated":
        # Both actor ranks trained; the rollout generates micro-batch m+1 while the inference worker scores m.
        assert {s["rank"] for s in spans if s["group"] == "actor" and s["name"] == "training"} == {0, 1}
        timeline = Timeline({})
        timeline.extend(s for s in spans if s["name"] in ("rollout_generate", "inference"))
        assert timeline.overlap("rollout", "inference", 0.0, max(s["end"] for s in spans)) > 0
    assert load_causal_lm(run / "final_model").config.model_type == "llama"


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["collocated", "disaggregated"])
def test_the_last_checkpoint_exports_as_the_final_model(variant: str, runs: Runs, tmp_path: Path) -> None:
    """`rlplace-export` turns a checkpoint (written by 1 actor rank, or by 2) into the model folder the run wrote at
    its end: the same weights to the bit, the same files beside them."""
    run = runs[variant]
    last = sorted((run / "checkpoints").iterdir())[-1]
    assert export_main([str(last), str(tmp_path / "exported")]) == 0
    exported, final = (load_causal_lm(folder).state_dict() for folder in (tmp_path / "exported", run / "final_model"))
    assert exported.keys() == final.keys() and same(exported, final)
    assert {p.name for p in (run / "final_model").iterdir()} <= {p.name for p in (tmp_path / "exported").iterdir()}
    assert load_tokenizer(tmp_path / "exported").get_vocab() == load_tokenizer(run / "final_model").get_vocab()
    assert export_main([str(last), str(tmp_path / "exported")]) == 2  # the target exists
    assert export_main([str(run), str(tmp_path / "again")]) == 2  # a run folder, not a checkpoint


@pytest.mark.slow
def test_lora_trains_its_adapters_and_hands_out_the_merged_policy(runs: Runs, model_path: Path, tmp_path: Path) -> None:
    # The disaggregated run's 2 actor ranks train LoRA adapters, sent alone to the engines and the inference group:
    # the checkpoint holds the base weights as loaded and AdamW state for the adapters alone; the final model is an
    # ordinary model folder whose adapted projections moved (the engines ran on the adapters: the version check
    # below; the export test: the same merge from the checkpoint).
    run = runs["disaggregated"]
    models = trained_state(run / "checkpoints" / "step_000002", tmp_path / "state.pt")
    start = load_causal_lm(model_path).state_dict()
    adapters = {name for name in models["policy"] if ".lora_" in name}
    assert set(models["policy_optimizer"]["state"]) == adapters
    for name, tensor in models["policy"].items():
        if name not in adapters:
            assert torch.equal(tensor, start[lora.base_name(name)]), name
    final = load_causal_lm(run / "final_model").state_dict()
    moved = {name for name in start if not torch.equal(final[name], start[name])}
    # The adapters alone beside it, in PEFT's format: on the base model, merged, they are the final model.
    adapted = PeftModel.from_pretrained(load_causal_lm(model_path), run / "final_model" / lora.ADAPTER_FOLDER)
    assert same(adapted.merge_and_unload().state_dict(), final)
    assert final.keys() == start.keys() and moved
    assert {name.rsplit(".", 2)[-2] for name in moved} <= {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }


@pytest.mark.slow
def test_vllm_backend_trains_and_its_weights_follow_the_actor(runs: Runs) -> None:
    # The disaggregated run generates with vLLM, one engine split over 2 rollout ranks: each rank checks the weight
    # version it is asked for every step (StaleWeightsError otherwise), so a finished run means the engine's weights
    # followed the actor's. Both ranks generate every micro-batch (16 a step); the first hands each on.
    pytest.importorskip("vllm")
    run = runs["disaggregated"]
    config = (run / ".hydra" / "config.yaml").read_text()
    assert "backend: vllm" in config and "tensor_parallel_size: 2" in config
    rows = metrics(run)
    assert len(rows) == 2 and all("eval/accuracy" in row for row in rows)
    events = json.loads((run / "timeline.json").read_text())["traceEvents"]
    generated = collections.Counter(
        e["args"]["rank"] for e in events if e["ph"] == "X" and e["name"] == "rollout_generate"
    )
    assert generated[0] == generated[1] >= 16
    # The engine's log-probs of its tokens against the inference group's of the same weights (LoRA adapters applied
    # by vLLM, merged into the copy's forward pass): float32 kernels on a CPU differ in the last bits alone.
    for row in rows:
        assert 0.0 <= row["rollout/mismatch_kl"] < 1e-4
        assert row["train/behaviour_weight"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["disaggregated"])
def test_a_profiled_run_predicts_itself_plans_the_others_and_auto_runs_its_choice(
    variant: str, runs: Runs, model_path: Path
) -> None:
    run = runs[variant]
    profile = json.loads((run / PROFILE_FILE).read_text())
    assert (profile["family"], profile["task"], profile["placement"]["mode"]) == (
        "reasoning",
        "arithmetic",
        "disaggregated",
    )
    assert profile["config"]["prompts_per_step"] == 16 and profile["config"]["micro_batch_prompts"] == 1
    assert profile["config"]["tensor_parallel_size"] == (2 if VLLM else 1)
    assert (profile["config"]["lora_rank"], profile["config"]["lora_sync"]) == (8, "adapters")
    passes = profile["actor"]
    assert passes["sizes"] == [1, 2, 4, 8, 16, 32] and all(s > 0 for s in passes["seconds"])  # 64 rows / 2 minibatches
    assert passes["optimizer_step"] > 0 and passes["row_tokens"] > 0
    # Calibrated on the run it profiled, the model gives back that run's median step.
    profiled = tiny_overrides(model_path, *RUNS[variant])
    planned = resolve(compose_run([*profiled, f"plan.profile={run}"]))
    measured = statistics.median(row["time/step"] for row in metrics(run))
    assert planned.prediction.step_s == pytest.approx(measured, rel=1e-6)
    # The same run on other placements (the profiled sizes, the hf rollout).
    same = tiny_overrides(model_path, *RUNS[variant][1:4])
    same.append(f"plan.profile={run}")
    # Collocated on one device, the four stages take turns: its generation is predicted longer than apart.
    collocated = resolve(compose_run([*same, "cluster.num_devices_per_node=1"]))
    assert collocated.placement.mode == "collocated"
    assert collocated.prediction.phases["generate_rollouts"] > planned.prediction.phases["generate_rollouts"]
    assumptions = " ".join(collocated.prediction.assumptions)
    assert "the profiled run, which trained LoRA adapters of rank 8" in assumptions  # planned training every weight
    assert "the profiled run, which sent LoRA adapters alone" in assumptions
    if VLLM:  # profiled with an engine split over 2 ranks, planned with a whole one on each rank
        assert "(profiled split over 2)" in assumptions
    # placement=auto on the profiled cluster: the fastest candidate at the run's staleness, ranked, and the same
    # config as its override line run by hand.
    auto = resolve(compose_run([*same, "cluster=local4", "placement=auto"]))
    assert auto.prediction is auto.ranking[0].prediction
    steps = [r.prediction.step_s for r in auto.ranking]
    assert steps == sorted(steps) and {r.max_staleness for r in auto.ranking} == {0}
    by_hand = resolve(compose_run([*same, "cluster=local4", *shlex.split(auto.ranking[0].overrides)]))
    assert replace(auto.cfg, plan=by_hand.cfg.plan) == by_hand.cfg
    assert auto.placement.to_dict() == by_hand.placement.to_dict()
    # With the devices' memory known, a candidate may also keep resident what the switch plan would move: on one
    # device with room for everything, nothing moves in the fastest; with room for the step only when every idle
    # component leaves, each candidate offloads (the memory check leaves out the others).
    one = [*same, "cluster.num_devices_per_node=1"]
    moving = _device_need(resolve(compose_run([*one, "placement=reasoning_collocated"])))
    kept = ("actor", "rollout", "inference")
    resident = [f"{name}.enable_offload=false" for name in kept]
    staying = _device_need(resolve(compose_run([*one, "placement=reasoning_collocated", *resident])))
    assert moving < staying
    roomy = resolve(compose_run([*one, f"cluster.device_memory_gb={2 * staying}", "placement=auto"]))
    assert len(roomy.ranking) == 8 and not any(roomy.ranking[0].offload.values())  # 2^3 choices at the run's K
    assert {name: getattr(roomy.cfg, name).enable_offload for name in kept} == roomy.ranking[0].offload
    tight = resolve(compose_run([*one, f"cluster.device_memory_gb={(moving + staying) / 2}", "placement=auto"]))
    assert tight.ranking and all(any(r.offload.values()) for r in tight.ranking)
    if VLLM:  # a vLLM engine whose key/value cache fits a device only split over 2 ranks: each candidate splits it
        large = [*same, "rollout=vllm", "task.prompts_per_step=32", "rollout.micro_batch_prompts=16"]
        large += ["algorithm.group_size=16", "rollout.max_new_tokens=64", "actor.max_tokens_per_micro_batch=80"]
        apart = ["cluster=local4", "placement=reasoning_disaggregated", 'cluster.component_placement.rollout="0,3"']
        whole, split = (resolve(compose_run([*large, *apart, f"rollout.tensor_parallel_size={t}"])) for t in (1, 2))
        whole, split = (predict_memory(plan.cfg, plan.placement) for plan in (whole, split))
        assert max(whole.peaks[0].values()) == whole.peak > split.peak  # a whole engine is the largest of any device
        capacity = f"cluster.device_memory_gb={(whole.peak + split.peak) / 2e9}"
        auto = resolve(compose_run([*large, "cluster=local4", capacity, "placement=auto"]))
        assert auto.ranking and all(r.tensor_parallel_size == 2 for r in auto.ranking)
        assert auto.cfg.rollout.tensor_parallel_size == 2
        assert "rollout.tensor_parallel_size=2" in auto.ranking[0].overrides
        by_hand = resolve(compose_run([*large, "cluster=local4", capacity, *shlex.split(auto.ranking[0].overrides)]))
        assert replace(auto.cfg, plan=by_hand.cfg.plan) == by_hand.cfg


def _device_need(plan) -> float:
    """The predicted peak of the busiest device in its busiest phase, GB."""
    return predict_memory(plan.cfg, plan.placement).peak / 1e9


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["collocated"])
def test_one_step_off_trains_on_the_batch_generated_ahead(variant: str, runs: Runs) -> None:
    rows = metrics(runs[variant])
    assert [row["async/staleness"] for row in rows] == [0.0, 1.0, 1.0, 1.0]  # step 0: the initial weights
    assert rows[0]["train/behaviour_weight"] == 1.0  # π_behav is π_prox, to the last bit
    assert any(row["train/behaviour_weight"] != 1.0 for row in rows[1:])
    # Training beside generation only where the actor has a device of its own: never on the one device here.
    assert [row["time/overlap"] for row in rows] == [0.0] * 4


ARITHMETIC_GROUPS = ["task=arithmetic", "model=tiny_lm", "placement=reasoning_collocated"]
"""A reasoning run chosen group by group instead of through the experiment preset."""


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (["model.path=/nowhere"], ConfigError, "model.path = '/nowhere' is invalid: no such folder"),
        (
            ["rollout.micro_batch_prompts=3"],
            ConfigError,
            "rollout.micro_batch_prompts = 3 must divide task.prompts_per_step = 4",
        ),
        (["rollout.micro_batch_prompts=4"], ConfigError, "do not divide evenly over the 2 actor processes"),
        (["algorithm.group_size=1"], ConfigError, "algorithm.group_size = 1 is invalid"),
        (["algorithm.num_minibatches=9"], ConfigError, "algorithm.num_minibatches = 9 is more than each actor's 8"),
        # Options of the other (embodied) family, naming the section and the valid reasoning options.
        (
            [*ARITHMETIC_GROUPS, "algorithm=grpo", "rollout=policy"],
            ConfigError,
            r"rollout: the chosen option \(rollout.backend = 'policy'\) belongs to the embodied family, but "
            r"task.name = 'arithmetic' is of the reasoning family \(valid: rollout=hf, rollout=vllm\)",
        ),
        (
            [*ARITHMETIC_GROUPS, "algorithm=ppo", "rollout=hf"],
            ConfigError,
            r"algorithm: the chosen option \(algorithm.name = 'ppo'\) belongs to the embodied family.*"
            r"valid: algorithm=dr_grpo, algorithm=grpo, algorithm=gspo, algorithm=reasoning_ppo, "
            r"algorithm=reinforce, algorithm=reinforce_pp, algorithm=rloo\)",
        ),
        # A rollout engine split over ranks: only where the backend splits one, over ranks that divide its heads and
        # make whole replicas of the rollout's processes.
        (
            ["rollout.tensor_parallel_size=2"],
            ConfigError,
            r"rollout.tensor_parallel_size = 2 is invalid with rollout.backend = 'hf', which holds the whole model on "
            r"each rank \(valid: 1, or rollout.backend=vllm\)",
        ),
        (["rollout.tensor_parallel_size=0"], ConfigError, r"rollout.tensor_parallel_size = 0 is invalid: at least 1"),
        (
            ["rollout=vllm", "rollout.tensor_parallel_size=3"],
            ConfigError,
            "rollout.tensor_parallel_size = 3 is invalid: it must divide the model's 4 attention heads",
        ),
        (
            ["rollout=vllm", "rollout.tensor_parallel_size=4"],
            ConfigError,
            r"rollout.tensor_parallel_size = 4 must divide the 2 rollout process\(es\) of the placement",
        ),
        (
            ["experiment=arithmetic_grpo_disagg", "cluster.component_placement.reward=null"],
            PlacementError,
            "reward not placed",
        ),
        (
            ["experiment=arithmetic_grpo_disagg", "cluster.num_devices_per_node=2"],
            ConfigError,
            r"cluster.component_placement.rollout: this placement preset asks for devices \[0, 1/4\)",
        ),
        (["runner.max_staleness=-1"], ConfigError, r"runner.max_staleness = -1 is invalid"),
    ],
)
def test_bad_input_is_refused_before_workers_start(
    overrides: list[str], error: type[Exception], message: str, model_path: Path, compose_cfg
) -> None:
    if not overrides[0].startswith("task="):  # else the options are chosen group by group, as they are
        overrides = tiny_overrides(model_path, *overrides)
    with pytest.raises(error, match=message):
        resolve(compose_cfg(*overrides))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("task.prompts_per_step=8", "it was written with task.prompts_per_step = 4, this run has 8"),
        ("algorithm=reinforce_pp", "it was written with algorithm.name = 'ppo', this run has 'reinforce_pp'"),
        ("runner.max_staleness=0", "it was written with runner.max_staleness = 1, this run has 0"),
        ("a wider model", "it was written with the model's hidden_size = 64, this run has 128"),
        (
            "actor.lora.rank=4",
            r"it was written with actor.lora = \{'rank': 8, .*\}, this run has \{'rank': 4, 'alpha': 16, "
            r"'target_modules': \['all-linear'\]\}",
        ),
        ("actor.lora.rank=0", r"it was written with actor.lora = \{'rank': 8, .*\}, this run has None"),
        ("actor.lora.critic=false", r"it was written with actor.lora = \{.*\]\}, this run has \{.*'critic': False\}"),
        ("an embodied run", r"not a checkpoint of the reasoning family \(no reasoning state in its runner.json\)"),
    ],
    ids=["prompts_per_step", "algorithm", "staleness", "model_shape", "lora", "no_lora", "lora_critic", "embodied"],
)
def test_check_checkpoint_refuses_a_checkpoint_this_run_cannot_continue(
    change: str, message: str, model_path: Path, tmp_path: Path, compose_cfg
) -> None:
    overrides = tiny_overrides(model_path, *RUNS["collocated"])
    written = resolve(compose_cfg(*overrides)).cfg
    folder = tmp_path / "step_000001"
    folder.mkdir()
    state = {"family": "reasoning", "step": 1, "identity": checkpoint_identity(written, model_path)}
    (folder / "runner.json").write_text(json.dumps(state))
    check_checkpoint(written, folder)  # the run that wrote it may resume it
    if change == "a wider model":
        wider = shutil.copytree(model_path, tmp_path / "wider")
        config = json.loads((wider / "config.json").read_text())
        (wider / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))
        overrides.append(f"model.path={wider}")
    elif change == "an embodied run":  # the runner.json it writes
        (folder / "runner.json").write_text(json.dumps({"step": 1, "total_env_steps": 64, "recent_returns": []}))
    else:
        overrides.append(change)
    with pytest.raises(ConfigError, match=f"^runner.resume = '{folder}' is invalid: {message}"):
        check_checkpoint(resolve(compose_cfg(*overrides)).cfg, folder)


def test_cli_refuses_bad_input_with_exit_code_2_and_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        command(tmp_path, Path("/nowhere")), capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == EXIT_BAD_CONFIG, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == ["rlplace: error: model.path = '/nowhere' is invalid: no such folder"]
    assert not (tmp_path / "metrics.jsonl").exists()
