"""EmbodiedRunner: the embodied family's phases of the one training loop (`core.runner.Runner`).

Each step:
  1. sync_weights           actor rank 0 -> every rollout rank (bucketed broadcast, versioned)
  2. generate               env.interact and rollout.generate run together, exchanging observations and actions
                            through two channels, stage by stage; trajectories go to the actor ranks' mailboxes
  3. compute_advantages     on the actor ranks (GAE or group-normalised), once they took in the batch
  4. train                  PPO, data-parallel over actor ranks
  5. record                 time/*, throughput/*, util/*, train/*, env/* -> metrics.jsonl and the logger
The run stops early once the mean return of the last `RETURN_WINDOW` episodes reaches `task.solved_return`. After
the last step, with runner.profile=true, each component times its unit of work alone (`profile.measure`) into
profile.json.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NamedTuple

from rlplace.core import preemption
from rlplace.core.launcher import RunContext
from rlplace.core.runner import Runner, open_channels
from rlplace.embodied import profile
from rlplace.embodied.config import COMPONENTS, FAMILY, EmbodiedConfig
from rlplace.embodied.envs import EpisodeStats, merge_episode_stats
from rlplace.embodied.phases import PHASES
from rlplace.metrics import throughput_metrics
from rlplace.placement import ComponentPlacement
from rlplace.scheduler import Channel, GroupFuture, WorkerGroup, serve, wait_all

RETURN_WINDOW = 20
"""`env/return_last20`: the mean return of the last this many finished episodes (CartPole is solved at 475)."""
LOCKSTEP_SPIN_S = 0.001
"""How long env and rollout poll for each other's next item before sleeping (`Channel.create`'s `spin_s`): longer
than a simulator step or an inference, so that in steady state neither sleeps and each item is taken at once
instead of after a wake-up (benchmarks/handoff.py). Polling holds the waiting side's core, which nothing else needs
then: the actor never trains on cores that generation uses while it runs (`AsyncSchedule.overlap`), and a side whose
peer shares its cores does not poll at all."""
LOCKSTEP_SPIN = {"obs": LOCKSTEP_SPIN_S, "actions": LOCKSTEP_SPIN_S}

log = logging.getLogger(__name__)

Generated = tuple[list[EpisodeStats], int]
"""One generation phase: the episodes that finished, and the env steps taken."""


class Channels(NamedTuple):
    """The queues of generation, unbounded. Env and rollout take turns per stream, so each stream has at most two
    observations in flight (the last of a step and the first of the next, sent together) and one action: a bound
    could never bind, and would cost a credit frame back per item (benchmarks/handoff.py). Trajectories wait for the
    actor."""

    obs: Channel
    """env -> rollout: (observation, reward, done) per stream."""
    actions: Channel
    """rollout -> env: actions per stream."""
    trajectories: Channel
    """rollout -> actor: one `Trajectory` piece per stream and actor rank whose shard it overlaps."""


class EmbodiedRunner(Runner[Channels, Generated, None, dict[str, float]]):
    """Drives the env, rollout and actor groups through training steps."""

    family = FAMILY
    generators = ("env", "rollout")

    def __init__(
        self,
        cfg: EmbodiedConfig,
        *,
        actor: WorkerGroup,
        rollout: WorkerGroup,
        env: WorkerGroup,
        placement: ComponentPlacement,
        identity: dict[str, Any],
        context: RunContext,
        device_cores: dict[int, list[int]] | None = None,
        node_cores: dict[int, list[int]] | None = None,
    ) -> None:
        """`device_cores` (device -> its CPU cores, `Cluster.cores_by_device`) and `node_cores` (node -> its cores,
        `Cluster.cores_by_node`) go into profile.json with runner.profile=true."""
        offloadable = {name: getattr(cfg, name).enable_offload for name in COMPONENTS}
        groups = {"actor": actor, "rollout": rollout, "env": env}
        super().__init__(cfg, groups, PHASES, offloadable, placement, identity, context)
        self.cfg: EmbodiedConfig = cfg
        self.actor, self.rollout, self.env = actor, rollout, env
        self.device_cores = {} if device_cores is None else device_cores
        self.node_cores = {} if node_cores is None else node_cores
        self.recent_returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.total_env_steps = 0
        self.steps_before = 0
        """Env steps taken before this process's loop (by the run it resumed)."""
        self.generation_window = (0.0, 0.0)
        """Unix times the last generation phase began and ended (time/generation_efficiency)."""
        self.unreceived = 0
        """Batches generated that the actor has not been asked to take in yet (`receive_batches`)."""

    # --- the phases ---------------------------------------------------------------------------------------------

    def open_channels(self) -> AbstractContextManager[Channels]:
        return open_channels(Channels, spinning=LOCKSTEP_SPIN, obs=0, actions=0, trajectories=0)

    def serving(self) -> AbstractContextManager[object]:
        """The step's calls go through the mailboxes: a Ray call costs a round trip per call (benchmarks/handoff.py)."""
        return serve(self.env, self.rollout, self.actor)

    def sync_weights(self) -> None:
        wait_all(self.actor.sync_weights(), self.rollout.sync_weights())

    def generate(self, step: int, version: int, channels: Channels) -> Generated:
        """Env, rollout and actor together: observations and actions through two channels, stage by stage, and
        trajectories into the actor."""
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
    ) -> tuple[Generated, None, dict[str, float]]:
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
        return (episodes, sum(served)), None, train_stats[0]

    def receive_batches(self, channels: Channels) -> list[GroupFuture]:
        """Ask the actor to take in the batches generated since the last call. Only now: an actor already waiting
        for its trajectories during generation would unpickle them as they come, on a core that env or rollout may
        be using; asked afterwards, it takes in what its mailbox holds."""
        taken = [self.actor.recv_rollout_batch(channels.trajectories) for _ in range(self.unreceived)]
        self.unreceived = 0
        return taken

    def compute_advantages(self, channels: Channels) -> None:
        """Once the actor has taken in the batches generated (`receive_batches`, timed with this phase)."""
        wait_all(*self.receive_batches(channels), self.actor.compute_advantages_and_returns())

    def train(self, step: int) -> dict[str, float]:
        return self.actor.run_training(step).wait()[0]

    def record(
        self, t0: float, generated: list[Generated], advantages: None, trained: dict[str, Any]
    ) -> dict[str, float]:
        t1 = time.time()
        metrics = self.step_metrics(t0, t1)
        episodes = [episode for found, _ in generated for episode in found]
        env_steps = sum(served for _, served in generated)
        metrics["time/generation_efficiency"] = self.generation_efficiency()
        metrics.update(throughput_metrics(metrics["time/step"], self.placement.num_devices, env_steps=env_steps))
        metrics.update(self.timeline.utilization(t0, t1))
        metrics.update(trained)
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

    # --- around the steps ---------------------------------------------------------------------------------------

    def before_run(self) -> None:
        """The env steps the run's rate counts from: where this process's run began (a re-placed run's first
        placement)."""
        self.steps_before = self.total_env_steps if self.carried is None else int(self.carried.counters["steps_before"])

    def counters(self) -> dict[str, float]:
        return {"steps_before": self.steps_before}

    def should_stop(self) -> bool:
        stop = self.cfg.task.solved_return
        return (
            self.cfg.runner.stop_when_solved
            and stop is not None
            and len(self.recent_returns) == RETURN_WINDOW
            and self.mean_return() >= stop
        )

    def mean_return(self) -> float:
        return statistics.fmean(self.recent_returns) if self.recent_returns else float("nan")

    def finish(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        """The last step's metrics, env steps/s over the loop and the final return; then, with runner.profile=true
        and unless preempted (a preempted run must stop soon), the profile."""
        final = dict(metrics)
        final["run/env_steps_per_s"] = (self.total_env_steps - self.steps_before) / seconds
        final["final/return_last20"] = metrics.get("env/return_last20", math.nan)
        if self.cfg.runner.profile and not preemption.requested():
            self.write_profile()
        return final

    def write_profile(self) -> Path:
        """Time each component's unit of work alone, at several sizes, into profile.json (`profile.measure`)."""
        start = time.perf_counter()
        measured = profile.measure(
            self.cfg,
            self.placement,
            self.device_cores,
            self.node_cores,
            env=self.env,
            rollout=self.rollout,
            actor=self.actor,
            switch=self.switcher.before,
        )
        path = self.run_dir / profile.PROFILE_FILE
        path.write_text(json.dumps(measured, indent=2) + "\n")
        log.info(f"rlplace: profiled env, rollout and actor in {time.perf_counter() - start:.1f} s: {path}")
        return path

    # --- checkpoints --------------------------------------------------------------------------------------------

    def save_workers(self, folder: str) -> Iterable[GroupFuture]:
        """Actor weights, optimizer and RNGs; env simulators by global env index."""
        return self.actor.save_checkpoint(folder), self.env.save_checkpoint(folder)

    def load_workers(self, folder: str) -> Iterable[GroupFuture]:
        return self.actor.load_checkpoint(folder), self.env.load_checkpoint(folder)

    def state(self) -> dict[str, Any]:
        return {"total_env_steps": self.total_env_steps, "recent_returns": list(self.recent_returns)}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.total_env_steps = state["total_env_steps"]
        self.recent_returns.extend(state["recent_returns"])
