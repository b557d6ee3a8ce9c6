"""Launch an embodied run on a cluster: the env, rollout and actor groups where the placement says, then the loop.

This is the whole user-facing flow (`Cluster` -> placement -> `create_group(...).start(...)` for each group ->
`wait_started` -> runner), as `rlplace-train` runs it for an embodied task: `start`, then `runner` (the module is the
family's `core.launcher.Launcher`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

from rlplace.core import checkpoint
from rlplace.core.launcher import RunContext
from rlplace.embodied.config import FAMILY, EmbodiedConfig
from rlplace.embodied.runner import EmbodiedRunner
from rlplace.embodied.workers import ActorWorker, EnvWorker, RolloutWorker
from rlplace.placement import HybridComponentPlacement
from rlplace.scheduler import Cluster, StartingGroup, WorkerGroupSpec, wait_started


class StartingRun(NamedTuple):
    """The groups of a run whose processes are starting, and the placement they start in (from `start`)."""

    placement: HybridComponentPlacement
    env: StartingGroup
    rollout: StartingGroup
    actor: StartingGroup
    device_cores: dict[int, list[int]]
    """Each device's CPU cores (`Cluster.cores_by_device`), for profile.json."""
    node_cores: dict[int, list[int]]
    """Each node's CPU cores (`Cluster.cores_by_node`), for profile.json."""


def start(cfg: EmbodiedConfig, cluster: Cluster) -> StartingRun:
    """Start the env, rollout and actor groups together, without waiting for them (`runner` waits): their processes
    import torch and build their models side by side, while the driver goes on (it starts the logger)."""
    placement = HybridComponentPlacement(cfg, cluster)
    env_world_size = placement.get_world_size("env")

    def start_group(group: WorkerGroupSpec, name: str) -> StartingGroup:
        return group.start(cluster, name=name, placement_strategy=placement.get_strategy(name))

    return StartingRun(
        placement,
        env=start_group(EnvWorker.create_group(cfg), "env"),
        rollout=start_group(
            RolloutWorker.create_group(cfg, env_world_size, placement.get_world_size("actor")), "rollout"
        ),
        actor=start_group(ActorWorker.create_group(cfg, env_world_size), "actor"),
        device_cores=cluster.cores_by_device(),
        node_cores=cluster.cores_by_node(),
    )


def runner(cfg: EmbodiedConfig, starting: StartingRun, context: RunContext) -> EmbodiedRunner:
    """Wait for the groups, and build the loop that drives them."""
    env, rollout, actor = wait_started(starting.env, starting.rollout, starting.actor)
    return EmbodiedRunner(
        cfg,
        actor=actor,
        rollout=rollout,
        env=env,
        placement=starting.placement,
        identity=checkpoint_identity(cfg),
        context=context,
        device_cores=starting.device_cores,
        node_cores=starting.node_cores,
    )


def checkpoint_identity(cfg: EmbodiedConfig) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it: the number of stored sub-envs, the simulator and
    time limit pickled with each, what is normalised (whose statistics each carries), and the shapes of the weights.
    Not the placement: sub-envs are stored by global env index, so any split of envs over env processes and stages
    takes them back."""
    return {
        "task.total_num_envs": cfg.task.total_num_envs,
        "task.env_id": cfg.task.env_id,
        "task.max_episode_steps": cfg.task.max_episode_steps,
        # Whose statistics the sub-envs carry; None when off, as checkpoints from before these keys read.
        "task.normalize_observation": cfg.task.normalize_observation or None,
        "task.normalize_reward": cfg.task.normalize_reward or None,
        "model.hidden_sizes": cfg.model.hidden_sizes,
        "runner.max_staleness": cfg.runner.max_staleness,  # a checkpoint holds the K batches generated ahead
    }


def check_checkpoint(cfg: EmbodiedConfig, folder: Path) -> None:
    """Refuse, before any worker starts, a checkpoint this run cannot continue exactly (ConfigError, one line)."""
    checkpoint.check_identity(folder, FAMILY, checkpoint_identity(cfg))


def run_labels(cfg: EmbodiedConfig) -> dict[str, Any]:
    """What tells this run apart from others of a sweep besides its mode (run.json, wandb tags)."""
    return {"stages": cfg.rollout.pipeline_stage_num, "staleness": cfg.runner.max_staleness}


def summary(cfg: EmbodiedConfig, mode: str, final: dict[str, float], run_dir: Path) -> tuple[str, float]:
    """The closing line, and the sweep objective (env steps/s over the run)."""
    rate = final.get("run/env_steps_per_s", math.nan)
    line = (
        f"rlplace: done: {mode} placement, mean return of the last 20 episodes "
        f"{final.get('env/return_last20', math.nan):.1f} after {final.get('env/total_steps', 0):.0f} env steps, "
        f"{rate:.0f} env steps/s over the run; outputs in {run_dir}"
    )
    return line, rate
