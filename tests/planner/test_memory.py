"""Device memory predicted from a model's shape: parameter counts as torch counts them, the switch plan's offloads
left out of a phase's sum, sharding dividing the actor's state, and a run that does not fit refused by both CLIs
with exit 2 before anything starts. (The prediction against measured peaks: benchmarks/actor_memory.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import LlamaConfig, Qwen2Config

from rlplace.cli import compose_run
from rlplace.core.errors import ConfigError
from rlplace.families import resolve
from rlplace.planner.memory import TransformerShape, Usage, device_peaks, over_capacity
from rlplace.reasoning.launch import check_built_model_memory
from rlplace.reasoning.memory import predict_memory
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm
from rlplace.reasoning.tasks import make_prompt_source

SMALL = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2}


@pytest.mark.parametrize(
    "config",
    [
        Qwen2Config(**SMALL, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
        Qwen2Config(**SMALL, num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True),
        LlamaConfig(**SMALL, num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False),
    ],
    ids=["qwen2", "qwen2_tied", "llama"],
)
def test_parameters_are_counted_as_torch_counts_them(config):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config)
    shape = TransformerShape.from_config(config.to_dict())
    assert shape.parameters() == sum(p.numel() for p in model.parameters())
    assert shape.parameters(head=False) == sum(p.numel() for p in model.base_model.parameters())


def test_a_phase_sums_what_is_not_offloaded_and_the_worst_excess_is_named():
    phases = (("generate", frozenset({"rollout"})), ("train", frozenset({"actor"})))
    devices = {"actor": frozenset({0, 1}), "rollout": frozenset({0})}
    usage = {"actor": Usage(10, {"train": 30}), "rollout": Usage(5, {"generate": 8})}
    offloaded = {"generate": frozenset({"actor"}), "train": frozenset()}
    peaks = device_peaks(phases, devices, offloaded, usage)
    assert peaks == {0: {"generate": 8, "train": 35}, 1: {"train": 30}}
    assert over_capacity({0: {"train": int(3e9)}, 1: {"train": int(5e9)}}, 4.0) == (1, "train", pytest.approx(1.0))
    assert over_capacity(peaks, 1.0) is None


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), TinyLMShape(num_layers=1, hidden_size=64))


def test_sharding_divides_the_actors_state_and_offload_empties_the_idle_phase(model_path):
    overrides = [
        "experiment=arithmetic_grpo",
        f"model.path={model_path}",
        "cluster.num_devices_per_node=2",
        "algorithm.kl_coef=0.01",  # the inference group holds the reference model beside its copy of the policy
        "weight_sync.bucket_mb=0.01",  # several buckets: the vocabulary matrix (25.6 kB) alone, the layers in others
    ]
    replica = predict_memory(*_plan([*overrides, "actor.strategy=ddp"]))
    sharded = predict_memory(*_plan([*overrides, "actor.strategy=fsdp"]))
    shape = TransformerShape.from_config(json.loads((model_path / "config.json").read_text()))
    # Between updates a rank holds weights and AdamW's moments (the gradients are freed after each optimizer step).
    assert replica.usage["actor"].resident == 12 * shape.parameters()
    assert sharded.usage["actor"].resident == 6 * shape.parameters()  # its shards; a unit is gathered in a pass only
    unit = 8 * shape.largest_unit()  # gathered in the compute precision (fp32) with its unreduced gradient
    assert replica.usage["actor"].working["training"] - sharded.usage["actor"].working["training"] == (
        8 * shape.parameters() - unit
    )
    # The inference ranks hold the policy's copy and the reference model as the actor holds the policy: float32, whole
    # or halved over 2 ranks, with a unit gathered during a pass.
    assert replica.usage["inference"].resident == 2 * 4 * shape.parameters()
    assert sharded.usage["inference"].resident == 4 * shape.parameters()
    whole, halved = (run.usage["inference"].in_phase("generate_rollouts") for run in (replica, sharded))
    assert whole - halved == 4 * shape.parameters() - 4 * shape.largest_unit()
    # Collocated with offload (the preset): the actor is off both devices while the others generate, the rollout
    # engine and the inference group's models while the actor trains.
    generate = replica.peaks[0]["generate_rollouts"]
    assert generate == sum(replica.usage[c].in_phase("generate_rollouts") for c in ("rollout", "inference"))
    assert replica.peaks[0]["training"] == replica.usage["actor"].peak
    kept = predict_memory(*_plan([*overrides, "actor.strategy=ddp", "inference.enable_offload=false"]))
    assert kept.peaks[0]["training"] == replica.usage["actor"].peak + replica.usage["inference"].resident
    # Weight sync loads the actor's tensors as they arrive: each receiver holds one bucket beside its weights.
    bucket = 4 * shape.embedding_parameters()  # the vocabulary matrix travels alone when larger than bucket_mb
    for name in ("rollout", "inference"):
        assert replica.usage[name].in_phase("sync_weights") == replica.usage[name].resident + bucket


def test_adapters_sent_alone_shrink_the_sync_and_the_inference_group_drops_its_reference(model_path):
    """actor.lora.sync = adapters: weight sync's buckets carry the adapters alone (on a sharded actor, too, what it
    gathers), the rollout engine and the inference group's policy copy hold them beside the weights, and the copy is
    the reference model too."""
    overrides = [
        "experiment=arithmetic_grpo",
        f"model.path={model_path}",
        "cluster.num_devices_per_node=2",
        "actor.strategy=fsdp",
        "algorithm.kl_coef=0.01",
        "actor.lora.rank=4",
    ]
    merged, alone = (predict_memory(*_plan([*overrides, f"actor.lora.sync={sync}"])) for sync in ("merged", "adapters"))
    shape = TransformerShape.from_config(json.loads((model_path / "config.json").read_text()))
    adapters = shape.lora_parameters(4, ["all-linear"])
    assert merged.usage["inference"].resident == 4 * shape.parameters()  # policy and reference, each halved
    assert alone.usage["inference"].resident == 2 * (shape.parameters() + adapters)
    assert merged.usage["rollout"].resident + 4 * adapters == alone.usage["rollout"].resident
    for name in ("rollout", "inference"):
        assert alone.usage[name].in_phase("sync_weights") == alone.usage[name].resident + 4 * adapters
    whole_model = 4 * shape.state_dict_parameters()  # the default bucket (64 MB) holds the whole tiny model
    assert merged.usage["rollout"].in_phase("sync_weights") == merged.usage["rollout"].resident + whole_model
    sharded = [run.usage["actor"] for run in (merged, alone)]  # a sharded actor gathers what it sends
    assert sharded[0].resident == sharded[1].resident
    assert sharded[0].in_phase("sync_weights") - sharded[1].in_phase("sync_weights") == whole_model - 4 * adapters


def test_a_critic_without_adapters_holds_the_state_of_every_weight(model_path):
    """actor.lora.critic = false: PPO's critic trains every weight of its backbone (12 bytes each between updates)
    where with adapters it holds them frozen (4 bytes each) beside its adapters' state."""
    overrides = [
        "experiment=arithmetic_grpo",
        f"model.path={model_path}",
        "algorithm=reasoning_ppo",
        "actor.lora.rank=4",
    ]
    adapted, whole = (
        predict_memory(*_plan([*overrides, f"actor.lora.critic={critic}"])).usage["actor"]
        for critic in ("true", "false")
    )
    shape = TransformerShape.from_config(json.loads((model_path / "config.json").read_text()))
    backbone = shape.parameters(head=False)
    assert whole.resident - adapted.resident == 8 * backbone - 12 * shape.lora_parameters(4, ["all-linear"])


def test_an_engine_split_over_ranks_holds_its_share_of_the_weights_and_keys_on_each(model_path):
    """rollout.tensor_parallel_size = 2: each rollout rank holds half the engine's weights and half its key/value
    heads (the tiny LM has 2), and in weight sync still takes whole buckets; with 4 ranks to an engine each still holds
    one key/value head (vLLM copies a head where there are fewer than ranks)."""
    overrides = [
        "experiment=arithmetic_grpo",
        f"model.path={model_path}",
        "rollout=vllm",
        "rollout.micro_batch_prompts=8",
    ]
    whole, halved = (
        predict_memory(*_plan([*overrides, f"rollout.tensor_parallel_size={size}"])).usage["rollout"] for size in (1, 2)
    )
    shape = TransformerShape.from_config(json.loads((model_path / "config.json").read_text()))
    assert shape.num_kv_heads == 2
    assert whole.resident == 4 * shape.parameters() == 2 * halved.resident
    kv_cache = whole.in_phase("generate_rollouts") - whole.resident
    assert halved.in_phase("generate_rollouts") - halved.resident == kv_cache / 2
    assert whole.in_phase("sync_weights") - whole.resident == halved.in_phase("sync_weights") - halved.resident
    four = ["cluster.num_devices_per_node=4", "rollout.tensor_parallel_size=4"]
    quarter = predict_memory(*_plan([*overrides, *four])).usage["rollout"]
    assert quarter.resident == whole.resident / 4
    assert quarter.in_phase("generate_rollouts") - quarter.resident == kv_cache / 2


def _plan(overrides: list[str], profile: Path | None = None):
    """The run's config and placement; with `profile`, read as `plan.profile` by the memory model alone (a
    synthetic profile holds what it reads, not what the step model needs)."""
    plan = resolve(compose_run(overrides))
    cfg = plan.cfg if profile is None else replace(plan.cfg, plan=replace(plan.cfg.plan, profile=str(profile)))
    return cfg, plan.placement


@pytest.mark.parametrize("command", ["rlplace.plan", "rlplace.train"])
def test_a_run_that_does_not_fit_is_refused_naming_device_phase_and_excess(model_path, tmp_path, command):
    args = ["experiment=arithmetic_grpo", f"model.path={model_path}", "cluster.device_memory_gb=0.001"]
    done = subprocess.run(
        [sys.executable, "-m", command, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "cluster.device_memory_gb = 0.001: device 0 needs" in line and "GB over" in line, line
    predicted = predict_memory(*_plan(args[:2])).peaks[0]
    assert f"in phase {max(predicted, key=predicted.get)} " in line  # the step's largest phase is named


def test_a_run_that_would_fit_with_more_offload_is_told_which_switches(model_path):
    """Every component on device 0 with nothing offloaded: over a capacity that the step fits once the idle groups
    leave, the refusal names the fewest offload switches that make it fit, and those do."""
    on_device_0 = [f"cluster.component_placement.{name}=0" for name in ("rollout", "reward", "inference", "actor")]
    args = ["experiment=arithmetic_grpo", f"model.path={model_path}", "placement=reasoning_disaggregated", *on_device_0]
    switches = [f"{name}.enable_offload=true" for name in ("actor", "rollout", "inference")]
    moving = predict_memory(*_plan([*args, *switches])).peaks[0]
    capacity = max(moving.values()) / 1e9 * 1.001
    with pytest.raises(ConfigError, match=r"GB over; .*\): it fits with (.*) \(") as refused:
        resolve(compose_run([*args, f"cluster.device_memory_gb={capacity}"]))
    suggested = str(refused.value).split("it fits with ")[1].split(" (")[0].split()
    assert suggested and set(suggested) <= set(switches)
    resolve(compose_run([*args, f"cluster.device_memory_gb={capacity}", *suggested]))  # fits: not refused


def test_a_rollout_engine_too_large_for_its_devices_is_told_to_split_over_its_ranks(model_path):
    """The rollout alone on devices 0 and 3, generating 256 responses a micro-batch (its KV cache the largest of any
    device's phases): over a capacity its engine fits split over its 2 ranks, the refusal says so, and it does."""
    args = [
        "experiment=arithmetic_grpo_disagg",
        f"model.path={model_path}",
        "rollout=vllm",
        'cluster.component_placement.rollout="0,3"',
        "task.prompts_per_step=32",
        "rollout.micro_batch_prompts=32",
        "algorithm.group_size=8",
        "rollout.max_new_tokens=64",
        "actor.max_tokens_per_micro_batch=80",  # a row a pass: the actor's device stays under the rollout's
    ]
    whole, split = (predict_memory(*_plan([*args, f"rollout.tensor_parallel_size={t}"])) for t in (1, 2))
    assert max(whole.peaks[0].values()) == whole.peak > split.peak
    capacity = split.peak / 1e9 * 1.001
    with pytest.raises(ConfigError, match=r"device 0 needs .* it fits with rollout.tensor_parallel_size=2 \("):
        resolve(compose_run([*args, f"cluster.device_memory_gb={capacity}"]))
    resolve(compose_run([*args, f"cluster.device_memory_gb={capacity}", "rollout.tensor_parallel_size=2"]))


def test_a_model_built_here_is_checked_once_built_before_any_worker_starts(model_path):
    """Without model.path the shape is unknown until the run builds its model (`reasoning.launch.start` then checks
    it): the config alone predicts nothing, and the folder built stands in for model.path."""
    args = ["experiment=arithmetic_grpo", "cluster.device_memory_gb=0.001"]
    cfg, placement = _plan(args)
    assert cfg.model.path is None and predict_memory(cfg, placement) is None
    source = make_prompt_source(cfg.task)
    with pytest.raises(ConfigError, match=r"^cluster.device_memory_gb = 0.001: device 0 needs .* GB over"):
        check_built_model_memory(cfg, model_path, placement, source)
    roomy = replace(cfg, cluster=replace(cfg.cluster, device_memory_gb=1.0))
    check_built_model_memory(roomy, model_path, placement, source)


def test_a_profile_that_measured_its_peaks_scales_the_prediction(model_path, tmp_path):
    """A profiled run on CUDA devices records each process's peak in its spans: the run's prediction is scaled per
    component and phase by measured over predicted, there and on any other placement (`rlplace.planner.spans`)."""
    overrides = ["experiment=arithmetic_grpo", f"model.path={model_path}", "cluster.num_devices_per_node=1"]
    plain = predict_memory(*_plan(overrides))
    actor_training = plain.usage["actor"].in_phase("training")
    profile = write_reasoning_profile(tmp_path / "run", _plan(overrides)[1], actor_peak=2 * actor_training)
    scaled = predict_memory(*_plan(overrides, profile))
    assert scaled.measured_from == str(profile)
    assert scaled.usage["actor"].in_phase("training") == 2 * actor_training
    assert scaled.usage["rollout"].in_phase("training") == plain.usage["rollout"].in_phase("training")  # not measured
    apart = [*overrides, "placement=reasoning_hybrid", "cluster.num_devices_per_node=2"]
    assert predict_memory(*_plan(apart, profile)).usage["actor"].in_phase("training") == (
        2 * predict_memory(*_plan(apart)).usage["actor"].in_phase("training")
    )
    cpu = write_reasoning_profile(tmp_path / "cpu", _plan(overrides)[1], actor_peak=None)  # no memory in its spans
    assert predict_memory(*_plan(overrides, cpu)).measured_from is None


def write_reasoning_profile(folder: Path, placement, actor_peak: int | None) -> Path:
    """A reasoning run's folder as a profiled run leaves it, with 3 steps whose training phase saw the actor's rank 0
    peak at `actor_peak` bytes (None: spans without memory, as on CPU devices)."""
    folder.mkdir(parents=True)
    data = {"family": "reasoning", "task": "arithmetic", "device_type": "gpu", "placement": placement.to_dict()}
    (folder / "profile.json").write_text(json.dumps({**data, "devices": {"0": []}, "config": {}}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "time/step": 1.0}) + "\n" for i in range(3)))
    memory = {} if actor_peak is None else {"peak_bytes": actor_peak, "resident_bytes": actor_peak // 2}
    events = []
    for step in range(3):
        start = step * 1e6
        events.append({"name": "step", "ph": "X", "ts": start, "dur": 1e6, "args": {"group": "driver", "rank": 0}})
        events.append(
            {"name": "training", "ph": "X", "ts": start + 5e5, "dur": 4e5, "args": {"group": "driver", "rank": 0}}
        )
        args = {"group": "actor", "rank": 0, "devices": [0], **memory}
        events.append({"name": "training", "ph": "X", "ts": start + 5.1e5, "dur": 3e5, "args": args})
    (folder / "timeline.json").write_text(json.dumps({"traceEvents": events}))
    return folder


def test_a_token_budget_bounds_what_an_inference_pass_holds(model_path):
    """inference.max_tokens_per_micro_batch: a scoring pass holds as many rows as fit the budget, so the inference
    device's peak while it scores falls with it (64 rows a pass without one)."""
    args = ["experiment=arithmetic_grpo_disagg", f"model.path={model_path}", "rollout.max_new_tokens=64"]
    cfg, placement = _plan(args)
    (device,) = placement.devices_of("inference")
    peaks = [
        predict_memory(*_plan([*args, *budget])).peaks[device]["generate_rollouts"]
        for budget in ([], ["inference.max_tokens_per_micro_batch=4096"], ["inference.max_tokens_per_micro_batch=1"])
    ]
    assert peaks[0] > peaks[1] > peaks[2]
