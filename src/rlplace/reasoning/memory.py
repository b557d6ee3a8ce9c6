"""A reasoning run's device memory, predicted per device and phase (`rlplace.planner.memory`), and refused before
anything starts when it exceeds `cluster.device_memory_gb`.

Per rank, from the model folder's `config.json` and the run's sizes:
- actor: float32 weights and AdamW's two moments (12 bytes a parameter; with `actor.strategy = fsdp` 1/N of them per
  rank; with LoRA, 4 bytes a frozen parameter and 12 an adapter's), the critic's alike for ppo; training, the float32
  gradients of what trains too (freed when the update ends), one gathered unit in the compute precision and its
  unreduced gradient when sharded, and the activations of its largest training pass;
- rollout: the engine's weights in its precision (float32 for hf, bfloat16 for vLLM on a GPU) and the KV cache of a
  micro-batch's responses at full length, both split over `rollout.tensor_parallel_size` ranks; a vLLM engine on a
  GPU reserves `rollout.gpu_memory_utilization` of the device instead; in weight sync, one float32 bucket beside its
  weights;
- inference: its copy of the policy and, with a KL term, the reference model, in float32, held as the actor holds
  the policy (under fsdp 1/N of each per rank, plus one gathered unit in the compute precision during a pass), and a
  scoring pass's logits; in weight sync, one bucket beside them;
- with `actor.lora.sync: adapters`, weight sync's buckets carry the adapters alone, the engine and the policy copy
  hold them beside the weights, and the policy copy is the reference model too;
- reward: a reward model's weights, when there is one.
With `plan.profile` of a run on CUDA devices, whose spans carry each process's measured peak, every component's
prediction is scaled per phase by the profiled run's measured peak (rank 0's) over its own prediction: what the
model leaves out (allocator slack, kernels' workspaces) carries over to the placements it plans.
Pure Python (no torch): prompts are measured in tokens with the folder's `tokenizer.json` (`tokenizers`), or in
characters without one; a chat template's few tokens are not counted.
"""

from __future__ import annotations

import functools
import itertools
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from rlplace.core.errors import ConfigError
from rlplace.core.schedule import offloaded_during
from rlplace.placement import ComponentPlacement
from rlplace.planner import Profile, ProfileError
from rlplace.planner.memory import GB, TransformerShape, Usage, device_peaks, over_capacity
from rlplace.planner.profile import load_model
from rlplace.reasoning.config import FAMILY, OFFLOAD_SWITCHES, ReasoningConfig
from rlplace.reasoning.generation.backends import BACKENDS
from rlplace.reasoning.phases import PHASES
from rlplace.reasoning.streams import SCORING_ROWS
from rlplace.reasoning.tasks import make_prompt_source, prompt_room
from rlplace.reasoning.tasks.prompts import PromptSource

RANKED = ("actor", "inference")
"""The components whose bytes per rank depend on their rank count (sharded under actor.strategy = fsdp)."""
PROMPTS_MEASURED = 256
"""Training prompts whose longest sets the sequence length."""
_LONGEST: weakref.WeakKeyDictionary[PromptSource, dict[str, int]] = weakref.WeakKeyDictionary()
"""Each prompt source's longest prompt, by model folder."""
FP32, BF16 = 4, 2


@dataclass(frozen=True)
class MemoryPlan:
    """Predicted bytes per component rank and per device and phase."""

    usage: dict[str, Usage]
    peaks: dict[int, dict[str, int]]
    seq_len: int
    measured_from: str | None = None
    """The profile whose measured peaks scaled the prediction, if any."""

    @property
    def peak(self) -> int:
        """The busiest device's bytes in its busiest phase."""
        return max(bytes_ for phases in self.peaks.values() for bytes_ in phases.values())

    def to_dict(self) -> dict[str, object]:
        return {
            "seq_len": self.seq_len,
            "measured_from": self.measured_from,
            "components_gb": {n: {"resident": u.resident / GB, "peak": u.peak / GB} for n, u in self.usage.items()},
            "devices_gb": {d: {p: b / GB for p, b in phases.items()} for d, phases in self.peaks.items()},
        }


def predict_memory(
    cfg: ReasoningConfig, placement: ComponentPlacement, source: PromptSource | None = None
) -> MemoryPlan | None:
    """The run's predicted device memory; None when the model's shape is not known before it is built (a built
    model kind without model.path). With `plan.profile` of a run that measured its memory (CUDA devices), each
    component's prediction per phase is scaled by what that run measured over what was predicted for it."""
    config = model_config(cfg)
    if config is None:
        return None
    folder = Path(cfg.model.path)
    shape = TransformerShape.from_config(config)
    source = make_prompt_source(cfg.task) if source is None else source
    seq_len = _longest_prompt(source, folder) + cfg.rollout.max_new_tokens
    if getattr(cfg.task, "filter_overlong_prompts", False):  # the run leaves out the prompts that do not fit
        context = config.get("max_position_embeddings", seq_len)
        seq_len = min(seq_len, prompt_room(cfg.task, context, cfg.rollout.max_new_tokens) + cfg.rollout.max_new_tokens)
    usage = _usage(cfg, shape, seq_len, {name: placement.get_world_size(name) for name in RANKED})
    measured_from = None
    if cfg.plan.profile is not None:
        found = _measured(cfg.plan.profile, cfg.task.name)
        if found is not None:
            ranks, peaks = found
            profiled = _usage(cfg, shape, seq_len, ranks)
            usage = {name: _calibrated(name, use, profiled[name], peaks) for name, use in usage.items()}
            measured_from = str(cfg.plan.profile)
    devices = {name: frozenset(placement.devices_of(name)) for name in placement.components}
    peaks = device_peaks(PHASES, devices, offloaded_during(PHASES, devices, cfg.offloadable), usage)
    return MemoryPlan(usage, peaks, seq_len, measured_from)


def model_config(cfg: ReasoningConfig) -> dict | None:
    """The `config.json` of `model.path`; None for a built model kind without one (not built yet)."""
    if cfg.model.path is None:
        return None
    path = Path(cfg.model.path) / "config.json"
    return dict(_read_config(path, path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=16)
def _read_config(path: Path, mtime_ns: int) -> dict:
    """A config file, read once per version of it: a placement search asks for it for every candidate."""
    return json.loads(path.read_text())


def _usage(cfg: ReasoningConfig, shape: TransformerShape, seq_len: int, ranks: Mapping[str, int]) -> dict[str, Usage]:
    """Each component's predicted bytes per rank, with the actor and the inference group on `ranks` ranks."""
    on_gpu = cfg.cluster.device_type == "gpu"
    usage = {
        "actor": _actor(cfg, shape, ranks["actor"], seq_len),
        "rollout": _rollout(cfg, shape, seq_len, on_gpu),
        "inference": _inference(cfg, shape, ranks["inference"], seq_len),
    }
    if cfg.reward.model_path is not None:
        reward_shape = TransformerShape.from_config(
            json.loads((Path(cfg.reward.model_path) / "config.json").read_text())
        )
        weights = reward_shape.parameters(head=False) * (BF16 if on_gpu else FP32)
        usage["reward"] = Usage(weights)
    return usage


def _measured(folder: str, task: str) -> tuple[dict[str, int], dict[tuple[str, str], int]] | None:
    """The profiled run's actor and inference rank counts and each component's measured peak per phase (rank 0's);
    None when its spans carry no memory (a run on CPU devices). Read once per profile (a search predicts every
    candidate's memory from it); ConfigError naming `plan.profile` for one that cannot serve."""
    try:
        return load_model(_measured_peaks, folder, FAMILY, task)
    except ProfileError as err:
        raise ConfigError(str(err)) from None


def _measured_peaks(profile: Profile) -> tuple[dict[str, int], dict[tuple[str, str], int]] | None:
    peaks = profile.trace().phase_peaks([phase for phase, _ in PHASES])
    components = profile.data["placement"]["components"]
    return ({name: len(components[name]) for name in RANKED}, peaks) if peaks else None


def _calibrated(name: str, usage: Usage, profiled: Usage, measured: dict[tuple[str, str], int]) -> Usage:
    """`usage` scaled, phase by phase, by the profiled run's measured peak over its prediction; a phase it did not
    measure, and the resident bytes, by the mean of those ratios."""
    ratios = {
        phase: measured[name, phase] / profiled.in_phase(phase)
        for phase, _ in PHASES
        if (name, phase) in measured and profiled.in_phase(phase)
    }
    if not ratios:
        return usage
    mean = sum(ratios.values()) / len(ratios)
    working = {phase: round(usage.in_phase(phase) * ratios.get(phase, mean)) for phase, _ in PHASES}
    return Usage(round(usage.resident * mean), working)


def check_memory(cfg: ReasoningConfig, placement: ComponentPlacement, source: PromptSource) -> None:
    """Refuse a run whose predicted peak exceeds `cluster.device_memory_gb` on some device in some phase (`source`:
    the task's problems, read once by the caller)."""
    capacity = cfg.cluster.device_memory_gb
    plan = predict_memory(cfg, placement, source) if capacity is not None else None
    if plan is None:
        return
    over = over_capacity(plan.peaks, capacity)
    if over is not None:
        device, phase, excess = over
        need = plan.peaks[device][phase] / GB
        fitting = _fitting_changes(cfg, placement, source, capacity)
        if fitting is None:
            remedy = (
                "place fewer components there, offload them (placement presets' enable_offload), shard the actor "
                "and inference groups (actor.strategy=fsdp), or split the rollout engine over more ranks "
                "(rollout.tensor_parallel_size with rollout=vllm)"
            )
        else:
            remedy = f"it fits with {fitting[0]} ({fitting[1]:.3g} GB at its peak)"
        raise ConfigError(
            f"cluster.device_memory_gb = {capacity}: device {device} needs {need:.3g} GB in phase {phase} "
            f"({excess:.3g} GB over; `rlplace-plan` shows each component's share): {remedy}"
        )


def _fitting_changes(
    cfg: ReasoningConfig, placement: ComponentPlacement, source: PromptSource, capacity: float
) -> tuple[str, float] | None:
    """The fewest changes that make the run fit, as overrides, with the peak they leave (GB); None when none do: the
    offload switches the run leaves off, fewest first; then, with a backend that splits its engine, the rollout's
    engine split over more of its ranks (each a divisor of its ranks and of the model's attention heads), alone and
    with those switches."""
    off = [name for name in OFFLOAD_SWITCHES if not getattr(cfg, name).enable_offload]
    switch_sets = [names for count in range(len(off) + 1) for names in itertools.combinations(off, count)]
    rollout = cfg.rollout
    for split in engine_splits(cfg, placement.get_world_size("rollout")):
        split_cfg = replace(cfg, rollout=replace(rollout, tensor_parallel_size=split))
        for names in switch_sets:
            if not names and split == rollout.tensor_parallel_size:
                continue  # the run as it is
            plan = predict_memory(split_cfg.with_offload(dict.fromkeys(names, True)), placement, source)
            if plan is not None and over_capacity(plan.peaks, capacity) is None:
                changes = [f"{name}.enable_offload=true" for name in names]
                if split != rollout.tensor_parallel_size:
                    changes.insert(0, f"rollout.tensor_parallel_size={split}")
                return " ".join(changes), plan.peak / GB
    return None


def engine_splits(cfg: ReasoningConfig, ranks: int) -> list[int]:
    """The rollout engine splits a run could take on `ranks` rollout ranks, smallest first: its own
    (`rollout.tensor_parallel_size`), then, with a backend that splits its engine and the model's shape known, each
    larger divisor of the ranks and of the model's attention heads."""
    rollout = cfg.rollout
    splits = [rollout.tensor_parallel_size]
    config = model_config(cfg)
    if BACKENDS[rollout.backend].tensor_parallel and config is not None:
        heads = TransformerShape.from_config(config).num_heads
        splits += [t for t in range(rollout.tensor_parallel_size + 1, ranks + 1) if not ranks % t and not heads % t]
    return splits


def _sharded(cfg: ReasoningConfig, ranks: int) -> bool:
    """Whether `ranks` ranks hold the policy sharded, under `actor.strategy`."""
    return cfg.actor.strategy_for(ranks, cfg.cluster.device_type == "gpu") == "fsdp"


def _adapters(cfg: ReasoningConfig, shape: TransformerShape) -> int | None:
    """The policy's LoRA parameters, None without adapters."""
    lora = cfg.actor.lora
    return shape.lora_parameters(lora.rank, lora.target_modules) if lora.enabled else None


def _sent(cfg: ReasoningConfig, shape: TransformerShape) -> int | None:
    """The parameters weight sync sends where it sends the adapters alone (`actor.lora.sync: adapters`), else None:
    the whole model."""
    return _adapters(cfg, shape) if cfg.actor.lora.sends_adapters else None


def _actor(cfg: ReasoningConfig, shape: TransformerShape, ranks: int, seq_len: int) -> Usage:
    sharded = _sharded(cfg, ranks)
    compute = BF16 if cfg.actor.dtype == "bf16" else FP32
    adapters = _adapters(cfg, shape)
    models = [(True, adapters)]  # the policy, and the critic (without an LM head; its value head is a rounding error)
    if cfg.algorithm.has_critic:
        models.append((False, adapters if cfg.actor.lora.critic else None))
    resident = sum(shape.state_bytes(ranks if sharded else 1, head, trained) for head, trained in models)
    state = sum(shape.training_state_bytes(ranks, sharded, compute, head, trained) for head, trained in models)
    rows = cfg.task.prompts_per_step * cfg.algorithm.group_size // ranks // cfg.algorithm.num_minibatches
    budget = cfg.actor.max_tokens_per_micro_batch
    if budget is not None:  # a pass holds as many rows of its width as fit, one at least
        rows = max(1, min(rows, budget // seq_len))
    activations = shape.activation_bytes(max(rows, 1), seq_len, cfg.actor.gradient_checkpointing, compute)
    working = {"training": state + activations}
    if sharded and ranks > 1:  # weight sync gathers one bucket of what it sends at a time
        working["sync_weights"] = resident + shape.bucket_bytes(cfg.weight_sync.bucket_mb, _sent(cfg, shape))
    return Usage(resident, working)


def _rollout(cfg: ReasoningConfig, shape: TransformerShape, seq_len: int, on_gpu: bool) -> Usage:
    """The hf engine keeps the policy in float32 (it samples what the actor scores); vLLM in the model's bfloat16.
    An engine split over `rollout.tensor_parallel_size` ranks holds that share of the weights on each, and of the
    key/value heads (one head each where there are fewer heads than ranks: vLLM copies them). Weight sync loads the
    actor's float32 tensors bucket by bucket as they arrive (`core.weights.received_tensors`), whole on every rank;
    an engine that applies the adapters (`actor.lora.sync: adapters`) holds them beside the weights and receives
    them alone."""
    dtype = BF16 if on_gpu and cfg.rollout.backend == "vllm" else FP32
    split = cfg.rollout.tensor_parallel_size
    sent = _sent(cfg, shape)
    weights = -(-(shape.parameters() + (sent or 0)) * dtype // split)
    rows = cfg.rollout.micro_batch_prompts * cfg.algorithm.group_size
    kv_heads = max(shape.num_kv_heads // split, 1)
    working = weights + shape.kv_cache_bytes(rows * seq_len, dtype) * kv_heads // shape.num_kv_heads
    if on_gpu and cfg.rollout.backend == "vllm" and cfg.cluster.device_memory_gb is not None:
        working = max(working, int(cfg.rollout.gpu_memory_utilization * cfg.cluster.device_memory_gb * GB))
    received = weights + shape.bucket_bytes(cfg.weight_sync.bucket_mb, sent)
    return Usage(weights, {"sync_weights": received, "generate_rollouts": working})


def _inference(cfg: ReasoningConfig, shape: TransformerShape, ranks: int, seq_len: int) -> Usage:
    """The policy (and the reference model) in float32, each whole or, sharded, 1/`ranks` of it with one unit gathered
    in the compute precision during a pass; weight sync copies one bucket at a time into the policy. A policy copy
    that applies the adapters (`actor.lora.sync: adapters`) holds them too, and is the reference model as well."""
    sent = _sent(cfg, shape)
    copies = 2 if cfg.algorithm.kl_coef > 0 and sent is None else 1
    sharded = _sharded(cfg, ranks)
    weights = copies * shape.frozen_bytes(ranks, sharded, sent or 0)
    gathered = shape.largest_unit() * (BF16 if cfg.actor.dtype == "bf16" else FP32) if sharded else 0
    rows = min(SCORING_ROWS, cfg.rollout.micro_batch_prompts * cfg.algorithm.group_size)  # `response_logprobs`' pass
    budget = cfg.inference.max_tokens_per_micro_batch
    if budget is not None:  # a pass holds as many rows of its width as fit, one at least (`batch.scoring_passes`)
        rows = max(1, min(rows, budget // seq_len))
    scoring = weights + gathered + shape.scoring_bytes(rows, seq_len)
    received = weights + shape.bucket_bytes(cfg.weight_sync.bucket_mb, sent)
    working = {"sync_weights": received, "generate_rollouts": scoring}
    return Usage(weights, working)


def _longest_prompt(source: PromptSource, folder: Path) -> int:
    """The longest of the first training prompts, in the folder's tokens; measured once per source and folder: a
    search predicts every candidate's memory from one source."""
    try:
        known = _LONGEST.setdefault(source, {})
    except TypeError:  # a source that cannot be a key (an unfrozen dataclass): measured each time
        known = {}
    if str(folder) not in known:
        known[str(folder)] = _measure_longest(source, folder)
    return known[str(folder)]


def _measure_longest(source: PromptSource, folder: Path) -> int:
    prompts = [problem.prompt for problem in source.train_batch(0, PROMPTS_MEASURED)]
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.exists():
        return max(len(prompt) for prompt in prompts)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    return max(len(encoding.ids) for encoding in tokenizer.encode_batch(prompts))
