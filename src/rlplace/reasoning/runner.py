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
With runner.max_staleness = K > 0 step t trains on the micro-batches generated K steps earlier, with weights
max(0, t - K), and meanwhile generates those of step t + K with its own (`core.runner.AsyncSchedule`): beside the
training where the actor's devices are its own, before it otherwise. rollout/* describe the batch trained on,
throughput/* the tokens generated during the step.
Before each phase the switch plan offloads the idle components that share devices with the working ones and onloads
the working ones (`core.runner.PhaseSwitcher`). Greedy accuracy on the held-out split is measured before the first
step, every `runner.eval_interval` steps and after the last; the trained policy is written as a Hugging Face folder
at the end.

Checkpoints (every `runner.save_interval` steps and after the last) hold the actor's state, the micro-batches it has
not trained on yet (K > 0) and the loop's counters, and nothing of the other groups: their weights are the actor's,
broadcast at the start of every step; prompts are a pure function of (task.data_seed, step) and sampling noise of
(runner.seed, sample id), so a run resumed from step k generates, scores and trains exactly as the uninterrupted
one did from step k.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from rlplace.core import checkpoint, preemption
from rlplace.core.runner import (
    TRAINING_SPANS,
    AsyncSchedule,
    PhaseSwitcher,
    collect_spans,
    open_channels,
    placement_timeline,
)
from rlplace.core.watchdog import HangDeadline
from rlplace.metrics import MetricLogger, PhaseTimer, TrainingProgress, throughput_metrics
from rlplace.placement import ComponentPlacement
from rlplace.reasoning.config import COMPONENTS, FAMILY, ReasoningConfig
from rlplace.scheduler import Channel, GroupFuture, WorkerGroup, wait_all

PHASES = (
    ("sync_weights", frozenset({"actor", "rollout", "inference"})),
    ("generate_rollouts", frozenset({"rollout", "reward", "inference"})),
    ("training", frozenset({"actor"})),
)
"""The phases of a step and the components that hold device memory in each (the actor only collects finished
micro-batches while the others generate, so it may be offloaded then)."""
PROGRESS_FIELDS = {"eval/accuracy": "accuracy", "rollout/reward": "reward", "throughput/tokens_per_s": "tokens/s"}

log = logging.getLogger(__name__)


class Channels(NamedTuple):
    """The queues between the stages. Unbounded: a collocated step parks a whole step's micro-batches in them."""

    generated: Channel
    """rollout -> reward: responses."""
    scored: Channel
    """reward -> inference: responses with rewards."""
    ready: Channel
    """inference -> actor: responses with rewards, old and reference log-probs."""


class ReasoningRunner:
    """Drives the rollout, reward, inference and actor groups; owns metrics, timeline, checkpoints and the final
    model. `identity` is what a checkpoint must share with a run that resumes it (`launch.checkpoint_identity`); it is
    recorded in each checkpoint for `launch.check_checkpoint`."""

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
        identity: dict[str, Any],
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
        self.hang_deadline = HangDeadline((actor, rollout, reward, inference), cfg.runner.hang_timeout_s)
        self.accuracy: list[tuple[int, float]] = []
        """(step, greedy held-out accuracy) at every evaluation."""
        self.eval_seconds = 0.0
        self.version = 0
        """The actor's weight version (its updates so far); the rollout and inference groups hold it after a sync."""
        self.start_step = 0
        self.identity = identity
        self.checkpoint_root = run_dir / checkpoint.FOLDER
        self.schedule = AsyncSchedule.of(placement, cfg.runner.max_staleness, cfg.runner.max_steps, trainer="actor")
        self.training_window: tuple[float, float] | None = None
        """When training ran beside generation this step: the window in which the actor's busy time is its
        time/training (the driver cannot time a phase it does not wait on alone)."""

    def init_workers(self) -> None:
        """Restore from `runner.resume` if it names a checkpoint: the actor's state, the weight version and the
        accuracy history, whose first entry is the evaluation before the first step (not run again)."""
        if self.cfg.runner.resume is None:
            return
        resume = Path(self.cfg.runner.resume)  # resolved and verified by the driver before anything started
        self.actor.load_checkpoint(str(resume)).wait()
        state = json.loads((resume / checkpoint.STATE_FILE).read_text())
        self.start_step, self.version = state["step"], state["version"]
        self.accuracy = [(step, accuracy) for step, accuracy in state["accuracy"]]
        log.info(f"rlplace: resumed from {resume} at step {self.start_step}")

    def run(self) -> dict[str, float]:
        """Train `runner.max_steps` steps, or until the run is preempted (SIGTERM, Ctrl-C); returns the last step's
        metrics plus the accuracy before and after. The last step is always checkpointed; a preempted run is not
        evaluated out of schedule, so that its resumption logs what the uninterrupted run would have."""
        cfg = self.cfg.runner
        metrics: dict[str, float] = {}
        if self.start_step == 0:
            self.evaluate(0)
        start, tokens = time.perf_counter(), 0.0
        with (
            open_channels(Channels, generated=0, scored=0, ready=0) as channels,
            TrainingProgress(cfg.max_steps, fields=PROGRESS_FIELDS, every=max(1, cfg.eval_interval)) as progress,
        ):
            progress.update(self.start_step)
            for step in range(self.start_step, cfg.max_steps):
                metrics = self.step(step, channels)
                self.hang_deadline.observe(metrics["time/step"])
                tokens += metrics["rollout/response_tokens"]
                last = step + 1 == cfg.max_steps
                if (step + 1) % cfg.eval_interval == 0 or last:
                    metrics["eval/accuracy"] = self.evaluate(step + 1)
                self.logger.log(metrics, step)
                self.timeline.write(self.run_dir / "timeline.json")  # readable while the run goes on
                self.history.append(metrics)
                progress.update(step + 1, metrics)
                done = last or preemption.requested()
                if done or (cfg.save_interval and (step + 1) % cfg.save_interval == 0):
                    self.save_checkpoint(step + 1)
                if done:
                    break
        elapsed = time.perf_counter() - start - self.eval_seconds
        self.timeline.write(self.run_dir / "timeline.json")
        self.actor.execute_on(0).save_model(str(self.run_dir / "final_model")).wait()
        metrics["run/tokens_per_s"] = tokens / elapsed
        metrics["run/train_seconds"] = elapsed
        metrics["run/steps"] = self.version  # one update per step: fewer than max_steps when preempted
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
        """One training step, with K = runner.max_staleness: the batch trained on comes from the weights of
        max(0, step - K) updates, whatever the timing (`AsyncSchedule`)."""
        t0 = time.time()
        generated: list[dict[str, float]] = []
        with self.timer.phase("step"):
            self.switcher.before("sync_weights")
            self.update_rollout_weights()
            for early in self.schedule.before_training(step):
                self.switcher.before("generate_rollouts")
                generated.append(self.generate_rollouts(early, channels))
            ahead = self.schedule.ahead(step)
            if ahead is not None and self.schedule.overlap:
                made, batch_stats, train_stats = self.generate_while_training(ahead, step, channels)
                generated.append(made)
            else:
                if ahead is not None:
                    self.switcher.before("generate_rollouts")
                    generated.append(self.generate_rollouts(ahead, channels))
                self.switcher.before("training")
                batch_stats = self.compute_advantages()
                train_stats = self.run_training(step)
        return self.record(t0, generated, batch_stats, train_stats)

    def update_rollout_weights(self) -> None:
        with self.timer.phase("sync_weights"):
            versions, *_ = wait_all(
                self.actor.sync_weights(), self.rollout.sync_weights(), self.inference.sync_weights()
            )
        self.version = versions[0]

    def _stages(self, step: int, channels: Channels) -> list[Callable[[], GroupFuture]]:
        """The calls that generate, score and pass on the micro-batches of `step` with weights `self.version`, in
        pipeline order."""
        m, c = self.num_micro_batches, channels
        return [
            lambda: self.rollout.generate(step, self.version, c.generated),
            lambda: self.reward.compute_rewards(m, c.generated, c.scored),
            lambda: self.inference.compute_logprobs(m, c.scored, c.ready),
            lambda: self.actor.recv_batch(m, c.ready),
        ]

    def generate_rollouts(self, step: int, channels: Channels) -> dict[str, float]:
        """Micro-batches of `step` flow rollout -> reward -> inference -> actor; returns the sums of what the actor
        ranks received (response tokens, generation seconds)."""
        stages = self._stages(step, channels)
        with self.timer.phase("generate_rollouts"):
            if self.pipelined:
                *_, received = wait_all(*(stage() for stage in stages))
            else:
                *_, received = [stage().wait() for stage in stages]
        return _summed(received)

    def generate_while_training(
        self, ahead: int, step: int, channels: Channels
    ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """The micro-batches of step `ahead`, generated with weights `step` while the actor trains on the batch of
        `step` and then takes in the new one. Returns what `generate_rollouts`, `compute_advantages` and
        `run_training` do."""
        start = self.timer.now()
        *generating, received = self._stages(ahead, channels)
        started = [stage() for stage in generating]
        advantages = self.actor.compute_advantages()
        trained = self.actor.run_training(step)
        made = received()  # after the training calls: the actor's calls run in the order they were made
        wait_all(*started)
        self.timer.add("generate_rollouts", start, self.timer.now())
        batch_stats, per_rank, parts = wait_all(advantages, trained, made)
        self.training_window = (start, self.timer.now())
        self.version += 1
        return _summed(parts), _summed(batch_stats), _averaged(per_rank)

    def compute_advantages(self) -> dict[str, float]:
        with self.timer.phase("advantages"):
            return _summed(self.actor.compute_advantages().wait())

    def run_training(self, step: int) -> dict[str, float]:
        with self.timer.phase("training"):
            per_rank = self.actor.run_training(step).wait()
        self.version += 1  # the actor's weights have had one more update (a checkpoint records this version)
        return _averaged(per_rank)

    def record(
        self, t0: float, generated: list[dict[str, float]], batch: dict[str, float], train: dict[str, float]
    ) -> dict[str, float]:
        """The step's metrics: rollout/* of the batch trained on (`batch`), throughput/* of the tokens generated
        during the step (`generated`: none in the last K steps of an asynchronous run)."""
        t1 = time.time()
        metrics = self.timer.step_metrics()
        collect_spans(self.timer, self.timeline, (self.actor, self.rollout, self.reward, self.inference))
        for name in ("rollout", "reward", "inference"):
            metrics[f"time/{name}"] = self.timeline.busy_seconds(name, t0, t1)
        if self.training_window is not None:
            metrics["time/training"] = self.timeline.busy_seconds("actor", *self.training_window)
            self.training_window = None
        if self.cfg.runner.max_staleness:
            metrics["time/overlap"] = self.timeline.overlap(
                "actor", ("rollout", "reward", "inference"), t0, t1, spans_of_a=TRAINING_SPANS
            )
        tokens = sum(made["response_tokens"] for made in generated)
        metrics.update(throughput_metrics(metrics["time/step"], self.placement.num_devices, tokens=tokens))
        if generated:
            metrics["throughput/generation_tokens_per_s"] = tokens / sum(m["generate_seconds"] for m in generated)
        metrics.update(self.timeline.utilization(t0, t1))
        metrics.update(train)
        metrics["rollout/reward"] = batch["reward_sum"] / batch["rows"]
        metrics["rollout/response_length"] = batch["response_tokens"] / batch["rows"]
        metrics["rollout/response_tokens"] = batch["response_tokens"]
        return metrics

    def save_checkpoint(self, step: int) -> Path:
        """The actor's state and the runner's counters after `step` steps (its evaluation included): one atomic
        folder."""
        with self.timer.phase("checkpoint"):
            tmp = checkpoint.staging_dir(self.checkpoint_root, step)
            self.actor.save_checkpoint(str(tmp)).wait()
            state = {
                "family": FAMILY,
                "step": step,
                "version": self.version,
                "accuracy": self.accuracy,
                "identity": self.identity,
            }
            (tmp / checkpoint.STATE_FILE).write_text(json.dumps(state))
            return checkpoint.commit(tmp)


def _summed(per_rank: list[dict[str, float]]) -> dict[str, float]:
    return {key: sum(part[key] for part in per_rank) for key in per_rank[0]}


def _averaged(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """train/* stats: every rank's are the same up to float order."""
    return {key: statistics.fmean(stats[key] for stats in per_rank) for key in per_rank[0]}
