"""The reasoning step-time model: from one profiled run, the step time of any placement and staleness of the same
run.

A step is the weight sync, the phase switches (offload/onload), generation (rollout -> reward -> inference ->
actor, micro-batch by micro-batch), advantages and training. The generating units come from the profiled run's
timeline (`reasoning.profile`): one micro-batch of each stage, as its ranks would have needed it alone
(`planner.spans` takes out what processes sharing cores cost one another). A stage of R ranks generates M / R of a
step's M micro-batches per rank.

Collocated, the stages take turns: generation is each stage's busiest resource in turn, plus one round of the
driver's calls per stage. Apart, the stages run at once and micro-batches stream through them: generation is the
slowest stage's share plus one micro-batch of each of the others (filling and draining the pipeline), or the busiest
resource serving every stage's work, whichever is longer, plus one round of calls. Training is the busiest resource
serving the actor ranks: each rank's passes over its share of the rows and its optimizer steps, from the passes the
profile timed at several row counts, plus the per-rank overhead the profiled loop showed; with `max_staleness` >= 1 a
forward pass over the rank's batch for the proximal log-probs, and, with the actor on devices of its own, training
beside the next step's generation: as long as the longer, or as the busiest resource needs for both. The weight sync
costs the profiled run's, scaled where the new placement puts a receiving rank on the sender's cores and the
profiled one did not (or the other way round) by how much faster the profiled run's ranks off the sender's cores
took the weights; a phase switch waits for its slowest group's move, each as the profiled run's took
(`planner.switches`). What the profiled step leaves unexplained is added to every step, so that the model reproduces
the profiled run.

What the profile cannot say is an assumption, listed with each prediction.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlplace.core.errors import ConfigError
from rlplace.core.schedule import Switch, switch_plan
from rlplace.placement import ComponentPlacement, PlacementError
from rlplace.placement.cores import device_cores
from rlplace.planner import Curve, Prediction, Profile, Resources, Work, busiest
from rlplace.planner.layout import component_devices, process_resources
from rlplace.planner.profile import load_model as planner_load_model
from rlplace.planner.switches import SwitchCosts
from rlplace.reasoning.algorithms import ALGORITHMS
from rlplace.reasoning.checks import check_placement
from rlplace.reasoning.config import COMPONENTS, FAMILY, OFFLOAD_SWITCHES, ReasoningConfig
from rlplace.reasoning.memory import engine_splits
from rlplace.reasoning.phases import PHASES
from rlplace.reasoning.profile import TRAINING_SPANS, UNIT_SPANS, shape
from rlplace.reasoning.tasks import make_prompt_source

STAGES = ("rollout", "reward", "inference")
"""The generating stages, in pipeline order."""
FORWARD_SHARE = 1 / 3
"""A forward pass's share of a training pass (forward and backward; the backward costs about twice the forward)."""
DEFAULT_SWITCH_S = 0.01
"""A group's offload or onload when the profiled run moved none to measure."""


@dataclass(frozen=True)
class Layout:
    """Where each process runs (per component, one resource set per rank) and the devices each component holds."""

    processes: dict[str, list[Resources]]
    devices: dict[str, frozenset[int]]

    @property
    def overlap(self) -> bool:
        """Whether the actor's devices are its own, so an asynchronous step trains beside generation."""
        generating = frozenset().union(*(self.devices[name] for name in STAGES))
        return not self.devices["actor"] & generating

    @property
    def pipelined(self) -> bool:
        """Whether the stages run at once (as the runner does unless every component shares every device)."""
        return len({self.devices[name] for name in COMPONENTS}) > 1


class StepModel:
    """Predicts reasoning step times from one profiled run, calibrated so that it reproduces that run."""

    def __init__(self, profile: Profile) -> None:
        self.config: dict[str, Any] = profile.config
        self.device_type: str = profile.data["device_type"]
        self.cores = {int(d): tuple(c) for d, c in profile.data["devices"].items()}
        self.node_cores = {int(n): tuple(c) for n, c in profile.data.get("node_cores", {}).items()}
        names = [*UNIT_SPANS.values(), *TRAINING_SPANS]
        trace = profile.trace()
        work = trace.alone_work(self.cores, names)
        own = self.layout(profile.data["placement"], self.cores)
        self.unit = {
            name: work.get((name, span), 0.0) / _micro_batches(self.config) / _ranks_per_unit(self.config, name)
            for name, span in UNIT_SPANS.items()
        }
        """Seconds of one micro-batch of each stage, alone, on each rank that makes it (the ranks of an engine split
        over several all work on each of its micro-batches)."""
        # The passes were timed with every actor rank busy at once: a rank sharing its core ran at that share.
        sharers = max(_sharers(own.processes["actor"]), 1)
        actor = profile.data["actor"]
        self.pass_curve = Curve(tuple(actor["sizes"]), tuple(t / sharers for t in actor["seconds"]))
        self.optimizer_step = actor["optimizer_step"] / sharers
        self.row_tokens = actor["row_tokens"]
        """Tokens of a row (prompt and response), as the profiled run's were on average."""
        ranks = len(own.processes["actor"])
        proximal = ranks * self._proximal(self.config, ranks)
        self.advantages = max(0.0, work.get(("actor", "advantages"), 0.0) - proximal)
        """Seconds of a step's advantages over all actor ranks, alone, without the proximal log-probs."""
        self.update_overhead = work.get(("actor", "training"), 0.0) / ranks - self._update(self.config, ranks)
        """Seconds of a rank's update in the profiled run's loop beyond its passes and steps timed alone: the loss
        and its bookkeeping, the critic's passes, waiting for the other ranks at the averaging."""
        self.sync_s = profile.phases.get("sync_weights", 0.0)
        """The profiled run's weight sync."""
        self.local_sync = _sharing_sender(own)
        receive = trace.rank_seconds("rollout", "sync_weights")
        sender = own.processes["actor"][0]
        local = [s for rank, s in receive.items() if own.processes["rollout"][rank] & sender]
        remote = [s for rank, s in receive.items() if not own.processes["rollout"][rank] & sender]
        self.remote_over_local = statistics.median(remote) / statistics.median(local) if local and remote else None
        """How much faster a rank takes the weights from a sender on other cores than from one on its own (hand-offs
        between processes of one core wait for it to switch between them), where the profiled run had both."""
        self.call_s = (profile.phases["generate_rollouts"] - self._generation(self.config, own)) / _call_rounds(own)
        """Seconds of starting and collecting one round of stage calls (the driver's side of generation)."""
        switched = profile.phases.get("offload", 0.0) + profile.phases.get("onload", 0.0)
        self.switches = SwitchCosts.of(trace, _switch_plan(own, self.config["offload"]), switched)
        self.response_tokens = profile.metrics["rollout/response_tokens"]
        self.overhead = 0.0
        self.overhead = profile.phases["step"] - self.predict(self.config, own).step_s
        """What the profiled step took beyond the modelled phases: the driver's calls and the hand-offs."""

    def layout(self, placement: ComponentPlacement | Mapping[str, Any], cores: Mapping[int, tuple[int, ...]]) -> Layout:
        node_cores = self.node_cores if self.device_type != "cpu" else None
        return Layout(process_resources(placement, cores, node_cores), component_devices(placement))

    def _update(self, run: Mapping[str, Any], ranks: int) -> float:
        """One actor rank's update alone, from the timed passes: per minibatch, its passes over its share of the
        rows, then an optimizer step."""
        rows = run["prompts_per_step"] * run["group_size"] / run["num_minibatches"] / ranks
        passes = 1
        if run["max_tokens_per_micro_batch"]:
            tokens = rows * self.row_tokens
            passes = max(1, math.ceil(tokens / run["max_tokens_per_micro_batch"]))
        per_minibatch = passes * self.pass_curve.at(rows / passes) + self.optimizer_step
        return run["update_epochs"] * run["num_minibatches"] * per_minibatch

    def _proximal(self, run: Mapping[str, Any], ranks: int) -> float:
        """With `max_staleness` >= 1, a rank's forward pass over its batch for the proximal log-probs."""
        if not run["max_staleness"]:
            return 0.0
        return FORWARD_SHARE * self.pass_curve.at(run["prompts_per_step"] * run["group_size"] / ranks)

    def _stage_work(self, run: Mapping[str, Any], layout: Layout) -> dict[str, list[Work]]:
        """Each generating rank's busy seconds in a step, alone: its share of the micro-batches (its engine
        replica's)."""
        scale = _tokens(run) / _tokens(self.config)
        micro_batches = _micro_batches(run)
        work = {}
        for name in STAGES:
            procs = layout.processes[name]
            share = math.ceil(micro_batches / (len(procs) // _ranks_per_unit(run, name)))
            work[name] = [(p, share * self._unit(run, name, scale)) for p in procs]
        return work

    def _unit(self, run: Mapping[str, Any], name: str, scale: float) -> float:
        """A micro-batch's seconds on each rank that makes it, at the sizes of `run`: an engine split over more ranks
        than the profiled run's gives each of them less of it, in proportion."""
        split = _ranks_per_unit(self.config, name) / _ranks_per_unit(run, name)
        return self.unit[name] * scale * split * run["micro_batch_prompts"] / self.config["micro_batch_prompts"]

    def _generation(self, run: Mapping[str, Any], layout: Layout) -> float:
        """Generation's work: the stages in turn (collocated) or at once, micro-batches streaming through them."""
        stage_work = self._stage_work(run, layout)
        if not layout.pipelined:
            return sum(busiest(stage_work[name]) for name in STAGES)
        scale = _tokens(run) / _tokens(self.config)
        slowest = max(STAGES, key=lambda name: busiest(stage_work[name]))
        pipeline = busiest(stage_work[slowest]) + sum(self._unit(run, n, scale) for n in STAGES if n != slowest)
        return max(pipeline, busiest([w for name in STAGES for w in stage_work[name]]))

    def _sync(self, layout: Layout, assumptions: list[str]) -> float:
        """The weight sync: as the profiled run's, where a receiving rank shares the sender's cores in both or in
        neither; else scaled by how much faster a rank on other cores took the weights in the profiled run."""
        local = _sharing_sender(layout)
        if local == self.local_sync:
            assumptions.append("the weight sync costs what it cost the profiled run")
            return self.sync_s
        if self.remote_over_local is None:
            assumptions.append(
                "the weight sync costs what it cost the profiled run (which had no receiving rank on "
                + ("other cores than" if self.local_sync else "the cores of")
                + " the sender)"
            )
            return self.sync_s
        assumptions.append(
            "the weight sync scaled by how fast the profiled run's ranks on and off the sender's cores took the weights"
        )
        return self.sync_s / self.remote_over_local if local else self.sync_s * self.remote_over_local

    def predict(self, run: Mapping[str, Any], layout: Layout) -> Prediction:
        """The step of a run of sizes `run` (`reasoning.profile.shape`) placed as `layout`."""
        assumptions = ["a stage's micro-batch costs what it cost in the profiled run"]
        scale = _tokens(run) / _tokens(self.config)
        if scale != 1:
            assumptions.append("each stage's work scales with the response tokens of a step (profiled at other sizes)")
        profiled_split = _ranks_per_unit(self.config, "rollout")
        if _ranks_per_unit(run, "rollout") != profiled_split:
            assumptions.append(
                f"a micro-batch's generation divides evenly over the ranks its engine is split over (profiled split "
                f"over {profiled_split})"
            )
        profiled_lora = self.config.get("lora_rank", 0)  # profiles written before LoRA trained the whole policy
        # Profiles written before actor.lora.critic adapted a critic wherever they trained adapters.
        profiled_critic = self.config.get(
            "lora_critic", profiled_lora > 0 and ALGORITHMS[self.config["algorithm"]].critic
        )
        if (run.get("lora_rank", 0), run.get("lora_critic", False)) != (profiled_lora, profiled_critic):
            assumptions.append(
                "an update costs what it cost the profiled run, which trained "
                + (f"LoRA adapters of rank {profiled_lora}" if profiled_lora else "the whole policy")
                + (" on the policy and the critic" if profiled_critic else "")
            )
        profiled_alone = self.config.get("lora_sync") == "adapters"
        if (run.get("lora_sync") == "adapters") != profiled_alone:
            assumptions.append(
                "the weight sync and generation cost what they cost the profiled run, which "
                + ("sent LoRA adapters alone" if profiled_alone else "sent whole weights")
            )
        stage_work = self._stage_work(run, layout)
        generation = self._generation(run, layout) + self.call_s * _call_rounds(layout)
        actors = layout.processes["actor"]
        ranks = len(actors)
        per_rank = self._update(run, ranks) + self.update_overhead + self._proximal(run, ranks)
        per_rank += self.advantages * scale / ranks
        train_work: list[Work] = [(p, per_rank) for p in actors]
        training = busiest(train_work)
        switches = self.switches.seconds(_switch_plan(layout, run["offload"]), DEFAULT_SWITCH_S, assumptions)
        phases = {
            "sync_weights": self._sync(layout, assumptions),
            "switches": switches,
            "generate_rollouts": generation,
            "training": training,
        }
        work = generation + training
        if run["max_staleness"] and layout.overlap:
            both = [w for name in STAGES for w in stage_work[name]] + train_work
            work = max(generation, training, busiest(both))
            phases["overlapped"] = work
        step = phases["sync_weights"] + switches + work + self.overhead
        assumptions.append("an actor rank's passes and optimizer steps cost what they cost timed after the run")
        tokens = self.response_tokens * scale
        return Prediction(step, phases, {"tokens_per_s": tokens / step}, tuple(assumptions))


def _micro_batches(run: Mapping[str, Any]) -> int:
    return run["prompts_per_step"] // run["micro_batch_prompts"]


def _ranks_per_unit(run: Mapping[str, Any], name: str) -> int:
    """The ranks that make each micro-batch of stage `name` together: the rollout's engine replica (profiles written
    before `rollout.tensor_parallel_size` had one rank an engine); one rank otherwise."""
    return run.get("tensor_parallel_size", 1) if name == "rollout" else 1


def _sharers(processes: list[Resources]) -> int:
    """The most of these processes on one resource."""
    return int(busiest([(p, 1.0) for p in processes]))


def _sharing_sender(layout: Layout) -> bool:
    """Whether a rank that receives the weights shares resources with the sender (actor rank 0)."""
    sender = layout.processes["actor"][0]
    return any(p & sender for name in ("rollout", "inference") for p in layout.processes[name])


def _call_rounds(layout: Layout) -> int:
    """Rounds of stage calls the driver makes per step: one at once when the stages run together, one per stage
    (the actor's collection included) when they take turns."""
    return 1 if layout.pipelined else len(STAGES) + 1


def _tokens(run: Mapping[str, Any]) -> int:
    """The most response tokens a step can generate: what its work scales with."""
    return run["prompts_per_step"] * run["group_size"] * run["max_new_tokens"]


def _switch_plan(layout: Layout, offloadable: Mapping[str, bool]) -> dict[str, Switch]:
    """The offload and onload before each phase of a step placed as `layout`."""
    return switch_plan(PHASES, layout.devices, {name: bool(offloadable.get(name)) for name in COMPONENTS})


def cluster_cores(model: StepModel, cfg: ReasoningConfig) -> dict[int, tuple[int, ...]]:
    """Cores per device of the run's cluster: a cpu cluster is laid on the profiled machine's cores, every node
    like it; a GPU is a resource of its own (no cores)."""
    if cfg.cluster.device_type != "cpu":
        return {}
    machine = sorted({c for cores in model.cores.values() for c in cores})
    per_node = cfg.cluster.num_devices_per_node
    found = device_cores(machine, per_node, cfg.cluster.cpus_per_device)
    return {node * per_node + d: cores for node in range(cfg.cluster.num_nodes) for d, cores in enumerate(found)}


def predict_run(model: StepModel, cfg: ReasoningConfig, placement: ComponentPlacement) -> Prediction:
    """The predicted step of the run `cfg`, placed as `placement`, on its own cluster."""
    return model.predict(shape(cfg), model.layout(placement, cluster_cores(model, cfg)))


def layouts(num_devices: int) -> Iterator[dict[str, int | str]]:
    """Candidate placements of the four components on `num_devices` devices, one process per device each:
    collocated; each stage on its own devices (every split in four, pipeline order); generation and log-probs on the
    first devices and the actor and reward on the rest (the hybrid preset's split); the actor apart from the three
    generating stages; the rollout apart from the rest."""

    def span(first: int, last: int) -> int | str:
        return first if first == last else f"{first}-{last}"  # as Hydra reads either from the command line

    every = span(0, num_devices - 1)
    yield dict.fromkeys(COMPONENTS, every)
    for a in range(1, num_devices):
        for b in range(1, num_devices - a):
            for c in range(1, num_devices - a - b):
                cuts = (0, a, a + b, a + b + c, num_devices)
                parts = [span(cuts[i], cuts[i + 1] - 1) for i in range(4)]
                yield dict(zip(("rollout", "actor", "inference", "reward"), parts, strict=True))
    for k in range(1, num_devices):
        first, rest = span(0, k - 1), span(k, num_devices - 1)
        yield {"rollout": first, "inference": first, "actor": rest, "reward": rest}
        yield {"rollout": first, "reward": first, "inference": first, "actor": rest}
        yield {"rollout": first, "reward": rest, "inference": rest, "actor": rest}


@dataclass(frozen=True)
class Ranked:
    """One candidate of a search: what it runs, what it is predicted to do, and the overrides that run it."""

    mode: str
    component_placement: dict[str, int | str]
    offload: dict[str, bool]
    max_staleness: int
    prediction: Prediction
    tensor_parallel_size: int = 1
    """The rollout engine's split (`rollout.tensor_parallel_size`)."""

    @property
    def overrides(self) -> str:
        """The command line that runs it: each component's devices set one by one over the disaggregated preset,
        whose keys name one component each, each offload switch, and the rollout engine's split when it has one."""
        where = " ".join(
            f"cluster.component_placement.{name}={value}" for name, value in self.component_placement.items()
        )
        offload = " ".join(f"{name}.enable_offload={str(on).lower()}" for name, on in self.offload.items())
        split = f" rollout.tensor_parallel_size={self.tensor_parallel_size}" if self.tensor_parallel_size > 1 else ""
        return f"placement=reasoning_disaggregated {where} {offload}{split} runner.max_staleness={self.max_staleness}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "component_placement": self.component_placement,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_staleness": self.max_staleness,
            "prediction": self.prediction.to_dict(),
            "overrides": self.overrides,
        }


def shares(where: Mapping[str, int | str], name: str, placement: ComponentPlacement) -> bool:
    """Whether component `name` shares a device with another: then it offloads while the other works."""
    mine = set(placement.devices_of(name))
    return any(mine & set(placement.devices_of(other)) for other in where if other != name)


def offload_choices(
    cfg: ReasoningConfig, where: Mapping[str, int | str], placement: ComponentPlacement
) -> list[dict[str, bool]]:
    """The offload switches a candidate placement is tried with. Every component that shares a device offloads; with
    `cluster.device_memory_gb` and the model's shape (`model.path`) known, also each choice of keeping some of those
    the switch plan would move resident on their devices: fewer switches make a faster step, and the memory check
    leaves out the choices that do not fit. Without both nothing says what fits, so everything that can move does."""
    shared = {name: shares(where, name, placement) for name in OFFLOAD_SWITCHES}
    if cfg.cluster.device_memory_gb is None or cfg.model.path is None:
        return [shared]
    devices = {name: frozenset(placement.devices_of(name)) for name in COMPONENTS}
    plan = switch_plan(PHASES, devices, {**cfg.offloadable, **shared})
    moved = [name for name in OFFLOAD_SWITCHES if any(name in switch.offload for switch in plan.values())]
    choices = itertools.product((True, False), repeat=len(moved))
    return [{**shared, **dict(zip(moved, kept, strict=True))} for kept in choices]


def search(cfg: ReasoningConfig, model: StepModel) -> list[Ranked]:
    """Every candidate placement x offload switches (`offload_choices`) x staleness (0 and 1) the run could take on
    its cluster, fastest first.

    Candidates whose placement the run's checks refuse (`check_placement`: micro-batches that do not divide over the
    actor's ranks, device memory over `cluster.device_memory_gb`) or that would put more processes on a cpu node's
    cores than `cluster.max_oversubscription` allows are left out. Where the devices' memory is known, a candidate
    whose rollout engine does not fit at the run's split takes the smallest larger one that fits
    (`memory.engine_splits`): a split engine is for memory, and no profile says what its ranks' all-reduces cost."""
    nodes, per_node = cfg.cluster.num_nodes, cfg.cluster.num_devices_per_node
    cores = cluster_cores(model, cfg)
    machine = {c for found in cores.values() for c in found}
    limit = cfg.cluster.max_oversubscription * len(machine) if cores else None
    source = make_prompt_source(cfg.task)  # read once: the run's own checks read it too, candidates need not
    found = []
    for where in layouts(nodes * per_node):
        placement = ComponentPlacement(where, nodes, per_node, components=COMPONENTS)
        if limit is not None and sum(placement.get_world_size(c) for c in COMPONENTS) > limit * nodes:
            continue
        layout = model.layout(placement, cores)
        splits = [cfg.rollout.tensor_parallel_size]
        if cfg.cluster.device_memory_gb is not None:
            splits = engine_splits(cfg, placement.get_world_size("rollout"))
        for offload, staleness in itertools.product(offload_choices(cfg, where, placement), (0, 1)):
            for split in splits:
                placed = _placed(cfg, where, offload, split)
                candidate = replace(placed, runner=replace(cfg.runner, max_staleness=staleness))
                try:
                    check_placement(candidate, placement, source)
                except (ConfigError, PlacementError):
                    continue
                prediction = model.predict(shape(candidate), layout)
                found.append(Ranked(placement.mode, dict(where), offload, staleness, prediction, split))
                break
    return sorted(found, key=lambda r: r.prediction.step_s)


def load_model(profile_dir: str | Path, task: str) -> StepModel:
    """The step model of the profile in `profile_dir`, for runs of `task` (`planner.profile.load_model`)."""
    return planner_load_model(StepModel, profile_dir, FAMILY, task)


def place(cfg: ReasoningConfig, best: Ranked) -> ReasoningConfig:
    """The run placed as candidate `best` (`placement=auto`, a re-plan), with its offload switches and engine
    split."""
    return _placed(cfg, best.component_placement, best.offload, best.tensor_parallel_size)


def _placed(
    cfg: ReasoningConfig, where: Mapping[str, int | str], offload: Mapping[str, bool], split: int
) -> ReasoningConfig:
    """The run with its components at `where`, these offload switches and its rollout engine split over `split`
    ranks: a candidate of the search, and the run `placement=auto` starts."""
    offloaded = cfg.with_offload(offload)
    return replace(
        offloaded,
        cluster=replace(cfg.cluster, component_placement=dict(where)),
        rollout=replace(offloaded.rollout, tensor_parallel_size=split),
    )


def ranked(cfg: ReasoningConfig) -> list[Ranked]:
    """`plan.search`: the candidates of the run's cluster from `plan.profile`, fastest first."""
    return search(cfg, load_model(cfg.plan.profile, cfg.task.name))


def predict_placed(cfg: ReasoningConfig, placement: ComponentPlacement) -> Prediction:
    """The prediction of the run as placed, from `plan.profile` (ProfileError if the profile cannot serve it)."""
    return predict_run(load_model(cfg.plan.profile, cfg.task.name), cfg, placement)
