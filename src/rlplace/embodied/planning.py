"""The embodied step-time model: from one profile, the step time of any placement, stage count and staleness.

A step is sync_weights, the phase switches (offload/onload), generation, advantages and training. The unit costs
come from the profile's curves, measured uncontended by the profiled run's workers: one env step of n sub-envs in a
process, one inference on n observations, one minibatch update on n samples, one gradient averaging. Processes busy
at the same time on shared resources (cores of a cpu cluster's devices, a GPU) finish no sooner than their most
loaded resource can serve all their work (`planner.busiest`).

Generation, per env step, with E env processes, R rollout processes and S stages (a stream is one env process's
share of one stage, n = N / (E S) sub-envs; a rollout process serves m = E S / R streams):
streams go round independently (while a rollout serves one stream, the other streams' envs step), so a cycle takes
the busiest resource's time for S env steps per env process and m inferences per rollout process, or one stream's
round trip (its env step, then its inference), whichever is longer; each side's unit with half a hop (a hop passes
observations to the rollout and actions back: work at both ends). With one env process at 1 stage that is env and
rollout taking turns. Plus, per step, starting and collecting each generation process's method. Each unit costs what
it cost inside the profiled run's loop relative to alone (its spans, where its process had its cores to itself); the
hop and the per-minibatch overhead of training are calibrated on the profiled run, so that the model reproduces it;
the call overhead is read off its timeline. Processes on cpu devices run on their cores; processes on a GPU or in a
node group are CPU work on a core of their node each (their units, small policies' kernel launches and simulators,
are CPU-bound: the GPU is not modelled as shared).

Training is epochs x minibatches x (one update of the rank's share of a minibatch + averaging + that overhead) per
actor rank, on the busiest resource. With `max_staleness` >= 1 the actor also computes proximal
log-probs (a forward pass over its batch), and where its devices are its own, generation and training run side by
side: as long as the longer of the two, or as the busiest resource needs for both.

What the profile cannot say is an assumption, listed with each prediction.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlplace.core.errors import ConfigError
from rlplace.core.schedule import Switch, switch_plan
from rlplace.embodied.checks import check_embodied
from rlplace.embodied.config import COMPONENTS, FAMILY, EmbodiedConfig
from rlplace.embodied.phases import PHASES
from rlplace.placement import ComponentPlacement, PlacementError
from rlplace.placement.cores import device_cores
from rlplace.planner import Prediction, Profile, Resources, Work, busiest
from rlplace.planner.layout import component_devices, process_resources
from rlplace.planner.profile import load_model as planner_load_model
from rlplace.planner.switches import SwitchCosts
from rlplace.scheduler.limits import SMALL_BYTES

DEFAULT_AVERAGE_S = 0.25e-3
"""Seconds of gradient averaging per minibatch per extra rank when the profile had one actor rank: the order of
the mailbox averaging of a small MLP (benchmarks/actor_update.py measures it)."""
FORWARD_SHARE = 1 / 6
"""The proximal log-probs' share of one minibatch update, per minibatch of samples: a forward pass of the actor
alone, half of the forward pass of actor and critic, which is about a third of an update (the backward pass costs
about twice the forward); benchmarks/planner_accuracy.py checks the predictions that use it."""
DEFAULT_SWITCH_S = 2e-3
"""A group's offload or onload when the profiled run moved none to measure."""


@dataclass(frozen=True)
class Shape:
    """The work of one step, from the run config."""

    total_num_envs: int
    num_steps: int
    stages: int
    update_epochs: int
    num_minibatches: int
    max_staleness: int

    @classmethod
    def of(cls, cfg: EmbodiedConfig) -> Shape:
        return cls(
            cfg.task.total_num_envs,
            cfg.rollout.num_steps,
            cfg.rollout.pipeline_stage_num,
            cfg.algorithm.update_epochs,
            cfg.algorithm.num_minibatches,
            cfg.runner.max_staleness,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Shape:
        return cls(
            data["total_num_envs"],
            data["num_steps"],
            data["pipeline_stage_num"],
            data["update_epochs"],
            data["num_minibatches"],
            data["max_staleness"],
        )


@dataclass(frozen=True)
class Layout:
    """Where each process runs: per component, one resource set per rank; the devices each component holds."""

    processes: dict[str, list[Resources]]
    devices: dict[str, frozenset[int]]

    @classmethod
    def of(
        cls,
        placement: ComponentPlacement | Mapping[str, Any],
        cores: Mapping[int, Sequence[int]],
        node_cores: Mapping[int, Sequence[int]] | None = None,
    ) -> Layout:
        """From a placement (or its `to_dict()`), the cores of each device of a cpu cluster, and each node's cores
        (`planner.layout.process_resources` says where each process runs)."""
        return cls(process_resources(placement, cores, node_cores), component_devices(placement))

    @property
    def overlap(self) -> bool:
        """Whether the actor's devices are its own, so an asynchronous step trains beside generation."""
        return not self.devices["actor"] & (self.devices["env"] | self.devices["rollout"])


class StepModel:
    """Predicts embodied step times from one profile, calibrated so that it reproduces the profiled run."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.env, self.rollout, self.actor = (profile.curve(name) for name in COMPONENTS)
        self.average = profile.data.get("average")
        self.cores = {int(d): tuple(c) for d, c in profile.data["devices"].items()}
        self.device_type = profile.data.get("device_type", "cpu")
        self.node_cores = {int(n): tuple(c) for n, c in profile.data.get("node_cores", {}).items()}
        """Each profiled node's cores (older profiles lack them: each unpinned process then has a core of its own)."""
        own_shape = Shape.from_dict(profile.config)
        own = Layout.of(profile.data["placement"], self.cores, self.node_cores)
        self.own_rollouts = len(own.processes["rollout"])
        self.env_loop, self.rollout_loop = (self._in_loop(own_shape, own, name) for name in ("env", "rollout"))
        self.own_samples_per_rank = _samples_per_rank(own_shape, len(own.processes["actor"]))
        self.call_overhead_s = profile.generation_overhead_s / (len(own.processes["env"]) + self.own_rollouts)
        """Starting and collecting one worker method of generation (a Ray call each way)."""
        measured = profile.phases
        self.hop_s = _solve(lambda h: self._generation(own_shape, own, h), measured["generate_rollouts"])
        self.minibatch_s = _solve(lambda o: self._training(own_shape, own, o), measured["training"])
        switched = measured.get("offload", 0.0) + measured.get("onload", 0.0)
        self.switches = SwitchCosts.of(profile.trace(), _switch_plan(own, profile.config.get("offload", {})), switched)
        self.fixed = {name: measured.get(name, 0.0) for name in ("sync_weights", "advantages")}
        explained = sum(self.fixed.values()) + measured["generate_rollouts"] + measured["training"] + switched
        self.step_overhead_s = max(0.0, measured["step"] - explained)

    def _in_loop(self, shape: Shape, own: Layout, name: str) -> float:
        """How much longer (or shorter) `name`'s unit took inside the profiled run's loop than alone: its rank 0's
        seconds in its generation spans per step over its units' cost. The loop adds what the unit alone leaves out
        (bookkeeping around it, a simulator's state out of cache between calls). Read only where that rank had its
        cores to itself, so the spans hold no contention, which the model adds per placement; 1 otherwise."""
        seconds = self.profile.loop_s.get(name)
        first = own.processes[name][0]
        shared = any(first & other for group in own.processes.values() for other in group if other is not first)
        if seconds is None or shared:
            return 1.0
        envs = len(own.processes["env"])
        n = shape.total_num_envs / (envs * shape.stages)
        if name == "env":
            units = shape.stages * shape.num_steps * self.env.at(n)
        else:
            units = envs * shape.stages / self.own_rollouts * (shape.num_steps + 1) * self.rollout.at(n)
        return seconds / units

    def plan_node_cores(self, device_type: str) -> dict[int, tuple[int, ...]] | None:
        """The node cores to place another run's unpinned processes on: the profiled node's, for a cluster of the
        same device type (every node like it); unknown (a core each) for another type."""
        return self.node_cores if device_type == self.device_type and self.node_cores else None

    def machine_cores(self) -> list[int]:
        """The profiled machine's cores, for placing a cpu cluster of another shape on it."""
        return sorted({c for cores in self.cores.values() for c in cores})

    def predict(self, shape: Shape, layout: Layout, offloadable: Mapping[str, bool], gpu: bool = False) -> Prediction:
        """The step of `shape` placed as `layout` (`gpu`: on a gpu cluster)."""
        assumptions = []
        generation = self._generation(shape, layout, self.hop_s)
        training = self._training(shape, layout, self.minibatch_s, assumptions)
        switches = self.switches.seconds(_switch_plan(layout, offloadable), DEFAULT_SWITCH_S, assumptions)
        share = _samples_per_rank(shape, len(layout.processes["actor"])) / self.own_samples_per_rank
        advantages = self.fixed["advantages"] * share
        phases = {
            "sync_weights": self.fixed["sync_weights"] * len(layout.processes["rollout"]) / self.own_rollouts,
            "switches": switches,
            "generate_rollouts": generation,
            "advantages": advantages,
            "training": training,
        }
        work = generation + training
        if shape.max_staleness and layout.overlap:
            work = self._side_by_side(shape, layout, generation, training)
            phases["overlapped"] = work
        step = phases["sync_weights"] + switches + work + advantages + self.step_overhead_s
        assumptions.append("weight sync costs the profiled run's per rollout rank; the step's own overhead as there")
        if gpu:
            assumptions.append("a GPU runs a unit of work as fast as the profiled device, its kernels not the bound")
        if gpu != (self.device_type == "gpu"):
            assumptions.append(
                f"profiled on {self.device_type} devices: each process off cpu devices finds a core of its own"
            )
        rate = shape.total_num_envs * shape.num_steps / step
        return Prediction(step, phases, {"env_steps_per_s": rate}, tuple(assumptions))

    def _generation_work(self, shape: Shape, layout: Layout, hop: float) -> tuple[list[Work], float]:
        """Each generation process's busy seconds in one env step, uncontended, and one stream's round trip."""
        envs, rollouts = layout.processes["env"], layout.processes["rollout"]
        streams = len(envs) * shape.stages
        n, m = shape.total_num_envs / streams, streams / len(rollouts)
        env_side = self.env.at(n) * self.env_loop + hop / 2  # a hop is work at both ends: packing and unpacking
        infer_side = self.rollout.at(n) * self.rollout_loop + hop / 2
        work = [(p, shape.stages * env_side) for p in envs] + [(p, m * infer_side) for p in rollouts]
        return work, env_side + infer_side

    def _generation(self, shape: Shape, layout: Layout, hop: float) -> float:
        work, round_trip = self._generation_work(shape, layout, hop)
        # Streams go round independently: while a rollout serves one, the others' envs step (with several env
        # processes, also at 1 stage). The busiest resource, or one stream's round trip, sets the pace.
        cycle = max(busiest(work), round_trip)
        calls = self.call_overhead_s * len(work)
        return (shape.num_steps + 1) * cycle + calls

    def _training_work(
        self, shape: Shape, layout: Layout, per_minibatch: float, assumptions: list[str] | None = None
    ) -> list[Work]:
        """Each actor rank's busy seconds in one update, uncontended."""
        actors = layout.processes["actor"]
        ranks = len(actors)
        samples = shape.total_num_envs * shape.num_steps / shape.num_minibatches / ranks
        average = self._average(ranks, assumptions)
        update = self.actor.at(samples)
        seconds = shape.update_epochs * shape.num_minibatches * (update + average + per_minibatch)
        if shape.max_staleness:  # the proximal log-probs: a forward pass over the rank's batch
            seconds += shape.num_minibatches * update * FORWARD_SHARE
            if assumptions is not None:
                assumptions.append(f"a forward pass costs {FORWARD_SHARE:.2f} of an update (proximal log-probs)")
        return [(p, seconds) for p in actors]

    def _average(self, ranks: int, assumptions: list[str] | None) -> float:
        """One gradient averaging over `ranks` ranks, scaled from the profiled one: rank to rank (small gradients)
        moves ranks - 1 copies, a ring about 2 (ranks - 1) / ranks."""
        if ranks == 1:
            return 0.0
        if not self.average:
            if assumptions is not None:
                assumptions.append(f"gradient averaging {DEFAULT_AVERAGE_S * 1e3:.2f} ms per extra rank (not profiled)")
            return DEFAULT_AVERAGE_S * (ranks - 1)
        measured, profiled = self.average["seconds"], self.average["ranks"]
        if self.average.get("bytes", 0) > SMALL_BYTES:
            return measured * ((ranks - 1) / ranks) / ((profiled - 1) / profiled)
        return measured * (ranks - 1) / (profiled - 1)

    def _training(
        self, shape: Shape, layout: Layout, per_minibatch: float, assumptions: list[str] | None = None
    ) -> float:
        return busiest(self._training_work(shape, layout, per_minibatch, assumptions))

    def _side_by_side(self, shape: Shape, layout: Layout, generation: float, training: float) -> float:
        """Generation and training at once: as long as the longer of the two, or as the busiest resource needs to
        serve both sides' work (a core that generation leaves idle between hand-offs trains meanwhile)."""
        per_step, _ = self._generation_work(shape, layout, self.hop_s)
        steps = shape.num_steps + 1
        both = [(p, seconds * steps) for p, seconds in per_step] + self._training_work(shape, layout, self.minibatch_s)
        return max(generation, training, busiest(both))


def _samples_per_rank(shape: Shape, ranks: int) -> float:
    return shape.total_num_envs * shape.num_steps / ranks


def _switch_plan(layout: Layout, offloadable: Mapping[str, bool]) -> dict[str, Switch]:
    """The offload and onload before each phase of a step placed as `layout`."""
    devices = {name: layout.devices[name] for name in COMPONENTS}
    return switch_plan(PHASES, devices, {name: bool(offloadable.get(name)) for name in COMPONENTS})


def _solve(predict: Any, measured: float, low: float = 0.0, high: float = 1.0) -> float:
    """The x in [low, high] where the increasing `predict(x)` meets `measured` (bisection; low if never)."""
    if predict(low) >= measured:
        return low
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if predict(mid) < measured else (low, mid)
    return low


def cpu_cores(model: StepModel, num_nodes: int, devices_per_node: int) -> dict[int, tuple[int, ...]]:
    """Each (global) logical device's cores for a cpu cluster of this shape, every node like the profiled one."""
    per_node = device_cores(model.machine_cores(), devices_per_node, None)
    return {node * devices_per_node + d: cores for node in range(num_nodes) for d, cores in enumerate(per_node)}


def layouts(num_devices: int) -> Iterator[dict[str, str]]:
    """Candidate placements of env, rollout and actor on `num_devices` devices, one process per device each:
    collocated; disaggregated (every split of the devices in three); hybrid (actor on all, env and rollout
    split; or env and rollout together, actor on the rest)."""

    def span(first: int, last: int) -> str:
        return str(first) if first == last else f"{first}-{last}"

    every = span(0, num_devices - 1)
    yield {"actor": every, "env": every, "rollout": every}
    for e in range(1, num_devices - 1):
        for r in range(1, num_devices - e):
            yield {"env": span(0, e - 1), "rollout": span(e, e + r - 1), "actor": span(e + r, num_devices - 1)}
    for e in range(1, num_devices):
        yield {"env": span(0, e - 1), "rollout": span(e, num_devices - 1), "actor": every}
        yield {"env": span(0, e - 1), "rollout": span(0, e - 1), "actor": span(e, num_devices - 1)}


@dataclass(frozen=True)
class Ranked:
    """One candidate of a search: what it runs, what it is predicted to do, and the overrides that run it."""

    mode: str
    component_placement: dict[str, str]
    stages: int
    max_staleness: int
    prediction: Prediction

    @property
    def overrides(self) -> str:
        placement = ", ".join(f'{name}: "{value}"' for name, value in self.component_placement.items())
        return (
            f"placement=hybrid 'cluster.component_placement={{{placement}}}' "
            f"rollout.pipeline_stage_num={self.stages} runner.max_staleness={self.max_staleness}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "component_placement": self.component_placement,
            "stages": self.stages,
            "max_staleness": self.max_staleness,
            "prediction": self.prediction.to_dict(),
            "overrides": self.overrides,
        }


def load_model(profile_dir: str | Path, env_id: str) -> StepModel:
    """The step model of the profile in `profile_dir`, for runs of `env_id` (`planner.profile.load_model`)."""
    return planner_load_model(StepModel, profile_dir, FAMILY, env_id)


def predict_run(model: StepModel, cfg: EmbodiedConfig, placement: ComponentPlacement) -> Prediction:
    """The predicted step of the run `cfg`, placed as `placement`, on its own cluster."""
    gpu = cfg.cluster.device_type == "gpu"
    layout = Layout.of(placement, cluster_cores(model, cfg), model.plan_node_cores(cfg.cluster.device_type))
    return model.predict(Shape.of(cfg), layout, offloadable(cfg), gpu)


def offloadable(cfg: EmbodiedConfig) -> dict[str, bool]:
    return {name: getattr(cfg, name).enable_offload for name in COMPONENTS}


def cluster_cores(model: StepModel, cfg: EmbodiedConfig) -> dict[int, tuple[int, ...]]:
    """Cores per device of the run's cluster: a cpu cluster is laid on the profiled machine's cores; a GPU is a
    resource of its own (no cores)."""
    if cfg.cluster.device_type != "cpu":
        return {}
    return cpu_cores(model, cfg.cluster.num_nodes, cfg.cluster.num_devices_per_node)


def place(cfg: EmbodiedConfig, best: Ranked) -> EmbodiedConfig:
    """The run placed and staged as candidate `best` (`placement=auto`, a re-plan), with the offload switches of the
    hybrid preset its override line names."""
    return replace(
        cfg,
        cluster=replace(cfg.cluster, component_placement=dict(best.component_placement)),
        rollout=replace(cfg.rollout, pipeline_stage_num=best.stages, enable_offload=True),
        env=replace(cfg.env, enable_offload=True),
        actor=replace(cfg.actor, enable_offload=True),
    )


def ranked(cfg: EmbodiedConfig) -> list[Ranked]:
    """`plan.search`: the candidates of the run's cluster from `plan.profile`, fastest first."""
    return search(cfg, load_model(cfg.plan.profile, cfg.task.env_id))


def predict_placed(cfg: EmbodiedConfig, placement: ComponentPlacement) -> Prediction:
    """The prediction of the run as placed, from `plan.profile` (ProfileError if the profile cannot serve it)."""
    return predict_run(load_model(cfg.plan.profile, cfg.task.env_id), cfg, placement)


def search(cfg: EmbodiedConfig, model: StepModel, stages: Sequence[int] = (1, 2, 4)) -> list[Ranked]:
    """Every candidate placement x stages x staleness (0 and 1) the run could take on its cluster, fastest first.

    Candidates the run's checks refuse (envs that do not divide, say) or that would put more processes on a cpu
    node's cores than `cluster.max_oversubscription` allows are left out.
    """
    nodes, per_node = cfg.cluster.num_nodes, cfg.cluster.num_devices_per_node
    cores = cluster_cores(model, cfg)
    gpu = cfg.cluster.device_type == "gpu"
    limit = cfg.cluster.max_oversubscription * len(model.machine_cores()) if cores else None
    found = []
    for where in layouts(nodes * per_node):
        placement = ComponentPlacement(where, nodes, per_node, components=COMPONENTS)
        if limit is not None and sum(placement.get_world_size(c) for c in COMPONENTS) > limit * nodes:
            continue
        layout = Layout.of(placement, cores, model.plan_node_cores(cfg.cluster.device_type))
        for num_stages in stages:
            for staleness in (0, 1):
                try:
                    candidate = replace(
                        cfg,
                        rollout=replace(cfg.rollout, pipeline_stage_num=num_stages),
                        runner=replace(cfg.runner, max_staleness=staleness),
                    )
                    check_embodied(candidate, placement)
                except (ConfigError, PlacementError):
                    continue
                prediction = model.predict(Shape.of(candidate), layout, offloadable(cfg), gpu)
                found.append(Ranked(placement.mode, where, num_stages, staleness, prediction))
    return sorted(found, key=lambda r: r.prediction.step_s)
