"""`rlplace-train`: the Hydra entry point. Compose -> typed config -> placement -> the family's launcher.

A config or placement that cannot run is refused here, with one line naming the key and value and exit code 2,
before Ray or any worker starts. The return value is the sweep objective (env steps/s for embodied runs, held-out
accuracy for reasoning runs) for Hydra's sweepers.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlplace.cli import fail
from rlplace.core.config import CONF_DIR
from rlplace.core.errors import ConfigError
from rlplace.families import Plan, register, resolve
from rlplace.metrics import build_logger, summarize
from rlplace.placement import PlacementError
from rlplace.scheduler import Cluster

register()

RUN_INFO = "run.json"
"""What the sweep report needs to label a run: its mode, device budget, and the family's labels (stages)."""


def train(plan: Plan, run_dir: Path, resolved_config: dict) -> dict[str, float]:
    """Start the cluster and run the family's launcher; log every step and a summary."""
    cfg, mode, launcher = plan.cfg, plan.placement.mode, plan.launcher
    labels = launcher.run_labels(cfg)
    tags = [f"{key}{value}" for key, value in labels.items()]
    wandb = cfg.logger.wandb
    logger = build_logger(
        cfg.logger.backend,
        run_dir,
        config=resolved_config,
        project=wandb.project,
        name="-".join([mode, *tags, run_dir.name]),
        group=wandb.group,
        tags=[*wandb.tags, plan.family.name, mode, *tags],
        mode=wandb.mode,
    )
    history: list[dict[str, float]] = []
    run_info = {"mode": mode, "num_devices": plan.placement.num_devices, **labels}
    (run_dir / RUN_INFO).write_text(json.dumps(run_info))
    try:
        with Cluster(cfg.cluster) as cluster:
            final = launcher.train(cfg, cluster, run_dir, logger, history)
        summary = summarize(history)
        logger.log_summary({**summary, **{k: v for k, v in final.items() if k.startswith(("final/", "eval/"))}})
    finally:
        logger.close()
    return final


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
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
    line, objective = plan.launcher.summary(plan.cfg, plan.placement.mode, final, run_dir)
    print(line)
    return objective


if __name__ == "__main__":
    main()
