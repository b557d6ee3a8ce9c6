"""`rlplace-train`: the Hydra entry point. Compose -> typed config -> placement -> runner.

A config or placement that cannot run is refused here, with one line naming the key and value and exit code 2,
before Ray or any worker starts. The return value is the sweep metric (env steps/s) for Hydra's sweepers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlplace.config import ConfigError, register
from rlplace.metrics import MetricLogger, build_logger, summarize
from rlplace.placement import HybridComponentPlacement, ModelParallelComponentPlacement, PlacementError
from rlplace.plan import CONF_DIR, Plan, fail, resolve
from rlplace.pretrain import pretrained_model_path
from rlplace.runners.embodied import EmbodiedRunner
from rlplace.runners.reasoning import ReasoningRunner
from rlplace.scheduler import Cluster, WorkerGroup
from rlplace.workers import (
    ActorWorker,
    EnvWorker,
    InferenceWorker,
    LLMActorWorker,
    LLMRolloutWorker,
    RewardWorker,
    RolloutWorker,
)

register()

RUN_INFO = "run.json"
"""What the sweep report needs to label a run: its mode, pipeline stages and device budget."""
WARMUP_STEPS = 2
"""Steps left out of the summary's medians: the first steps pay for process start-up and lazy set-up."""


def train(plan: Plan, run_dir: Path, resolved_config: dict) -> dict[str, float]:
    """Start the cluster, launch the task's worker groups where the placement says, and run the loop."""
    cfg = plan.cfg
    model_path = str(pretrained_model_path(cfg)) if cfg.task.is_reasoning else None
    wandb = cfg.logger.wandb
    logger = build_logger(
        cfg.logger.backend,
        run_dir,
        config=resolved_config,
        project=wandb.project,
        name=f"{plan.placement.mode}-stages{cfg.rollout.pipeline_stage_num}-{run_dir.name}",
        group=wandb.group,
        tags=[*wandb.tags, plan.placement.mode, f"stages{cfg.rollout.pipeline_stage_num}"],
        mode=wandb.mode,
    )
    history: list[dict[str, float]] = []
    run_info = {
        "mode": plan.placement.mode,
        "stages": cfg.rollout.pipeline_stage_num,
        "num_devices": plan.placement.num_devices,
    }
    (run_dir / RUN_INFO).write_text(json.dumps(run_info))
    try:
        with Cluster(cfg.cluster) as cluster:
            if model_path is not None:
                final = run_reasoning(plan, cluster, model_path, run_dir, logger, history)
            else:
                final = run_embodied(plan, cluster, run_dir, logger, history)
        summary = summarize(history, WARMUP_STEPS)
        logger.log_summary({**summary, **{k: v for k, v in final.items() if k.startswith(("final/", "eval/"))}})
    finally:
        logger.close()
    return final


def run_embodied(
    plan: Plan, cluster: Cluster, run_dir: Path, logger: MetricLogger, history: list[dict[str, float]]
) -> dict[str, float]:
    """The env, rollout and actor groups and the embodied loop."""
    cfg = plan.cfg
    placement = HybridComponentPlacement(cfg, cluster)
    channels = EmbodiedRunner.create_channels()
    env = EnvWorker.create_group(cfg).launch(cluster, name="env", placement_strategy=placement.get_strategy("env"))
    rollout = RolloutWorker.create_group(cfg, env.world_size, placement.get_world_size("actor")).launch(
        cluster, name="rollout", placement_strategy=placement.get_strategy("rollout")
    )
    actor = ActorWorker.create_group(cfg, env.world_size * cfg.rollout.pipeline_stage_num).launch(
        cluster, name="actor", placement_strategy=placement.get_strategy("actor")
    )
    runner = EmbodiedRunner(
        cfg, actor=actor, rollout=rollout, env=env, placement=placement, run_dir=run_dir, logger=logger, history=history
    )
    runner.init_workers()
    try:
        final = runner.run()
    finally:
        for channel in channels:  # named actors: free the names for the next run in this Ray
            channel.close()
    final["final/return_last20"] = final.get("env/return_last20", math.nan)
    return final


def run_reasoning(
    plan: Plan,
    cluster: Cluster,
    model_path: str,
    run_dir: Path,
    logger: MetricLogger,
    history: list[dict[str, float]],
) -> dict[str, float]:
    """The rollout, reward, inference and actor groups and the reasoning loop, all starting from `model_path`."""
    cfg = plan.cfg
    placement = ModelParallelComponentPlacement(cfg, cluster)
    channels = ReasoningRunner.create_channels()

    def launch(worker: type, name: str, *args: object) -> WorkerGroup:
        return worker.create_group(cfg, model_path, *args).launch(
            cluster, name=name, placement_strategy=placement.get_strategy(name)
        )

    actor = launch(LLMActorWorker, "actor")
    inference = launch(InferenceWorker, "inference", actor.world_size)
    reward = launch(RewardWorker, "reward", inference.world_size)
    rollout = launch(LLMRolloutWorker, "rollout", reward.world_size)
    runner = ReasoningRunner(
        cfg,
        actor=actor,
        rollout=rollout,
        reward=reward,
        inference=inference,
        placement=placement,
        run_dir=run_dir,
        logger=logger,
        history=history,
    )
    runner.init_workers()
    try:
        return runner.run()
    finally:
        for channel in channels:
            channel.close()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        plan = resolve(cfg)
    except (ConfigError, PlacementError) as err:
        if hydra_cfg.mode == RunMode.MULTIRUN:
            # One combination of a sweep that this cluster cannot hold: skip it, keep sweeping.
            print(f"rlplace: skipping job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)}): {err}")
            (run_dir / "skipped.txt").write_text(f"{err}\n")
            return None
        fail(str(err))
    final = train(plan, run_dir, OmegaConf.to_container(cfg, resolve=True))
    if plan.cfg.task.is_reasoning:
        print(
            f"rlplace: done: {plan.placement.mode} placement, held-out accuracy "
            f"{final['eval/accuracy_before']:.3f} -> {final['eval/accuracy_after']:.3f} after "
            f"{plan.cfg.runner.max_steps} steps, {final['run/train_seconds']:.0f} s of training, "
            f"{final['run/tokens_per_s']:.0f} tokens/s; outputs (and final_model/) in {run_dir}"
        )
        return final["eval/accuracy_after"]
    rate = final.get("run/env_steps_per_s", math.nan)
    print(
        f"rlplace: done: {plan.placement.mode} placement, mean return of the last 20 episodes "
        f"{final.get('env/return_last20', math.nan):.1f} after {final.get('env/total_steps', 0):.0f} env steps, "
        f"{rate:.0f} env steps/s over the run; outputs in {run_dir}"
    )
    return rate


if __name__ == "__main__":
    main()
