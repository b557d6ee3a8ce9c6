"""The one training loop: `Runner.run()` is the same for every task family; a family supplies its phases.

A step syncs the weights, generates rollouts, computes advantages and trains, in the order the asynchronous schedule
(`schedule.AsyncSchedule`) gives; before each phase the switch plan (`schedule.switch_plan`) offloads the idle groups
that share devices with the working ones and onloads the working ones. Around the steps the loop owns what every run
needs: the progress line, the hang deadline, logging, the timeline, history, checkpoint cadence and preemption.

A family subclasses `Runner` and fills in the abstract methods: how its groups sync, generate, compute advantages and
train, what a step records, what a checkpoint holds beyond the actor's state, and how the run ends. Each phase method
does only its phase; timing, switching and scheduling stay here, so both families are scheduled identically.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Generic, TypeVar

from rlplace.core import checkpoint, preemption
from rlplace.core.config import RunConfig
from rlplace.core.launcher import Carried, RunContext
from rlplace.core.schedule import AsyncSchedule, Phases, switch_plan
from rlplace.core.watchdog import HangDeadline
from rlplace.metrics import PhaseTimer, Timeline, TrainingProgress
from rlplace.placement import ComponentPlacement
from rlplace.scheduler import Channel, GroupFuture, WorkerGroup, wait_all

C = TypeVar("C")
"""A family's channels (a NamedTuple of `Channel`s)."""
G = TypeVar("G")
"""What one generation phase returns to the runner."""
A = TypeVar("A")
"""What the advantages phase returns."""
T = TypeVar("T")
"""What the training phase returns (train/* stats)."""

log = logging.getLogger(__name__)

TRAINING_SPANS = ("advantages", "training")
"""The actor's spans that `time/overlap` counts: training beside generation, not the weight sync its receivers
share with it in every placement."""
TIMELINE_FILE = "timeline.json"


class PhaseSwitcher:
    """Applies a switch plan to the run's worker groups, timing it as the step's `offload`/`onload` phases. A run may
    start only some of its family's components (a reasoning run that only evaluates): the plan is of those."""

    def __init__(
        self,
        groups: Mapping[str, WorkerGroup],
        placement: ComponentPlacement,
        phases: Phases,
        offloadable: Mapping[str, bool],
        timer: PhaseTimer,
    ) -> None:
        devices = {name: frozenset(placement.devices_of(name)) for name in groups}
        started = [(phase, frozenset(c for c in working if c in groups)) for phase, working in phases]
        self.plan = switch_plan(started, devices, offloadable)
        self.groups, self.timer = groups, timer

    def before(self, phase: str) -> None:
        switch = self.plan[phase]
        for action, names in (("offload", switch.offload), ("onload", switch.onload)):
            if names:
                with self.timer.phase(action):
                    wait_all(*(getattr(self.groups[name], action)() for name in names))


class Runner(ABC, Generic[C, G, A, T]):
    """Drives a run's worker groups through training steps; owns metrics, timeline, checkpoints and the schedule.

    `groups` are the run's worker groups by component name (the trainer is `actor`), placed as `placement`;
    `phases` the family's step phases with the components that hold device memory in each; `offloadable` which
    components may be offloaded; `identity` what a checkpoint must share with a run that resumes it (the launcher's
    `checkpoint_identity`), recorded in each checkpoint.
    """

    family: str
    """The family's name, recorded in checkpoints."""
    generators: tuple[str, ...]
    """The components that generate: their busy seconds are `time/<name>`, and async overlap is measured
    against them."""

    def __init__(
        self,
        cfg: RunConfig,
        groups: Mapping[str, WorkerGroup],
        phases: Phases,
        offloadable: Mapping[str, bool],
        placement: ComponentPlacement,
        identity: dict[str, Any],
        context: RunContext,
    ) -> None:
        self.cfg = cfg
        self.groups = dict(groups)
        self.placement, self.identity = placement, identity
        self.run_dir, self.logger, self.history = context.run_dir, context.logger, context.history
        self.predicted_step_s = context.predicted_step_s
        self.carried = context.carried
        self.timer = PhaseTimer()
        self.timeline = placement_timeline(placement, list(groups), context.timeline)
        self.switcher = PhaseSwitcher(self.groups, placement, phases, offloadable, self.timer)
        self.phase_names = [name for name, _ in phases]
        self.hang_deadline = HangDeadline(self.groups.values(), cfg.runner.hang_timeout_s)
        self.schedule = AsyncSchedule.of(placement, cfg.runner.max_staleness, cfg.runner.max_steps, trainer="actor")
        self.checkpoint_root = context.run_dir / checkpoint.FOLDER
        self.start_step = 0
        self.training_window: tuple[float, float] | None = None
        """When training ran beside generation this step: the window in which the actor's busy time is its
        time/training (the driver cannot time a phase it does not wait on alone)."""
        self.switch_started = 0.0
        """When `run` stopped for a re-placement (unix seconds): the switch's cost counts from here."""
        self.loop_start = 0.0
        """`time.perf_counter()` when the run's loop started: in its first placement, for a re-placed run."""

    # --- what a family supplies ---------------------------------------------------------------------------------

    @abstractmethod
    def open_channels(self) -> AbstractContextManager[C]:
        """The run's channels, open for the length of the loop (`open_channels`)."""

    @abstractmethod
    def sync_weights(self) -> None:
        """Actor rank 0 -> every group that generates with the actor's weights (timed as `sync_weights`)."""

    @abstractmethod
    def generate(self, step: int, version: int, channels: C) -> G:
        """The rollouts of `step`, generated with the weights of `version` updates; times itself as
        `generate_rollouts` (its stages may not end together)."""

    @abstractmethod
    def generate_while_training(self, ahead: int, step: int, channels: C) -> tuple[G, A, T]:
        """The rollouts of step `ahead` (weights `step`), while the actor computes advantages and trains on the batch
        of `step`, then takes in the new one; returns what `generate`, `compute_advantages` and `train` do."""

    @abstractmethod
    def compute_advantages(self, channels: C) -> A:
        """On the actor, once it took in the batches generated (timed as `advantages`)."""

    @abstractmethod
    def train(self, step: int) -> T:
        """The policy (and critic) update of `step` (timed as `training`)."""

    @abstractmethod
    def record(self, t0: float, generated: list[G], advantages: A, trained: T) -> dict[str, float]:
        """The step's metrics, from `t0` (the step's start, a Unix time); `step_metrics` gives the ones every family
        logs."""

    @abstractmethod
    def save_workers(self, folder: str) -> Iterable[GroupFuture]:
        """Ask the groups that hold state to write it into `folder` (a checkpoint's staging folder)."""

    @abstractmethod
    def load_workers(self, folder: str) -> Iterable[GroupFuture]:
        """Ask the groups that hold state to restore it from the checkpoint `folder`."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """The runner's own counters, for a checkpoint (JSON)."""

    @abstractmethod
    def restore(self, state: Mapping[str, Any]) -> None:
        """Take back the counters `state` saved."""

    @abstractmethod
    def finish(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        """The run's final metrics (`run/*` and the family's), from the last step's and the loop's wall seconds (from
        the loop's start in the run's first placement, for a re-placed run)."""

    def progress(self) -> TrainingProgress:
        return TrainingProgress(self.cfg.runner.max_steps)

    def before_run(self) -> None:
        """Before the first step of this process (a resumed run included)."""

    def after_step(self, step: int, metrics: dict[str, float], last: bool) -> None:
        """After `step` is recorded and before it is logged: a family adds what it measures between steps."""

    def should_stop(self) -> bool:
        """Whether the run is done before `runner.max_steps` (a solved task)."""
        return False

    def serving(self) -> AbstractContextManager[object]:
        """The context the loop runs in (the groups' calls through the mailboxes, say); nothing by default."""
        return nullcontext()

    # --- the loop -----------------------------------------------------------------------------------------------

    def init_workers(self) -> None:
        """Restore from `runner.resume` if it names a checkpoint (resolved and verified by the driver before
        anything started)."""
        if self.cfg.runner.resume is None:
            return
        resume = Path(self.cfg.runner.resume)
        wait_all(*self.load_workers(str(resume)))
        state = json.loads((resume / checkpoint.STATE_FILE).read_text())
        self.start_step = state["step"]
        self.restore(state)
        log.info(f"rlplace: resumed from {resume} at step {self.start_step}")

    def run(self, moves: Callable[[int], bool] | None = None) -> dict[str, float] | None:
        """Train `runner.max_steps` steps, or until the family stops it or the run is preempted (SIGTERM, Ctrl-C);
        returns the final metrics (`finish`). The last step is always checkpointed. `moves(steps done)`, asked after
        each step but the last: whether the run is re-placed there (`rlplace.replace.Schedule`); it then checkpoints
        and returns None, to go on elsewhere."""
        cfg = self.cfg.runner
        metrics: dict[str, float] = {}
        self.before_run()
        self.loop_start = time.perf_counter() if self.carried is None else self.carried.loop_start
        with self.open_channels() as channels, self.progress() as progress:
            progress.update(self.start_step)
            for step in range(self.start_step, cfg.max_steps):
                metrics = self.step(step, channels)
                self.hang_deadline.observe(metrics["time/step"])
                if self.predicted_step_s is not None:  # the prediction checked on every step
                    metrics["plan/predicted_step_s"] = self.predicted_step_s
                    metrics["plan/error"] = metrics["time/step"] / self.predicted_step_s - 1.0
                last = step + 1 == cfg.max_steps
                self.after_step(step, metrics, last)
                self.logger.log(metrics, step)
                self.timeline.write(self.run_dir / TIMELINE_FILE)  # readable while the run goes on
                self.history.append(metrics)
                progress.update(step + 1, metrics)
                done = last or self.should_stop() or preemption.requested()
                switch = not done and moves is not None and moves(step + 1)
                if switch:
                    self.switch_started = time.time()
                if switch or (
                    cfg.save_interval is not None
                    and (done or (cfg.save_interval and (step + 1) % cfg.save_interval == 0))
                ):
                    self.save_checkpoint(step + 1)
                if switch:
                    self.close_timeline()
                    return None
                if done:
                    break
        seconds = time.perf_counter() - self.loop_start
        self.close_timeline()
        return self.finish(metrics, seconds)

    def close_timeline(self) -> None:
        """Write the timeline with what was timed after the last step's record (its evaluation and checkpoint),
        which a step collects only at its end."""
        collect_spans(self.timer, self.timeline, self.groups.values())
        self.timeline.write(self.run_dir / TIMELINE_FILE)

    def carry(self) -> Carried:
        """For the runner of the run's next placement (after `run` stopped for a re-placement)."""
        return Carried(self.loop_start, self.counters())

    def counters(self) -> dict[str, float]:
        """The family's counters that its final rates count from (`Carried.counters`); none by default."""
        return {}

    def step(self, step: int, channels: C) -> dict[str, float]:
        """One training step, with K = runner.max_staleness.

        K = 0, synchronous: the generators get the weights of the previous `step` updates, generate this step's
        rollouts with them, and the actor trains on them. K > 0: this step's batch was generated K steps earlier
        (the first K, at step 0, with the initial weights); the generators get v(step) and generate step + K with
        it while the actor trains on this step's batch: side by side where the actor's devices are its own, in turn
        where it shares them. Either way the batch of step t comes from weights max(0, t - K), whatever the timing.
        """
        t0 = time.time()
        generated: list[G] = []
        with self.timer.phase("step"):
            self.update_rollout_weights()
            for early in self.schedule.before_training(step):
                self.switcher.before("generate_rollouts")
                generated.append(self.generate(early, step, channels))
            ahead = self.schedule.ahead(step)
            if ahead is not None and self.schedule.overlap:
                start = self.timer.now()
                made, advantages, trained = self.generate_while_training(ahead, step, channels)
                self.training_window = (start, self.timer.now())
                generated.append(made)
            else:
                if ahead is not None:
                    self.switcher.before("generate_rollouts")
                    generated.append(self.generate(ahead, step, channels))
                self.switcher.before("training")
                with self.timer.phase("advantages"):
                    advantages = self.compute_advantages(channels)
                with self.timer.phase("training"):
                    trained = self.train(step)
        return self.record(t0, generated, advantages, trained)

    def update_rollout_weights(self) -> None:
        """Switch for the weight sync, then sync (timed as `sync_weights`)."""
        self.switcher.before("sync_weights")
        with self.timer.phase("sync_weights"):
            self.sync_weights()

    def step_metrics(self, t0: float, t1: float) -> dict[str, float]:
        """What every family records of the step that ran from `t0` to `t1` (Unix times): time/* of the driver's
        phases and of each generator's busy seconds, the actor's training time when it ran beside generation, and
        its overlap with generation when asynchronous; on CUDA devices memory/* per device and phase."""
        metrics = self.timer.step_metrics()
        collect_spans(self.timer, self.timeline, self.groups.values())
        metrics.update(self.timeline.memory(t0, t1, self.phase_names))
        for name in self.generators:
            metrics[f"time/{name}"] = self.timeline.busy_seconds(name, t0, t1)
        if self.training_window is not None:
            metrics["time/training"] = self.timeline.busy_seconds("actor", *self.training_window)
            self.training_window = None
        if self.cfg.runner.max_staleness:
            metrics["time/overlap"] = self.timeline.overlap("actor", self.generators, t0, t1, spans_of_a=TRAINING_SPANS)
        return metrics

    def save_checkpoint(self, step: int) -> Path:
        """The groups' state and the runner's counters after `step` steps: one atomic folder; then older ones beyond
        runner.keep_checkpoints are removed."""
        with self.timer.phase("checkpoint"):
            tmp = checkpoint.staging_dir(self.checkpoint_root, step)
            wait_all(*self.save_workers(str(tmp)))
            state = {"family": self.family, "step": step, **self.state(), "identity": self.identity}
            (tmp / checkpoint.STATE_FILE).write_text(json.dumps(state))
            saved = checkpoint.commit(tmp)
            if self.cfg.runner.keep_checkpoints is not None:
                checkpoint.prune(saved, self.cfg.runner.keep_checkpoints)
            return saved


@contextmanager
def open_channels(kind: type[C], spinning: Mapping[str, float] | None = None, **maxsizes: int) -> Iterator[C]:
    """Create one channel per field of `kind` (a NamedTuple of Channels) with the given bounds; close them after.

    `maxsize` 0 is unbounded. `spinning` gives channels whose readers poll before sleeping, and how long
    (`Channel.create`'s `spin_s`)."""
    spin = {} if spinning is None else spinning
    opened = {name: Channel.create(name, maxsize, spin.get(name, 0.0)) for name, maxsize in maxsizes.items()}
    try:
        yield kind(**opened)
    finally:
        for channel in opened.values():
            channel.close()


def placement_timeline(
    placement: ComponentPlacement, components: Sequence[str], earlier: Timeline | None = None
) -> Timeline:
    """A timeline with one row per device, knowing which devices each rank of each component runs on (`earlier`:
    a re-placed run's timeline so far, which goes on with this placement's devices).

    Components go in in the placement's config order, which is the order in which each trace row names its
    components ("device 0: actor, env"), as the run's start line and `rlplace-plan` do.
    """
    devices = {
        (name, p.rank): p.devices
        for name in sorted(components, key=placement.components.index)
        for p in placement.get_placements(name)
    }
    if earlier is None:
        return Timeline(devices, num_devices=placement.num_devices)
    earlier.remap(devices, num_devices=placement.num_devices)
    return earlier


def collect_spans(timer: PhaseTimer, timeline: Timeline, groups: Iterable[WorkerGroup]) -> None:
    """Move the step's driver phases and every worker's timed spans onto the timeline."""
    timeline.extend(timer.drain_spans())
    for group in groups:
        for spans in group.pop_timings().wait():
            timeline.extend(spans)
