"""What an embodied run needs of its config beyond each field's own checks, refused before any worker starts.

Kept apart from the runner so that `rlplace-plan` runs them without importing Ray or torch: a run that cannot
work fails in a second with the key and value named.
"""

from __future__ import annotations

from rlplace.core.errors import ConfigError
from rlplace.embodied.config import EmbodiedConfig
from rlplace.embodied.envs.registry import env_spec
from rlplace.placement import ComponentPlacement


def check_embodied(cfg: EmbodiedConfig, placement: ComponentPlacement) -> None:
    """The env id is a gymnasium environment whose spaces a policy can take (one env made to read them); sub-envs
    divide over env processes, stages and actor ranks; no held-out evaluation is asked of it."""
    if cfg.runner.val_only:
        raise ConfigError("runner.val_only = True is invalid: false for embodied tasks (they have no held-out split)")
    try:
        env_spec(cfg.task.env_id)
    except ValueError as err:
        raise ConfigError(f"task.env_id = {cfg.task.env_id!r}: {err}") from None
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
