"""EmbodiedRunner: the training loop of an embodied task, identical in every placement mode.

Each step:
  1. update_rollout_weights      actor rank 0 -> every rollout rank (bucketed broadcast, versioned)
  2. generate_rollouts           env.interact, rollout.generate and actor.recv_rollout_batch run together,
                                 exchanging observations and actions through two channels, stage by stage
  3. compute_advantages_and_returns   on the actor ranks (GAE or group-normalised)
  4. run_training                PPO, data-parallel over actor ranks
  5. record                      time/*, throughput/*, util/*, train/*, env/* -> metrics.jsonl and the logger
Components that share devices with the phase's workers offload before it and onload after, when enabled.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

from rlplace import checkpoint
from rlplace.config import TrainConfig
from rlplace.envs import EpisodeStats
from rlplace.metrics import MetricLogger, PhaseTimer, Timeline, TrainingProgress, throughput_metrics
from rlplace.placement import ComponentPlacement
from rlplace.scheduler import Channel, WorkerGroup, wait_all
from rlplace.workers.streams import ACTION_CHANNEL, OBS_CHANNEL, TRAJECTORY_CHANNEL

RETURN_WINDOW = 20
"""`env/return_last20`: the mean return of the last this many finished episodes (CartPole is solved at 475)."""


class EmbodiedRunner:
    """Drives the env, rollout and actor groups through training steps; owns metrics, timeline and checkpoints."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        actor: WorkerGroup,
        rollout: WorkerGroup,
        env: WorkerGroup,
        placement: ComponentPlacement,
        run_dir: Path,
        logger: MetricLogger,
        history: list[dict[str, float]] | None = None,
    ) -> None:
        self.cfg, self.actor, self.rollout, self.env = cfg, actor, rollout, env
        self.placement, self.run_dir, self.logger = placement, run_dir, logger
        self.history = [] if history is None else history
        self.timer = PhaseTimer()
        self.timeline = Timeline(
            {(name, p.rank): p.devices for name in ("actor", "rollout", "env") for p in placement.get_placements(name)},
            num_devices=placement.num_devices,
        )
        self.offloads = self._offload_plan()
        self.start_step = 0
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.total_env_steps = 0
        self.checkpoint_root = run_dir / "checkpoints"

    @staticmethod
    def create_channels() -> list[Channel]:
        """The three queues of generation; created before the workers, which connect to them by name.

        Each env stream has at most one message in flight each way, so a small bound is plenty and catches a
        runaway producer.
        """
        return [
            Channel.create(OBS_CHANNEL, maxsize=2),
            Channel.create(ACTION_CHANNEL, maxsize=2),
            Channel.create(TRAJECTORY_CHANNEL, maxsize=0),
        ]

    def _offload_plan(self) -> dict[str, bool]:
        """Offload a component while idle only when enabled and when it shares a device with the busy ones."""
        devices = {name: set(self.placement.devices_of(name)) for name in ("actor", "rollout", "env")}
        generating = devices["env"] | devices["rollout"]
        return {
            "actor": self.cfg.actor.enable_offload and bool(devices["actor"] & generating),
            "rollout": self.cfg.rollout.enable_offload and bool(devices["rollout"] & devices["actor"]),
            "env": self.cfg.env.enable_offload and bool(devices["env"] & devices["actor"]),
        }

    def init_workers(self) -> None:
        """Restore from `runner.resume` if it names a checkpoint; start with the actor's weights on its devices."""
        resume = checkpoint.resolve_resume(self.cfg.runner.resume, self.checkpoint_root)
        if resume is None:
            return
        wait_all(self.actor.load_checkpoint(str(resume)), self.env.load_checkpoint(str(resume)))
        state = json.loads((resume / "runner.json").read_text())
        self.start_step = state["step"]
        self.total_env_steps = state["total_env_steps"]
        self.recent_returns.extend(state["recent_returns"])
        print(f"rlplace: resumed from {resume} at step {self.start_step}")

    def run(self) -> dict[str, float]:
        """Train `runner.max_steps` steps, or until the task is solved; returns the last step's metrics."""
        cfg = self.cfg.runner
        metrics: dict[str, float] = {}
        start, steps_before = time.perf_counter(), self.total_env_steps
        with TrainingProgress(cfg.max_steps) as progress:
            progress.update(self.start_step)
            for step in range(self.start_step, cfg.max_steps):
                metrics = self.step(step)
                self.logger.log(metrics, step)
                self.history.append(metrics)
                progress.update(step + 1, metrics)
                done = step + 1 == cfg.max_steps or self._solved()
                if done or (cfg.save_interval and (step + 1) % cfg.save_interval == 0):
                    self.save_checkpoint(step + 1)
                if done:
                    break
        self.timeline.write(self.run_dir / "timeline.json")
        metrics["run/env_steps_per_s"] = (self.total_env_steps - steps_before) / (time.perf_counter() - start)
        return metrics

    def _solved(self) -> bool:
        stop = self.cfg.task.solved_return
        return (
            self.cfg.runner.stop_when_solved
            and stop is not None
            and len(self.recent_returns) == RETURN_WINDOW
            and self.mean_return() >= stop
        )

    def mean_return(self) -> float:
        return statistics.fmean(self.recent_returns) if self.recent_returns else float("nan")

    def step(self, step: int) -> dict[str, float]:
        """One synchronous step: the rollout acts only with the weights of the previous `step` updates."""
        t0 = time.time()
        with self.timer.phase("step"):
            self.update_rollout_weights()
            episodes, env_steps = self.generate_rollouts(step)
            self.compute_advantages_and_returns()
            train_stats = self.run_training(step)
        return self.record(step, t0, episodes, env_steps, train_stats)

    def update_rollout_weights(self) -> None:
        with self.timer.phase("sync_weights"):
            if self.offloads["rollout"]:
                with self.timer.phase("onload"):
                    self.rollout.onload().wait()
            wait_all(self.actor.sync_weights(), self.rollout.sync_weights())

    def generate_rollouts(self, step: int) -> tuple[list[EpisodeStats], int]:
        """Env, rollout and actor together: observations and actions through two channels, stage by stage, and
        trajectories into the actor. Returns the finished episodes and the env steps taken."""
        if self.offloads["actor"]:
            with self.timer.phase("offload"):
                self.actor.offload().wait()
        with self.timer.phase("generate_rollouts"):
            episodes, served, _ = wait_all(
                self.env.interact(self.cfg.rollout.num_steps),
                self.rollout.generate(step, version=step),
                self.actor.recv_rollout_batch(),
            )
        return episodes, sum(served)

    def compute_advantages_and_returns(self) -> None:
        """Idle generators leave the shared devices to the actor, which then computes advantages on its shard."""
        idle = [group for name, group in (("rollout", self.rollout), ("env", self.env)) if self.offloads[name]]
        if idle:
            with self.timer.phase("offload"):
                wait_all(*(group.offload() for group in idle))
        if self.offloads["actor"]:
            with self.timer.phase("onload"):
                self.actor.onload().wait()
        with self.timer.phase("advantages"):
            self.actor.compute_advantages_and_returns().wait()

    def run_training(self, step: int) -> dict[str, float]:
        with self.timer.phase("training"):
            return self.actor.run_training(step).wait()[0]

    def record(
        self, step: int, t0: float, episodes: list[EpisodeStats], env_steps: int, train: dict[str, Any]
    ) -> dict[str, float]:
        t1 = time.time()
        metrics = self.timer.step_metrics()
        self.timeline.extend(self.timer.drain_spans())
        for group in (self.actor, self.rollout, self.env):
            for spans in group.pop_timings().wait():
                self.timeline.extend(spans)
        metrics["time/env"] = self.timeline.busy_seconds("env", t0, t1)
        metrics["time/rollout"] = self.timeline.busy_seconds("rollout", t0, t1)
        metrics.update(throughput_metrics(metrics["time/step"], self.placement.num_devices, env_steps=env_steps))
        metrics.update(self.timeline.utilization(t0, t1))
        metrics.update(train)
        returns = [r for part in episodes for r in part.returns]
        lengths = [n for part in episodes for n in part.lengths]
        self.recent_returns.extend(returns)
        self.total_env_steps += env_steps
        if returns:
            metrics["env/episode_return"] = statistics.fmean(returns)
            metrics["env/episode_length"] = statistics.fmean(lengths)
            metrics["env/episodes"] = len(returns)
        metrics["env/return_last20"] = self.mean_return()
        metrics["env/total_steps"] = self.total_env_steps
        return metrics

    def save_checkpoint(self, step: int) -> Path:
        """Actor weights, optimizer and RNGs, env simulators, and the runner's counters: one atomic folder."""
        with self.timer.phase("checkpoint"):
            tmp = checkpoint.staging_dir(self.checkpoint_root, step)
            wait_all(self.actor.save_checkpoint(str(tmp)), self.env.save_checkpoint(str(tmp)))
            state = {"step": step, "total_env_steps": self.total_env_steps, "recent_returns": list(self.recent_returns)}
            (tmp / "runner.json").write_text(json.dumps(state))
            return checkpoint.commit(tmp)
