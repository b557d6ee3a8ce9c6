"""EmbodiedRunner: the training loop of an embodied task, identical in every placement mode.

Each step:
  1. update_rollout_weights         actor rank 0 -> every rollout rank (bucketed broadcast, versioned)
  2. generate_rollouts              env.interact and rollout.generate run together, exchanging observations and
                                    actions through two channels, stage by stage; trajectories go to the actor
                                    ranks' mailboxes
  3. compute_advantages_and_returns on the actor ranks (GAE or group-normalised), once they took in the batch
  4. run_training                   PPO, data-parallel over actor ranks
  5. record                         time/*, throughput/*, util/*, train/*, env/* -> metrics.jsonl and the logger
After the last step, with runner.profile=true, each component times its unit of work alone (`profile.measure`)
into profile.json.
Before each phase the switch plan offloads the idle components that share devices with the working ones and
onloads the working ones (`core.runner.PhaseSwitcher`).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import deque
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
from rlplace.embodied import profile
from rlplace.embodied.config import COMPONENTS, FAMILY, EmbodiedConfig
from rlplace.embodied.envs import EpisodeStats, merge_episode_stats
from rlplace.metrics import MetricLogger, PhaseTimer, TrainingProgress, throughput_metrics
from rlplace.placement import ComponentPlacement
from rlplace.scheduler import Channel, GroupFuture, WorkerGroup, wait_all

RETURN_WINDOW = 20
"""`env/return_last20`: the mean return of the last this many finished episodes (CartPole is solved at 475)."""
LOCKSTEP_SPIN_S = 0.001
"""How long env and rollout poll for each other's next item before sleeping (`Channel.create`'s `spin_s`): longer
than a simulator step or an inference, so that in steady state neither sleeps and each item is taken within
microseconds instead of after a wake-up (a median hand-off of 31-35 against 100 us in `make run`). Polling holds the
waiting side's core, which nothing else needs then: the actor never trains on cores that generation uses while it
runs (`AsyncSchedule.overlap`), and a side whose peer shares its cores does not poll at all."""
LOCKSTEP_SPIN = {"obs": LOCKSTEP_SPIN_S, "actions": LOCKSTEP_SPIN_S}
PHASES = (
    ("sync_weights", frozenset({"actor", "rollout"})),
    ("generate_rollouts", frozenset({"env", "rollout"})),
    ("training", frozenset({"actor"})),
)
"""The phases of a step and the components that hold device memory in each (the actor only collects CPU
trajectories while generating, so it may be offloaded then)."""

log = logging.getLogger(__name__)


class Channels(NamedTuple):
    """The queues of generation, unbounded. Env and rollout take turns per stream, so each stream has at most two
    observations in flight (the last of a step and the first of the next, sent together) and one action: a bound
    could never bind, and would cost a credit frame back per item (3-4 us more per hand-off, 20 against 16-17 us, in a
    lockstep exchange of two processes with 200 us of work per side). Trajectories wait for the actor."""

    obs: Channel
    """env -> rollout: (observation, reward, done) per stream."""
    actions: Channel
    """rollout -> env: actions per stream."""
    trajectories: Channel
    """rollout -> actor: one `Trajectory` piece per stream and actor rank whose shard it overlaps."""


class EmbodiedRunner:
    """Drives the env, rollout and actor groups through training steps; owns metrics, timeline and checkpoints."""

    def __init__(
        self,
        cfg: EmbodiedConfig,
        *,
        actor: WorkerGroup,
        rollout: WorkerGroup,
        env: WorkerGroup,
        placement: ComponentPlacement,
        run_dir: Path,
        logger: MetricLogger,
        identity: dict[str, Any],
        history: list[dict[str, float]] | None = None,
        device_cores: dict[int, list[int]] | None = None,
    ) -> None:
        """`identity` is what a checkpoint must share with a run that resumes it (`launch.checkpoint_identity`); each
        checkpoint records it for `launch.check_checkpoint`. `device_cores` (device -> its CPU cores,
        `profile.cores_by_device`) goes into profile.json with runner.profile=true."""
        self.cfg, self.actor, self.rollout, self.env = cfg, actor, rollout, env
        self.device_cores = {} if device_cores is None else device_cores
        self.placement, self.run_dir, self.logger = placement, run_dir, logger
        self.history = [] if history is None else history
        self.timer = PhaseTimer()
        self.timeline = placement_timeline(placement, COMPONENTS)
        offloadable = {name: getattr(cfg, name).enable_offload for name in COMPONENTS}
        groups = {"actor": actor, "rollout": rollout, "env": env}
        self.switcher = PhaseSwitcher(groups, placement, PHASES, offloadable, self.timer)
        self.hang_deadline = HangDeadline((actor, rollout, env), cfg.runner.hang_timeout_s)
        self.start_step = 0
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.total_env_steps = 0
        self.checkpoint_root = run_dir / checkpoint.FOLDER
        self.identity = identity
        self.generation_window = (0.0, 0.0)
        """Unix times the last generation phase began and ended (time/generation_efficiency)."""
        self.training_window: tuple[float, float] | None = None
        """When training ran beside generation this step: the window in which the actor's busy time is its
        time/training (the driver cannot time a phase it does not wait on alone)."""
        self.unreceived = 0
        """Batches generated that the actor has not been asked to take in yet (`receive_batches`)."""
        self.schedule = AsyncSchedule.of(placement, cfg.runner.max_staleness, cfg.runner.max_steps, trainer="actor")

    def init_workers(self) -> None:
        """Restore from `runner.resume` if it names a checkpoint; start with the actor's weights on its devices."""
        if self.cfg.runner.resume is None:
            return
        resume = Path(self.cfg.runner.resume)  # resolved and verified by the driver before anything started
        wait_all(self.actor.load_checkpoint(str(resume)), self.env.load_checkpoint(str(resume)))
        state = json.loads((resume / checkpoint.STATE_FILE).read_text())
        self.start_step = state["step"]
        self.total_env_steps = state["total_env_steps"]
        self.recent_returns.extend(state["recent_returns"])
        log.info(f"rlplace: resumed from {resume} at step {self.start_step}")

    def run(self) -> dict[str, float]:
        """Train `runner.max_steps` steps, or until the task is solved or the run is preempted (SIGTERM, Ctrl-C);
        returns the last step's metrics. The last step is always checkpointed; then, with runner.profile=true and
        unless preempted, the run profiles its components (`write_profile`)."""
        cfg = self.cfg.runner
        metrics: dict[str, float] = {}
        start, steps_before = time.perf_counter(), self.total_env_steps
        with (
            open_channels(Channels, spinning=LOCKSTEP_SPIN, obs=0, actions=0, trajectories=0) as channels,
            TrainingProgress(cfg.max_steps) as progress,
        ):
            progress.update(self.start_step)
            for step in range(self.start_step, cfg.max_steps):
                metrics = self.step(step, channels)
                self.hang_deadline.observe(metrics["time/step"])
                self.logger.log(metrics, step)
                self.timeline.write(self.run_dir / "timeline.json")  # readable while the run goes on
                self.history.append(metrics)
                progress.update(step + 1, metrics)
                done = step + 1 == cfg.max_steps or self._solved() or preemption.requested()
                if done or (cfg.save_interval and (step + 1) % cfg.save_interval == 0):
                    self.save_checkpoint(step + 1)
                if done:
                    break
        self.timeline.write(self.run_dir / "timeline.json")
        metrics["run/env_steps_per_s"] = (self.total_env_steps - steps_before) / (time.perf_counter() - start)
        if cfg.profile and not preemption.requested():  # a preempted run must stop soon
            self.write_profile()
        return metrics

    def write_profile(self) -> Path:
        """Time each component's unit of work alone, at several sizes, into profile.json (`profile.measure`)."""
        start = time.perf_counter()
        groups = {"env": self.env, "rollout": self.rollout, "actor": self.actor}
        measured = profile.measure(self.cfg, self.placement, self.device_cores, **groups, switch=self.switcher.before)
        path = self.run_dir / profile.PROFILE_FILE
        path.write_text(json.dumps(measured, indent=2) + "\n")
        log.info(f"rlplace: profiled env, rollout and actor in {time.perf_counter() - start:.1f} s: {path}")
        return path

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

    def step(self, step: int, channels: Channels) -> dict[str, float]:
        """One training step, with K = runner.max_staleness.

        K = 0, synchronous: the rollout gets the weights of the previous `step` updates, generates this step's
        rollouts with them, and the actor trains on them. K > 0: this step's batch was generated K steps earlier
        (the first K, at step 0, with the initial weights); the rollout gets v(step) and generates step + K with it
        while the actor trains on this step's batch: side by side where the actor's devices are its own, in turn
        where it shares them. Either way the batch of step t comes from weights max(0, t - K), whatever the timing.
        """
        t0 = time.time()
        episodes: list[EpisodeStats] = []
        env_steps = 0
        with self.timer.phase("step"):
            self.switcher.before("sync_weights")
            self.update_rollout_weights()
            for generated in self.schedule.before_training(step):
                self.switcher.before("generate_rollouts")
                found, served = self.generate_rollouts(generated, step, channels)
                episodes, env_steps = episodes + found, env_steps + served
            ahead = self.schedule.ahead(step)
            if ahead is not None and self.schedule.overlap:
                found, served, train_stats = self.generate_while_training(ahead, step, channels)
            else:
                if ahead is not None:
                    self.switcher.before("generate_rollouts")
                    found, served = self.generate_rollouts(ahead, step, channels)
                self.switcher.before("training")
                self.compute_advantages_and_returns(channels)
                train_stats = self.run_training(step)
            if ahead is not None:
                episodes, env_steps = episodes + found, env_steps + served
        return self.record(t0, episodes, env_steps, train_stats)

    def update_rollout_weights(self) -> None:
        with self.timer.phase("sync_weights"):
            wait_all(self.actor.sync_weights(), self.rollout.sync_weights())

    def generate_rollouts(self, step: int, version: int, channels: Channels) -> tuple[list[EpisodeStats], int]:
        """Env, rollout and actor together: the rollouts of `step`, acted on with weights `version`; observations
        and actions through two channels, stage by stage, and trajectories into the actor. Returns the finished
        episodes and the env steps taken."""
        start = self.timer.now()
        # The rollout first: its call is the one the step waits for (the env's first observations are queued).
        generated = self.rollout.generate(step, version, channels.obs, channels.actions, channels.trajectories)
        interacted = self.env.interact(self.cfg.rollout.num_steps, channels.obs, channels.actions)
        self.unreceived += 1
        try:
            episodes, served = wait_all(interacted, generated)
        finally:
            self.generation_window = (start, self.timer.now())
            self.timer.add("generate_rollouts", *self.generation_window)
        return episodes, sum(served)

    def generate_while_training(
        self, ahead: int, step: int, channels: Channels
    ) -> tuple[list[EpisodeStats], int, dict[str, float]]:
        """The rollouts of step `ahead` with weights `step`, while the actor trains on the batch of `step` and then
        takes in the new one. Returns what `generate_rollouts` does, and the training stats."""
        start = self.timer.now()
        generated = self.rollout.generate(ahead, step, channels.obs, channels.actions, channels.trajectories)
        interacted = self.env.interact(self.cfg.rollout.num_steps, channels.obs, channels.actions)
        taken = self.receive_batches(channels)
        advantages = self.actor.compute_advantages_and_returns()
        trained = self.actor.run_training(step)
        received = self.actor.recv_rollout_batch(channels.trajectories)
        episodes, served = wait_all(interacted, generated)  # the rollout never waits for the actor: safe apart
        self.generation_window = (start, self.timer.now())
        self.timer.add("generate_rollouts", *self.generation_window)
        *_, train_stats, _ = wait_all(*taken, advantages, trained, received)
        self.training_window = (start, self.timer.now())
        return episodes, sum(served), train_stats[0]

    def receive_batches(self, channels: Channels) -> list[GroupFuture]:
        """Ask the actor to take in the batches generated since the last call. Only now: an actor already waiting
        for its trajectories during generation would unpickle them as they come, on a core that env or rollout may
        be using; asked afterwards, it takes in what its mailbox holds."""
        taken = [self.actor.recv_rollout_batch(channels.trajectories) for _ in range(self.unreceived)]
        self.unreceived = 0
        return taken

    def compute_advantages_and_returns(self, channels: Channels) -> None:
        """Once the actor has taken in the batches generated (`receive_batches`, timed with this phase)."""
        with self.timer.phase("advantages"):
            wait_all(*self.receive_batches(channels), self.actor.compute_advantages_and_returns())

    def run_training(self, step: int) -> dict[str, float]:
        with self.timer.phase("training"):
            return self.actor.run_training(step).wait()[0]

    def record(
        self, t0: float, episodes: list[EpisodeStats], env_steps: int, train: dict[str, Any]
    ) -> dict[str, float]:
        t1 = time.time()
        metrics = self.timer.step_metrics()
        collect_spans(self.timer, self.timeline, (self.actor, self.rollout, self.env))
        metrics["time/env"] = self.timeline.busy_seconds("env", t0, t1)
        metrics["time/rollout"] = self.timeline.busy_seconds("rollout", t0, t1)
        metrics["time/generation_efficiency"] = self.generation_efficiency()
        if self.training_window is not None:
            metrics["time/training"] = self.timeline.busy_seconds("actor", *self.training_window)
            self.training_window = None
        if self.cfg.runner.max_staleness:
            metrics["time/overlap"] = self.timeline.overlap(
                "actor", ("env", "rollout"), t0, t1, spans_of_a=TRAINING_SPANS
            )
        metrics.update(throughput_metrics(metrics["time/step"], self.placement.num_devices, env_steps=env_steps))
        metrics.update(self.timeline.utilization(t0, t1))
        metrics.update(train)
        # One order for every placement: episodes by (env step they ended on, global env index), not env rank by env
        # rank, so the return_last20 window (the stopping criterion) holds the same episodes however envs are split.
        finished = merge_episode_stats(episodes)
        returns, lengths = finished.returns, finished.lengths
        self.recent_returns.extend(returns)
        self.total_env_steps += env_steps
        if returns:
            metrics["env/episode_return"] = statistics.fmean(returns)
            metrics["env/episode_length"] = statistics.fmean(lengths)
            metrics["env/episodes"] = len(returns)
        metrics["env/return_last20"] = self.mean_return()
        metrics["env/total_steps"] = self.total_env_steps
        return metrics

    def generation_efficiency(self) -> float:
        """Seconds the simulators and the policy inference computed during generation, over its length.

        What is missing to 1 went to hand-offs and waiting. With one pipeline stage env and rollout take turns, so
        it is at most 1; stages that overlap push it above 1."""
        g0, g1 = self.generation_window
        busy = self.timeline.busy_seconds("env", g0, g1) + self.timeline.busy_seconds("rollout", g0, g1)
        return busy / (g1 - g0)

    def save_checkpoint(self, step: int) -> Path:
        """Actor weights, optimizer and RNGs, env simulators by global env index, and the runner's counters: one
        atomic folder."""
        with self.timer.phase("checkpoint"):
            tmp = checkpoint.staging_dir(self.checkpoint_root, step)
            wait_all(self.actor.save_checkpoint(str(tmp)), self.env.save_checkpoint(str(tmp)))
            state = {
                "family": FAMILY,
                "step": step,
                "total_env_steps": self.total_env_steps,
                "recent_returns": list(self.recent_returns),
                "identity": self.identity,
            }
            (tmp / checkpoint.STATE_FILE).write_text(json.dumps(state))
            return checkpoint.commit(tmp)
