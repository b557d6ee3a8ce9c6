"""What a reasoning run needs of its config beyond each field's own checks, refused before any worker starts.

Kept apart from the runner so that `rlplace-plan` runs them without importing Ray, torch or transformers.
"""

from __future__ import annotations

import importlib.util

from rlplace.core.errors import ConfigError
from rlplace.placement import ComponentPlacement
from rlplace.planner.memory import TransformerShape
from rlplace.reasoning.config import ReasoningConfig
from rlplace.reasoning.generation.backends import BACKENDS
from rlplace.reasoning.memory import check_memory, model_config
from rlplace.reasoning.models.hf_folder import check_model_folder, check_reward_model_folder
from rlplace.reasoning.tasks import make_prompt_source
from rlplace.reasoning.tasks.prompts import PromptSource


def check_reasoning(cfg: ReasoningConfig, placement: ComponentPlacement) -> None:
    """Micro-batches divide the prompts; the task's problems can be made (its data files read and checked); the
    model folder, the reward model's (a classifier with one output) and what the backend requires exist when asked
    for; a split rollout engine can be split (`check_tensor_parallel`); and what the placement decides holds
    (`check_placement`)."""
    task, rollout = cfg.task, cfg.rollout
    if task.prompts_per_step % rollout.micro_batch_prompts:
        raise ConfigError(
            f"rollout.micro_batch_prompts = {rollout.micro_batch_prompts} must divide task.prompts_per_step = "
            f"{task.prompts_per_step}"
        )
    if cfg.reward.overlong_buffer > rollout.max_new_tokens:
        raise ConfigError(
            f"reward.overlong_buffer = {cfg.reward.overlong_buffer} is invalid: at most rollout.max_new_tokens = "
            f"{rollout.max_new_tokens} (the buffer is the last tokens before a response is cut off), or 0 (off)"
        )
    source = make_prompt_source(task)  # the task's data read and checked here, before any worker reads it
    if cfg.model.path is not None:
        check_model_folder(cfg.model.path)
    if cfg.reward.model_path is not None:
        check_reward_model_folder(cfg.reward.model_path)
        if cfg.algorithm.filter_groups:
            raise ConfigError(
                "algorithm.filter_groups = true is invalid with reward.model_path: groups are filtered by the rule "
                "reward where they are generated, before the reward model scores them (valid: false)"
            )
    check_tensor_parallel(cfg)
    check_placement(cfg, placement, source)
    backend = BACKENDS[rollout.backend]
    lora = cfg.actor.lora
    if lora.sends_adapters and backend.max_adapter_rank is not None and lora.rank > backend.max_adapter_rank:
        raise ConfigError(
            f"actor.lora.rank = {lora.rank} is invalid with actor.lora.sync = adapters: the {rollout.backend} "
            f"backend applies adapters of rank {backend.max_adapter_rank} at most (valid: that or less, or "
            "actor.lora.sync = merged)"
        )
    if backend.requires is not None and importlib.util.find_spec(backend.requires) is None:
        usable = [name for name in BACKENDS if BACKENDS[name].requires is None]
        raise ConfigError(
            f"rollout.backend = {rollout.backend!r} is invalid here: {backend.requires} is not installed "
            f"({backend.install}; valid without it: {', '.join(usable)})"
        )


def check_tensor_parallel(cfg: ReasoningConfig) -> None:
    """A rollout engine split over several ranks needs a backend that splits one and, where the model folder is
    known, as many ranks as divide its attention heads (each rank computes whole heads)."""
    rollout = cfg.rollout
    size = rollout.tensor_parallel_size
    if size == 1:
        return
    if not BACKENDS[rollout.backend].tensor_parallel:
        splitting = [name for name in BACKENDS if BACKENDS[name].tensor_parallel]
        raise ConfigError(
            f"rollout.tensor_parallel_size = {size} is invalid with rollout.backend = {rollout.backend!r}, which "
            f"holds the whole model on each rank (valid: 1, or rollout.backend={' or '.join(splitting)})"
        )
    config = model_config(cfg)
    if config is not None:
        heads = TransformerShape.from_config(config).num_heads
        if heads % size:
            raise ConfigError(
                f"rollout.tensor_parallel_size = {size} is invalid: it must divide the model's {heads} attention "
                f"heads (model.path = {cfg.model.path})"
            )


def check_placement(cfg: ReasoningConfig, placement: ComponentPlacement, source: PromptSource) -> None:
    """What the placement decides: the micro-batches divide over the actor ranks, each rank has enough responses
    for its minibatches, the rollout ranks form whole engine replicas, and the predicted device memory fits
    cluster.device_memory_gb (`source`: the task's problems, made once by the caller; the planner's search asks this
    of every candidate)."""
    task, rollout = cfg.task, cfg.rollout
    num_micro_batches = task.prompts_per_step // rollout.micro_batch_prompts
    actors = placement.get_world_size("actor")
    if num_micro_batches % actors:
        raise ConfigError(
            f"rollout.micro_batch_prompts = {rollout.micro_batch_prompts} gives {num_micro_batches} micro-batch(es) "
            f"per step (task.prompts_per_step = {task.prompts_per_step}), which do not divide evenly over the "
            f"{actors} actor processes (data-parallel ranks each train on whole micro-batches)"
        )
    rows = task.prompts_per_step * cfg.algorithm.group_size // actors
    if rows < cfg.algorithm.num_minibatches:
        raise ConfigError(
            f"algorithm.num_minibatches = {cfg.algorithm.num_minibatches} is more than each actor's {rows} responses "
            f"(task.prompts_per_step x algorithm.group_size / actor processes)"
        )
    rollouts, size = placement.get_world_size("rollout"), rollout.tensor_parallel_size
    if rollouts % size:
        raise ConfigError(
            f"rollout.tensor_parallel_size = {size} must divide the {rollouts} rollout process(es) of the placement "
            "(each engine replica is that many rollout ranks)"
        )
    check_memory(cfg, placement, source)
