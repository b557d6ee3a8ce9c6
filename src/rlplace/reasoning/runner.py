"""ReasoningRunner: the training loop of a reasoning task, the same in every placement mode.

Each step:
  1. update_rollout_weights   actor rank 0 -> every rollout and inference rank (bucketed broadcast, versioned)
  2. generate_rollouts        rollout.generate -> reward.compute_rewards -> inference.compute_logprobs ->
                              actor.recv_batch, micro-batch by micro-batch through three channels. Collocated, the
                              stages take turns on the shared devices (the actor offloaded meanwhile); otherwise
                              they run at once and overlap, each starting on a micro-batch as soon as it arrives.
  3. compute_advantages       on the actor ranks (GRPO group norm, REINFORCE++, or GAE with the critic)
  4. run_training             policy (and critic) update, data-parallel over actor ranks
  5. record                   time/*, throughput/*, util/*, train/*, rollout/*, eval/* -> metrics.jsonl, logger
Before each phase the switch plan offloads the idle components that share devices with the working ones and onloads
the working ones (`core.runner.PhaseSwitcher`). Greedy accuracy on the held-out split is measured before the first
step, every `runner.eval_interval` steps and after the last; the trained policy is written as a Hugging Face folder
at the end.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import NamedTuple

from rlplace.core.runner import PhaseSwitcher, collect_spans, open_channels, placement_timeline
from rlplace.metrics import MetricLogger, PhaseTimer, TrainingProgress, throughput_metrics
from rlplace.placement import ComponentPlacement
from rlplace.reasoning.config import COMPONENTS, ReasoningConfig
from rlplace.scheduler import Channel, WorkerGroup, wait_all

PHASES = (
    ("sync_weights", frozenset({"actor", "rollout", "inference"})),
    ("generate_rollouts", frozenset({"rollout", "reward", "inference"})),
    ("training", frozenset({"actor"})),
)
"""The phases of a step and the components that hold device memory in each (the actor only collects finished
micro-batches while the others generate, so it may be offloaded then)."""
PROGRESS_FIELDS = {"eval/accuracy": "accuracy", "rollout/reward": "reward", "throughput/tokens_per_s": "tokens/s"}


class Channels(NamedTuple):
    """The queues between the stages. Unbounded: a collocated step parks a whole step's micro-batches in them."""

    generated: Channel
    """rollout -> reward: responses."""
    scored: Channel
    """reward -> inference: responses with rewards."""
    ready: Channel
    """inference -> actor: responses with rewards, old and reference log-probs."""


class ReasoningRunner:
    """Drives the rollout, reward, inference and actor groups; owns metrics, timeline and the final model."""

    def __init__(
        self,
        cfg: ReasoningConfig,
        *,
        actor: WorkerGroup,
        rollout: WorkerGroup,
        reward: WorkerGroup,
        inference: WorkerGroup,
        placement: ComponentPlacement,
        run_dir: Path,
        logger: MetricLogger,
        history: list[dict[str, float]] | None = None,
    ) -> None:
        self.cfg, self.actor, self.rollout, self.reward, self.inference = cfg, actor, rollout, reward, inference
        self.placement, self.run_dir, self.logger = placement, run_dir, logger
        self.history = [] if history is None else history
        self.timer = PhaseTimer()
        self.timeline = placement_timeline(placement, COMPONENTS)
        self.num_micro_batches = cfg.task.prompts_per_step // cfg.rollout.micro_batch_prompts
        self.pipelined = placement.mode != "collocated"
        """Stages on separate devices run at once; collocated stages take turns."""
        offloadable = {"actor": cfg.actor.enable_offload, "rollout": cfg.rollout.enable_offload}
        groups = {"actor": actor, "rollout": rollout, "reward": reward, "inference": inference}
        self.switcher = PhaseSwitcher(groups, placement, PHASES, offloadable, self.timer)
        self.accuracy: list[tuple[int, float]] = []
        """(step, greedy held-out accuracy) at every evaluation."""
        self.eval_seconds = 0.0
        self.version = 0

    def init_workers(self) -> None:
        """Nothing to restore: reasoning runs start from the model folder (resuming is the embodied runner's)."""

    def run(self) -> dict[str, float]:
        """Train `runner.max_steps` steps; returns the last step's metrics plus the accuracy before and after."""
        cfg = self.cfg.runner
        metrics: dict[str, float] = {}
        self.evaluate(0)
        start, tokens = time.perf_counter(), 0.0
        with (
            open_channels(Channels, generated=0, scored=0, ready=0) as channels,
            TrainingProgress(cfg.max_steps, fields=PROGRESS_FIELDS, every=max(1, cfg.eval_interval)) as progress,
        ):
            for step in range(cfg.max_steps):
                metrics = self.step(step, channels)
                tokens += metrics["rollout/response_tokens"]
                if (step + 1) % cfg.eval_interval == 0 or step + 1 == cfg.max_steps:
                    metrics["eval/accuracy"] = self.evaluate(step + 1)
                self.logger.log(metrics, step)
                self.history.append(metrics)
                progress.update(step + 1, metrics)
        elapsed = time.perf_counter() - start - self.eval_seconds
        self.timeline.write(self.run_dir / "timeline.json")
        self.actor.execute_on(0).save_model(str(self.run_dir / "final_model")).wait()
        metrics["run/tokens_per_s"] = tokens / elapsed
        metrics["run/train_seconds"] = elapsed
        metrics["eval/accuracy_before"] = self.accuracy[0][1]
        metrics["eval/accuracy_after"] = self.accuracy[-1][1]
        return metrics

    def evaluate(self, step: int) -> float:
        """Greedy exact-match accuracy of the actor's current weights on the held-out split (its time is left
        out of the run's training time)."""
        start = time.perf_counter()
        self.switcher.before("sync_weights")
        self.update_rollout_weights()
        rewards = [r for part in self.rollout.evaluate().wait() for r in part]
        accuracy = statistics.fmean(rewards)
        self.accuracy.append((step, accuracy))
        self.timer.step_metrics()  # its weight sync is not part of the next step's time/* (its spans stay drawn)
        self.eval_seconds += time.perf_counter() - start
        return accuracy

    def step(self, step: int, channels: Channels) -> dict[str, float]:
        """One synchronous step: responses come only from the weights of the previous `step` updates."""
        t0 = time.time()
        with self.timer.phase("step"):
            self.switcher.before("sync_weights")
            self.update_rollout_weights()
            self.switcher.before("generate_rollouts")
            rollout_stats = self.generate_rollouts(step, channels)
            self.switcher.before("training")
            self.compute_advantages()
            train_stats = self.run_training(step)
        return self.record(t0, rollout_stats, train_stats)

    def update_rollout_weights(self) -> None:
        with self.timer.phase("sync_weights"):
            versions, *_ = wait_all(
                self.actor.sync_weights(), self.rollout.sync_weights(), self.inference.sync_weights()
            )
        self.version = versions[0]

    def generate_rollouts(self, step: int, channels: Channels) -> dict[str, float]:
        """Micro-batches flow rollout -> reward -> inference -> actor; returns sums of the actor's per-rank stats."""
        m, c = self.num_micro_batches, channels
        stages = (
            lambda: self.rollout.generate(step, self.version, c.generated),
            lambda: self.reward.compute_rewards(m, c.generated, c.scored),
            lambda: self.inference.compute_logprobs(m, c.scored, c.ready),
            lambda: self.actor.recv_batch(m, c.ready),
        )
        with self.timer.phase("generate_rollouts"):
            if self.pipelined:
                *_, received = wait_all(*(stage() for stage in stages))
            else:
                *_, received = [stage().wait() for stage in stages]
        return {key: sum(part[key] for part in received) for key in received[0]}

    def compute_advantages(self) -> None:
        with self.timer.phase("advantages"):
            self.actor.compute_advantages().wait()

    def run_training(self, step: int) -> dict[str, float]:
        with self.timer.phase("training"):
            per_rank = self.actor.run_training(step).wait()
        return {key: statistics.fmean(stats[key] for stats in per_rank) for key in per_rank[0]}

    def record(self, t0: float, rollout: dict[str, float], train: dict[str, float]) -> dict[str, float]:
        t1 = time.time()
        metrics = self.timer.step_metrics()
        collect_spans(self.timer, self.timeline, (self.actor, self.rollout, self.reward, self.inference))
        for name in ("rollout", "reward", "inference"):
            metrics[f"time/{name}"] = self.timeline.busy_seconds(name, t0, t1)
        tokens = rollout["response_tokens"]
        metrics.update(throughput_metrics(metrics["time/step"], self.placement.num_devices, tokens=tokens))
        metrics["throughput/generation_tokens_per_s"] = tokens / rollout["generate_seconds"]
        metrics.update(self.timeline.utilization(t0, t1))
        metrics.update(train)
        metrics["rollout/reward"] = rollout["reward_sum"] / rollout["rows"]
        metrics["rollout/response_length"] = tokens / rollout["rows"]
        metrics["rollout/response_tokens"] = tokens
        return metrics
