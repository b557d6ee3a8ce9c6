"""Launch a reasoning run on a cluster: the rollout, reward, inference and actor groups where the placement says,
all starting from the same model folder, then the loop. The reasoning counterpart of `embodied.launch`, as
`rlplace-train` runs it (the module is the family's `core.launcher.Launcher`).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from transformers import AutoConfig

from rlplace.core import checkpoint
from rlplace.core.launcher import RunContext
from rlplace.placement import ComponentPlacement, HybridComponentPlacement
from rlplace.reasoning.config import FAMILY, ReasoningConfig
from rlplace.reasoning.generation.backends import BACKENDS
from rlplace.reasoning.generation.turns import call_end_id
from rlplace.reasoning.interactions import feedback_template
from rlplace.reasoning.lora import IDENTITY as LORA_KEY
from rlplace.reasoning.lora import check_targets
from rlplace.reasoning.memory import check_memory
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.pretrain import pretrained_model_path
from rlplace.reasoning.rewards import check_remote_reward
from rlplace.reasoning.runner import ReasoningRunner
from rlplace.reasoning.tasks import count_truncated, drop_overlong, make_prompt_source, prompt_room
from rlplace.reasoning.tasks.prompts import PromptSource, check_prompt_lengths, uses_chat_template
from rlplace.reasoning.workers import InferenceWorker, LLMActorWorker, LLMRolloutWorker, RewardWorker
from rlplace.scheduler import Cluster, StartingGroup, wait_started

log = logging.getLogger(__name__)

MODEL_SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
"""The fields of a model folder's config.json that fix the shapes of its weights."""


class StartingRun(NamedTuple):
    """A run's starting groups, the placement they run in, and the model folder they all start from (`start`)."""

    model_path: Path
    placement: HybridComponentPlacement
    actor: StartingGroup
    inference: StartingGroup | None
    """None with runner.val_only, as `reward`: an evaluation generates and scores on the rollout ranks alone."""
    reward: StartingGroup | None
    rollout: StartingGroup
    device_cores: dict[int, list[int]]
    """Each device's CPU cores (`Cluster.cores_by_device`), for profile.json."""
    node_cores: dict[int, list[int]]
    """Each node's CPU cores (`Cluster.cores_by_node`), for profile.json."""


def start(cfg: ReasoningConfig, cluster: Cluster) -> StartingRun:
    """Find (or pretrain) the starting model, refuse prompts it cannot take and a reward server that does not answer,
    then start the groups without waiting for them (`runner` waits): their processes import torch and load the model
    side by side, while the driver goes on (it starts the logger).

    A rollout whose backend sizes its memory by what it finds free (vLLM) starts last on GPUs, once the others are
    up: other groups loading their models on the same device would change what it measures.
    """
    check_remote_reward(cfg.reward_name)  # before a pretraining, which scores with it
    model_path = pretrained_model_path(cfg)
    source = check_prompts_fit(cfg, model_path)
    check_targets(model_path, cfg.actor.lora)
    placement = HybridComponentPlacement(cfg, cluster)
    check_built_model_memory(cfg, model_path, placement, source)

    def start_group(worker: type, name: str, *args: object) -> StartingGroup:
        return worker.create_group(cfg, str(model_path), *args).start(
            cluster, name=name, placement_strategy=placement.get_strategy(name)
        )

    actor = start_group(LLMActorWorker, "actor")
    inference = reward = None
    if not cfg.runner.val_only:  # an evaluation uses neither: nothing to score log-probs of, the rollout verifies
        inference = start_group(InferenceWorker, "inference", placement.get_world_size("actor"))
        reward = start_group(RewardWorker, "reward", placement.get_world_size("inference"))
    if BACKENDS[cfg.rollout.backend].starts_last_on_gpu and cluster.device_type == "gpu":
        wait_started(*(group for group in (actor, inference, reward) if group is not None))
    rollout = start_group(LLMRolloutWorker, "rollout", placement.get_world_size("reward"))
    return StartingRun(
        model_path, placement, actor, inference, reward, rollout, cluster.cores_by_device(), cluster.cores_by_node()
    )


def check_built_model_memory(
    cfg: ReasoningConfig, model_path: Path, placement: ComponentPlacement, source: PromptSource
) -> None:
    """A model built here (no model.path) has a shape only once it is built: its predicted device memory is checked
    against cluster.device_memory_gb then, before any worker starts (a model.path's was checked with the config);
    `source`: the task's problems as the run will draw them (`check_prompts_fit`'s)."""
    if cfg.model.path is None and cfg.cluster.device_memory_gb is not None:
        check_memory(replace(cfg, model=replace(cfg.model, path=str(model_path))), placement, source)


def check_prompts_fit(cfg: ReasoningConfig, model_path: Path) -> PromptSource:
    """Refuse, before any worker starts, prompts too long for the model's context (`max_position_embeddings`, the
    engines' limit) with rollout.max_new_tokens on top (`check_prompt_lengths`); or, with
    task.filter_overlong_prompts, say how many of them the run leaves out (`drop_overlong`); with task.truncation,
    say how many are cut (`count_truncated`). A tool's call_end must be one token of the model's vocabulary, and an
    interaction's feedback turn one the chat template writes (`feedback_template`). Returns the task's problems,
    those left out removed."""
    context = AutoConfig.from_pretrained(model_path).max_position_embeddings
    tokenizer = load_tokenizer(model_path)
    multi_turn = cfg.rollout.multi_turn
    if multi_turn.tool is not None:
        call_end_id(tokenizer, multi_turn)  # the engines stop at it: one token of the vocabulary
    if multi_turn.interaction is not None:
        feedback_template(tokenizer, multi_turn.feedback_template, uses_chat_template(tokenizer, cfg.task))
    source = make_prompt_source(cfg.task)
    dropped = drop_overlong(source, cfg.task, tokenizer, context, cfg.rollout.max_new_tokens)
    if dropped is None:
        cut = check_prompt_lengths(cfg.task, source, tokenizer, context, cfg.rollout.max_new_tokens, str(model_path))
    else:
        room = prompt_room(cfg.task, context, cfg.rollout.max_new_tokens)
        log.info(
            f"rlplace: task.filter_overlong_prompts: {dropped[0]} training and {dropped[1]} held-out prompts are "
            f"longer than the {room} tokens a prompt may have (the model's context of {context} tokens less "
            f"rollout.max_new_tokens = {cfg.rollout.max_new_tokens}, task.max_prompt_length at most) and are left out"
        )
        cut = count_truncated(source, cfg.task, tokenizer)
    if cut is not None:
        log.info(
            f"rlplace: task.truncation = {cfg.task.truncation}: {cut[0]} training and {cut[1]} held-out prompts are "
            f"longer than task.max_prompt_length = {cfg.task.max_prompt_length} tokens and are cut to it"
        )
    return source


def runner(cfg: ReasoningConfig, starting: StartingRun, context: RunContext) -> ReasoningRunner:
    """Wait for the groups, and build the loop that drives them."""
    named = {
        "actor": starting.actor,
        "inference": starting.inference,
        "reward": starting.reward,
        "rollout": starting.rollout,
    }
    started = {name: group for name, group in named.items() if group is not None}  # val_only: actor and rollout
    groups = dict(zip(started, wait_started(*started.values()), strict=True))
    return ReasoningRunner(
        cfg,
        actor=groups["actor"],
        rollout=groups["rollout"],
        reward=groups.get("reward"),
        inference=groups.get("inference"),
        placement=starting.placement,
        identity=checkpoint_identity(cfg, starting.model_path),
        context=context,
        device_cores=starting.device_cores,
        node_cores=starting.node_cores,
    )


def checkpoint_identity(cfg: ReasoningConfig, model_path: Path) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it: the prompts per step (which prompts and sample
    ids each step draws), the algorithm (whether there is a critic to restore), the model's shapes (the saved
    weights must fit), its LoRA adapters (null without: checkpoints written before they existed have none; `critic:
    false` where PPO's critic trains every weight beside them) and the staleness K (the checkpoint holds the K steps'
    micro-batches generated ahead, cut into micro-batches of its rollout.micro_batch_prompts)."""
    model = json.loads((model_path / "config.json").read_text())
    identity = {
        "task.prompts_per_step": cfg.task.prompts_per_step,
        "algorithm.name": cfg.algorithm.name,
        **{f"the model's {key}": model.get(key) for key in MODEL_SHAPE_KEYS},
        LORA_KEY: cfg.actor.lora.identity(cfg.algorithm.has_critic) if cfg.actor.lora.enabled else None,
        "runner.max_staleness": cfg.runner.max_staleness,
    }
    if cfg.runner.max_staleness:
        identity["rollout.micro_batch_prompts"] = cfg.rollout.micro_batch_prompts
    return identity


def check_checkpoint(cfg: ReasoningConfig, folder: Path) -> None:
    """Refuse, before any worker starts, a checkpoint this run cannot continue exactly (ConfigError, one line); a tiny
    LM not cached yet is pretrained first, as the run would."""
    checkpoint.check_identity(folder, FAMILY, checkpoint_identity(cfg, pretrained_model_path(cfg)))


def run_labels(cfg: ReasoningConfig) -> dict[str, Any]:
    """What tells this run apart from others of a sweep besides its mode: its staleness K (no pipeline stages)."""
    return {"staleness": cfg.runner.max_staleness}


def summary(cfg: ReasoningConfig, mode: str, final: dict[str, float], run_dir: Path) -> tuple[str, float]:
    """The closing line, and the sweep objective (held-out accuracy after training, or of the starting policy with
    runner.val_only)."""
    if cfg.runner.val_only:
        best = "".join(f", {key[5:]} {value:.3f}" for key, value in final.items() if key.startswith("eval/best@"))
        accuracy = final["eval/accuracy"]
        return f"rlplace: evaluated: held-out accuracy {accuracy:.3f}{best}; outputs in {run_dir}", accuracy
    before, after = final.get("eval/accuracy_before"), final.get("eval/accuracy_after", math.nan)
    accuracy = f"{after:.3f}" if before is None else f"{before:.3f} -> {after:.3f}"
    line = (
        f"rlplace: done: {mode} placement, held-out accuracy {accuracy} after "
        f"{final['run/steps']:.0f} steps, {final['run/train_seconds']:.0f} s of training, "
        f"{final['run/tokens_per_s']:.0f} tokens/s; outputs (and final_model/) in {run_dir}"
    )
    return line, after
