"""`WorkerGroup`: the driver's handle on the ranks of one component, and the explicit fan-out of method calls.

`group.method(*args)` calls `method` on every rank and returns one `GroupFuture`; `group.execute_on(0, 2).method()`
calls a subset. Names are resolved in `__getattr__` against the worker class's public methods, so a typo fails at the
call site with the list of valid methods rather than inside a remote process. Launching checks the placements against
the cluster before any actor starts, then has each rank's process (`hosts.Host`: a new Ray actor in the cluster's
reservation of the rank's device, asking for its share of it, or one a switch kept there: `Cluster.hosts`) become
the worker. `launch` starts one group and waits for it; a run with several groups `start`s them all and then
`wait_started` waits for all at once, so that their processes start side by side.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from rlplace.placement.placement import Placement
from rlplace.placement.strategies import PlacementStrategy
from rlplace.scheduler.context import WorkerContext, worker_env
from rlplace.scheduler.future import GroupFuture, wait_all
from rlplace.scheduler.hosts import HostProcess, pickle_worker_class, stop
from rlplace.scheduler.transport import CallTransport, RayCalls

if TYPE_CHECKING:
    from rlplace.scheduler.cluster import Cluster
    from rlplace.scheduler.worker import Worker

GRACEFUL_EXIT_S = 3.0
"""How long `terminate` lets workers finish their current call and exit before killing them."""
LAUNCH_DEADLINE_MIN_S = 120.0
"""Least time a rank's `__init__` gets under a hang deadline: starting a process, importing torch and building a
model on a busy machine can take far longer than a training step."""


_GROUP_ATTRIBUTES = frozenset(
    {
        "name",
        "worker_cls",
        "placements",
        "workers",
        "terminated",
        "world_size",
        "execute_on",
        "terminate",
        "call_timeout_s",
        "serving",
        "transport",
        "ray_calls",
        "processes",
        "hosts",
    }
)
"""WorkerGroup's own attributes; a worker method of the same name could not be called through the group."""


@dataclass(frozen=True)
class WorkerGroupSpec:
    """A worker class with its constructor arguments, ready to be launched as a group (`Worker.create_group`)."""

    worker_cls: type[Worker]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def launch(
        self, cluster: Cluster, name: str, placement_strategy: PlacementStrategy | Sequence[Placement]
    ) -> WorkerGroup:
        """Start one actor per placement and return once every rank's `__init__` finished.

        Raises ValueError for placements the cluster cannot hold or a name already in use (before any actor
        starts), and WorkerError when a rank's `__init__` fails (the group is then torn down).
        """
        return wait_started(self.start(cluster, name, placement_strategy))[0]

    def start(
        self, cluster: Cluster, name: str, placement_strategy: PlacementStrategy | Sequence[Placement]
    ) -> StartingGroup:
        """Start one actor per placement and return without waiting for their `__init__`; `wait_started` waits.

        Starting every group of a run first and then waiting for all of them lets their processes start, import
        torch and build their models in parallel, instead of one group after another. Raises ValueError like
        `launch`, before any actor of this group starts.
        """
        placements = _resolve_placements(placement_strategy, cluster, name)
        methods = public_methods(self.worker_cls)
        shadowed = sorted(methods & _GROUP_ATTRIBUTES)
        if shadowed:
            raise TypeError(f"{self.worker_cls.__name__} methods {shadowed} are WorkerGroup attributes; rename them")
        cluster.check_group_name(name)
        cluster.reserve()  # may wait for the devices: before picking a free port
        uid = f"{name}-{uuid.uuid4().hex[:8]}"
        ray.get(cluster.rendezvous.register_group.remote(name, uid, len(placements)))
        master_addr = cluster.node_ip(placements[0].node_rank)
        master_port = cluster.free_port(placements[0].node_rank)
        contexts = [
            WorkerContext(
                group_name=name,
                group_uid=uid,
                placement=placement,
                device_type=cluster.device_type,
                cores=_cores(cluster, placement),
                rendezvous=cluster.rendezvous.address,
            )
            for placement in placements
        ]
        envs = [worker_env(context, master_addr, master_port) for context in contexts]
        hosts = cluster.hosts(placements, envs, self.worker_cls.__name__)
        worker_cls = pickle_worker_class(self.worker_cls)
        # A process that started with its rank's environment (on a node with GPUs, `Cluster.hosts`) is not given it.
        ready = [
            host.actor.become.remote(worker_cls, None if cluster.has_gpus else env, self.args, self.kwargs)
            for host, env in zip(hosts, envs, strict=True)
        ]
        group = WorkerGroup(name, self.worker_cls, placements, hosts, methods, cluster.call_timeout_s)
        cluster.add_group(group)
        deadline = None if cluster.call_timeout_s is None else max(cluster.call_timeout_s, LAUNCH_DEADLINE_MIN_S)
        init = group.ray_calls.track("__init__", range(len(hosts)), ready)
        return StartingGroup(group, GroupFuture(name, "__init__", init, deadline))


@dataclass(frozen=True)
class StartingGroup:
    """A group whose ranks are starting (`WorkerGroupSpec.start`): the group, and the future of every rank's
    `__init__`."""

    group: WorkerGroup
    init: GroupFuture


def wait_started(*starting: StartingGroup) -> list[WorkerGroup]:
    """Wait until every rank of every group has finished its `__init__`; returns the groups in the order given.

    Raises WorkerError for the first `__init__` found failed and WorkerTimeout after the launch deadline; then,
    and on Ctrl-C, every one of these groups is torn down, so a failed launch leaves none of them running.
    """
    try:
        processes = wait_all(*(s.init for s in starting))
    except BaseException:
        terminate_groups([s.group for s in starting])
        raise
    for s, found in zip(starting, processes, strict=True):
        s.group.processes = found
    return [s.group for s in starting]


class WorkerGroup:
    """The ranks of one launched worker group; every public worker method is callable on it and returns a future.

    `name`, `world_size`, `placements` (one per rank) and `workers` (the Ray actor handles, by rank) describe it.
    """

    def __init__(
        self,
        name: str,
        worker_cls: type[Worker],
        placements: list[Placement],
        hosts: list[HostProcess],
        methods: frozenset[str],
        call_timeout_s: float | None = None,
    ) -> None:
        self.name = name
        self.call_timeout_s = call_timeout_s
        """The deadline of every call's future when waited on without a timeout (None: no deadline)."""
        self.worker_cls = worker_cls
        self.placements = placements
        self.hosts = hosts
        """The ranks' processes (`hosts.py`), by rank."""
        self.workers = [host.actor for host in hosts]
        self.terminated = False
        self.ray_calls = RayCalls(name, self.workers)
        """The group's default transport: one Ray actor call per rank."""
        self.transport: CallTransport = self.ray_calls
        """How calls reach the ranks now: `ray_calls`, or while the group is served (`rlplace.scheduler.serving.serve`)
        its `ServedCalls`, through the mailboxes."""
        self._methods = methods
        self.processes: list[tuple[str, int]] = []
        """Each rank's (host, process id), known once the group has started (`wait_started`)."""

    @property
    def world_size(self) -> int:
        return len(self.workers)

    @property
    def serving(self) -> CallTransport | None:
        """The served transport while the group is served, else None."""
        return None if self.transport is self.ray_calls else self.transport

    def execute_on(self, *ranks: int) -> RankSelection:
        """Address only `ranks`: `group.execute_on(0).save()` calls `save` on rank 0 alone."""
        bad = [rank for rank in ranks if not 0 <= rank < self.world_size]
        if not ranks or bad:
            raise ValueError(f"group {self.name!r} has ranks 0..{self.world_size - 1}; cannot execute on {list(ranks)}")
        return RankSelection(self, ranks)

    def __getattr__(self, method: str) -> GroupMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return GroupMethod(self, method, range(self.world_size))

    def _call(self, method: str, ranks: Sequence[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> GroupFuture:
        """Call `method(*args, **kwargs)` on `ranks`."""
        if method not in self._methods:
            raise AttributeError(
                f"{self.worker_cls.__name__} has no public method {method!r}; "
                f"group {self.name!r} can call: {', '.join(sorted(self._methods))}"
            )
        if self.terminated:
            raise RuntimeError(f"group {self.name!r} was terminated; cannot call {method}()")
        calls = self.transport.send(method, ranks, args, kwargs)
        return GroupFuture(self.name, method, calls, self.call_timeout_s, self.processes)

    def terminate(self, graceful_s: float = GRACEFUL_EXIT_S) -> None:
        """Let every rank finish its current call and exit, then kill those still alive after `graceful_s`."""
        terminate_groups([self], graceful_s)

    def __repr__(self) -> str:
        return f"WorkerGroup(name={self.name!r}, worker={self.worker_cls.__name__}, world_size={self.world_size})"


class RankSelection:
    """Some ranks of a group, from `WorkerGroup.execute_on`; method calls reach only those ranks."""

    def __init__(self, group: WorkerGroup, ranks: Sequence[int]) -> None:
        self.group = group
        self.ranks = tuple(ranks)

    def __getattr__(self, method: str) -> GroupMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return GroupMethod(self.group, method, self.ranks)


@dataclass(frozen=True)
class GroupMethod:
    """A worker method bound to some ranks of a group; calling it calls every one of them."""

    group: WorkerGroup
    method: str
    ranks: Sequence[int]

    def __call__(self, *args: Any, **kwargs: Any) -> GroupFuture:
        return self.group._call(self.method, self.ranks, args, kwargs)


def terminate_groups(groups: Sequence[WorkerGroup], graceful_s: float = GRACEFUL_EXIT_S) -> None:
    """Terminate several groups at once, so their ranks share one graceful period; skips terminated groups."""
    hosts = [host for group in groups if not group.terminated for host in group.hosts]
    for group in groups:
        group.terminated = True
    stop(hosts, graceful_s)


def public_methods(worker_cls: type) -> frozenset[str]:
    """The names a group forwards: plain (sync or async) methods without a leading underscore.

    Class methods (such as `create_group`), static methods and properties stay driver-side or worker-side.
    """
    return frozenset(
        name
        for name in dir(worker_cls)
        if not name.startswith("_") and inspect.isfunction(inspect.getattr_static(worker_cls, name))
    )


def _resolve_placements(
    strategy: PlacementStrategy | Sequence[Placement], cluster: Cluster, name: str
) -> list[Placement]:
    """The group's placements, checked against the cluster's shape; errors name the group."""
    if isinstance(strategy, PlacementStrategy):
        placements = strategy.get_placements(cluster.num_nodes, cluster.num_devices_per_node)
    else:
        placements = list(strategy)
    problems = []
    if not placements:
        problems.append("no placements")
    if [p.rank for p in placements] != list(range(len(placements))):
        problems.append(f"ranks must be 0..{len(placements) - 1} in order, got {[p.rank for p in placements]}")
    for p in placements:
        if p.world_size != len(placements):
            problems.append(f"rank {p.rank} has world_size {p.world_size}, expected {len(placements)}")
        if not 0 <= p.node_rank < cluster.num_nodes:
            problems.append(f"rank {p.rank} is on node {p.node_rank}, but the cluster has {cluster.num_nodes}")
        if any(not 0 <= d < cluster.num_devices_per_node for d in p.local_devices):
            problems.append(
                f"rank {p.rank} uses local devices {list(p.local_devices)}, "
                f"but nodes have {cluster.num_devices_per_node}"
            )
    if problems:
        raise ValueError(f"cannot launch group {name!r}: " + "; ".join(problems))
    return placements


def _cores(cluster: Cluster, placement: Placement) -> tuple[int, ...]:
    """The CPU cores a worker pins to: those of its logical devices on a cpu cluster, none (unpinned) otherwise."""
    if cluster.device_type != "cpu":
        return ()
    cores = (cluster.cores_of(placement.node_rank, device) for device in placement.local_devices)
    return tuple(sorted({core for device_cores in cores for core in device_cores}))
