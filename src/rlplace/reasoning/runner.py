"""ReasoningRunner: the reasoning family's phases of the one training loop (`core.runner.Runner`).

Each step:
  1. sync_weights         actor rank 0 -> every rollout and inference rank (bucketed broadcast, versioned)
  2. generate             rollout.generate -> reward.compute_rewards -> inference.compute_logprobs -> actor.recv_batch,
                          micro-batch by micro-batch through three channels. Collocated, the stages take turns on the
                          shared devices (the actor offloaded meanwhile); otherwise they run at once and overlap, each
                          starting on a micro-batch as soon as it arrives.
  3. compute_advantages   on the actor ranks (GRPO group norm, REINFORCE++, or GAE with the critic)
  4. train                policy (and critic) update, data-parallel over actor ranks
  5. record               time/*, throughput/*, util/*, train/*, rollout/*, reward/*, eval/* -> metrics.jsonl, logger
With runner.max_staleness = K > 0, rollout/* and reward/* describe the batch trained on (generated K steps earlier) and
throughput/* the tokens generated during the step. Accuracy on the held-out split (`reasoning.evaluation`) is
measured before the first step (`runner.eval_before_train`), every `runner.eval_interval` steps and after the last;
the trained policy is written as a Hugging Face folder at the end. With runner.profile=true, profile.json records
what the planner needs beside the timeline (`reasoning.profile`).

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
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NamedTuple

from rlplace.core import preemption
from rlplace.core.launcher import RunContext
from rlplace.core.runner import Runner, open_channels
from rlplace.metrics import TrainingProgress, throughput_metrics
from rlplace.placement import ComponentPlacement
from rlplace.planner import PROFILE_FILE
from rlplace.reasoning import profile
from rlplace.reasoning.config import FAMILY, ReasoningConfig
from rlplace.reasoning.evaluation import eval_metrics
from rlplace.reasoning.phases import PHASES
from rlplace.reasoning.rewards import METRIC_PREFIX
from rlplace.reasoning.streams import (
    FILTERED_GROUPS,
    GENERATION_ROUNDS,
    INTERACTION_ERRORS,
    MISMATCH_KL,
    TOOL_CALLS,
    TOOL_ERRORS,
    TRUNCATED,
    USER_TURNS,
)
from rlplace.scheduler import Channel, GroupFuture, WorkerGroup, wait_all

log = logging.getLogger(__name__)
PROGRESS_FIELDS = {"eval/accuracy": "accuracy", "rollout/reward": "reward", "throughput/tokens_per_s": "tokens/s"}

Stats = dict[str, float]


class Channels(NamedTuple):
    """The queues between the stages. Unbounded: a collocated step parks a whole step's micro-batches in them."""

    generated: Channel
    """rollout -> reward: responses."""
    scored: Channel
    """reward -> inference: responses with rewards."""
    ready: Channel
    """inference -> actor: responses with rewards, old and reference log-probs."""


class ReasoningRunner(Runner[Channels, Stats, Stats, Stats]):
    """Drives the rollout, reward, inference and actor groups; also evaluates and writes the final model."""

    family = FAMILY
    generators = ("rollout", "reward", "inference")

    def __init__(
        self,
        cfg: ReasoningConfig,
        *,
        actor: WorkerGroup,
        rollout: WorkerGroup,
        reward: WorkerGroup | None,
        inference: WorkerGroup | None,
        placement: ComponentPlacement,
        identity: dict[str, Any],
        context: RunContext,
        device_cores: dict[int, list[int]],
        node_cores: dict[int, list[int]],
    ) -> None:
        """`device_cores` (device -> its CPU cores) and `node_cores` (node -> its cores) go into profile.json with
        runner.profile=true (`reasoning.profile`). `reward` and `inference` are None in a run that only evaluates
        (runner.val_only)."""
        stages = {"actor": actor, "rollout": rollout, "reward": reward, "inference": inference}
        groups = {name: group for name, group in stages.items() if group is not None}
        super().__init__(cfg, groups, PHASES, cfg.offloadable, placement, identity, context)
        self.cfg: ReasoningConfig = cfg
        self.actor, self.rollout = actor, rollout
        self.reward, self.inference = reward, inference
        self.receivers = tuple(name for name in ("rollout", "inference") if name in groups)
        """The groups that generate or score with the actor's weights: each weight sync reaches them."""
        self.num_micro_batches = cfg.task.prompts_per_step // cfg.rollout.micro_batch_prompts
        self.pipelined = self.placement.mode != "collocated"
        """Stages on separate devices run at once; collocated stages take turns."""
        self.accuracy: list[tuple[int, float]] = []
        """(step, held-out accuracy) at every evaluation."""
        counters = {} if self.carried is None else self.carried.counters  # a re-placed run's so far
        self.eval_seconds = counters.get("eval_seconds", 0.0)
        """Seconds the loop spent evaluating, left out of its training time."""
        self.tokens = counters.get("tokens", 0.0)
        """Response tokens trained on by this process's loop."""
        self.version = 0
        """The actor's weight version (its updates so far); the rollout and inference groups hold it after a sync."""
        self.device_cores, self.node_cores = device_cores, node_cores

    # --- the phases ---------------------------------------------------------------------------------------------

    def open_channels(self) -> AbstractContextManager[Channels]:
        return open_channels(Channels, generated=0, scored=0, ready=0)

    def progress(self) -> TrainingProgress:
        every = max(1, self.cfg.runner.eval_interval)
        return TrainingProgress(self.cfg.runner.max_steps, fields=PROGRESS_FIELDS, every=every)

    def sync_weights(self) -> None:
        receiving = (self.groups[name].sync_weights() for name in self.receivers)
        versions, *_ = wait_all(self.actor.sync_weights(self.receivers), *receiving)
        self.version = versions[0]

    def _stages(self, step: int, channels: Channels) -> list[Callable[[], GroupFuture]]:
        """The calls that generate, score and pass on the micro-batches of `step` with weights `self.version`, in
        pipeline order."""
        m, c = self.num_micro_batches, channels
        assert self.reward is not None and self.inference is not None, "a run that trains starts every stage"
        reward, inference = self.reward, self.inference
        return [
            lambda: self.rollout.generate(step, self.version, c.generated),
            lambda: reward.compute_rewards(m, c.generated, c.scored),
            lambda: inference.compute_logprobs(m, c.scored, c.ready),
            lambda: self.actor.recv_batch(m, c.ready),
        ]

    def generate(self, step: int, version: int, channels: Channels) -> Stats:
        """Micro-batches of `step` flow rollout -> reward -> inference -> actor (with the weights the last sync gave,
        `version`); returns the sums of what the actor ranks received (response tokens, generation seconds)."""
        stages = self._stages(step, channels)
        with self.timer.phase("generate_rollouts"):
            if self.pipelined:
                *_, received = wait_all(*(stage() for stage in stages))
            else:
                *_, received = [stage().wait() for stage in stages]
        return _summed(received)

    def generate_while_training(self, ahead: int, step: int, channels: Channels) -> tuple[Stats, Stats, Stats]:
        start = self.timer.now()
        *generating, received = self._stages(ahead, channels)
        started = [stage() for stage in generating]
        advantages = self.actor.compute_advantages()
        trained = self.actor.run_training(step)
        made = received()  # after the training calls: the actor's calls run in the order they were made
        wait_all(*started)
        self.timer.add("generate_rollouts", start, self.timer.now())
        batch_stats, per_rank, parts = wait_all(advantages, trained, made)
        self.version += 1
        return _summed(parts), _summed(batch_stats), _averaged(per_rank)

    def compute_advantages(self, channels: Channels) -> Stats:
        return _summed(self.actor.compute_advantages().wait())

    def train(self, step: int) -> Stats:
        per_rank = self.actor.run_training(step).wait()
        self.version += 1  # the actor's weights have had one more update (a checkpoint records this version)
        return _averaged(per_rank)

    def record(self, t0: float, generated: list[Stats], advantages: Stats, trained: Stats) -> dict[str, float]:
        """rollout/* and reward/* of the batch trained on (`advantages`' sums), throughput/* of the tokens generated
        during the step (`generated`: none in the last K steps of an asynchronous run)."""
        t1 = time.time()
        metrics = self.step_metrics(t0, t1)
        tokens = sum(made["response_tokens"] for made in generated)
        metrics.update(throughput_metrics(metrics["time/step"], self.placement.num_devices, tokens=tokens))
        if generated:
            metrics["throughput/generation_tokens_per_s"] = tokens / sum(m["generate_seconds"] for m in generated)
        metrics.update(self.timeline.utilization(t0, t1))
        metrics.update(trained)
        metrics["rollout/reward"] = advantages["reward_sum"] / advantages["rows"]
        metrics.update(
            {name: total / advantages["rows"] for name, total in advantages.items() if name.startswith(METRIC_PREFIX)}
        )
        if FILTERED_GROUPS in advantages:
            metrics[FILTERED_GROUPS] = advantages[FILTERED_GROUPS]
            metrics[GENERATION_ROUNDS] = advantages[GENERATION_ROUNDS] / self.num_micro_batches
        metrics["rollout/response_length"] = advantages["response_tokens"] / advantages["rows"]
        metrics["rollout/clip_ratio"] = advantages[TRUNCATED] / advantages["rows"]
        for per_response in (TOOL_CALLS, TOOL_ERRORS, USER_TURNS, INTERACTION_ERRORS, MISMATCH_KL):
            if per_response in advantages:
                metrics[per_response] = advantages[per_response] / advantages["rows"]
        metrics["rollout/response_tokens"] = advantages["response_tokens"]
        return metrics

    # --- around the steps ---------------------------------------------------------------------------------------

    def evaluate(self, step: int) -> dict[str, float]:
        """The eval/* metrics (`reasoning.evaluation`) of the actor's current weights on the held-out split (its
        time is left out of the run's training time)."""
        start = time.perf_counter()
        self.update_rollout_weights()
        metrics = eval_metrics([answered for part in self.rollout.evaluate().wait() for answered in part])
        self.accuracy.append((step, metrics["eval/accuracy"]))
        self.timer.step_metrics()  # its weight sync is not part of the next step's time/* (its spans stay drawn)
        self.eval_seconds += time.perf_counter() - start
        return metrics

    def run(self, moves: Callable[[int], bool] | None = None) -> dict[str, float] | None:
        """The loop (`Runner.run`); with runner.val_only, one evaluation of the starting weights instead, logged at
        the step it starts from (0, or the resumed checkpoint's), and no checkpoint and no final model."""
        if not self.cfg.runner.val_only:
            return super().run(moves)
        metrics = self.evaluate(self.start_step)
        self.logger.log(metrics, self.start_step)
        self.close_timeline()
        return metrics

    def before_run(self) -> None:
        """The evaluation before the first step, with runner.eval_before_train (a resumed run has it in its restored
        history)."""
        if self.start_step == 0 and self.cfg.runner.eval_before_train:
            self.evaluate(0)
            self.eval_seconds = 0.0  # before the loop's clock starts

    def after_step(self, step: int, metrics: dict[str, float], last: bool) -> None:
        self.tokens += metrics["rollout/response_tokens"]
        if (step + 1) % self.cfg.runner.eval_interval == 0 or last:
            metrics.update(self.evaluate(step + 1))

    def counters(self) -> dict[str, float]:
        return {"tokens": self.tokens, "eval_seconds": self.eval_seconds}

    def finish(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        """The last step's metrics, tokens/s over the training time (evaluations left out), the accuracy before
        and after (where evaluated); the trained policy is written to final_model/. A preempted run is not evaluated
        out of schedule, so that its resumption logs what the uninterrupted run would have."""
        elapsed = seconds - self.eval_seconds
        self.actor.save_model(str(self.run_dir / "final_model")).wait()  # every rank: the gather is collective
        final = dict(metrics)
        final["run/tokens_per_s"] = self.tokens / elapsed
        final["run/train_seconds"] = elapsed
        final["run/steps"] = self.version  # one update per step: fewer than max_steps when preempted
        before = [accuracy for step, accuracy in self.accuracy if step == 0]
        if before:  # evaluated before training (runner.eval_before_train)
            final["eval/accuracy_before"] = before[0]
        if self.accuracy:  # none yet when preempted before the first evaluation
            final["eval/accuracy_after"] = self.accuracy[-1][1]
        if self.cfg.runner.profile and not preemption.requested():  # a preempted run must stop soon
            self.write_profile()
        return final

    def write_profile(self) -> Path:
        """profile.json: what the timeline's spans ran on, the run's sizes, and the actor's passes timed at the
        sizes other placements would give a rank (`reasoning.profile`)."""
        start = time.perf_counter()
        sizes = profile.pass_sizes(self.cfg)
        timed = self.actor.profile_passes(sizes).wait()
        described = profile.describe(self.cfg, self.placement, self.device_cores, self.node_cores, timed)
        path = self.run_dir / PROFILE_FILE
        path.write_text(json.dumps(described, indent=2) + "\n")
        log.info(f"rlplace: profiled the actor's passes in {time.perf_counter() - start:.1f} s: {path}")
        return path

    # --- checkpoints --------------------------------------------------------------------------------------------

    def save_workers(self, folder: str) -> Iterable[GroupFuture]:
        return (self.actor.save_checkpoint(folder),)

    def load_workers(self, folder: str) -> Iterable[GroupFuture]:
        return (self.actor.load_checkpoint(folder),)

    def state(self) -> dict[str, Any]:
        """The weight version and the accuracy history (its evaluation of the saved step included)."""
        return {"version": self.version, "accuracy": self.accuracy}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.version = state["version"]
        self.accuracy = [(step, accuracy) for step, accuracy in state["accuracy"]]


def _summed(per_rank: list[dict[str, float]]) -> dict[str, float]:
    return {key: sum(part[key] for part in per_rank) for key in per_rank[0]}


def _averaged(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """train/* stats: every rank's are the same up to float order."""
    return {key: statistics.fmean(stats[key] for stats in per_rank) for key in per_rank[0]}
