"""`Cluster`: the Ray cluster a run holds, seen as `num_nodes` x `num_devices_per_node` devices.

It starts an embedded single-node Ray (the default), attaches to a running cluster (`address`), or uses the Ray
this process already runs in (a Hydra Ray launcher job), and in every case checks that the cluster has the declared
nodes and devices before anything is launched. Nodes get stable ranks (the driver's node first, then by IP and node
id) so placements mean the same node every run. On a cpu cluster each logical device owns a disjoint set of its
node's CPU cores (`cores_of`). Before its first worker starts, the run reserves its devices as Ray placement groups
(`reservation.py`) and every worker asks for its share of its device, so runs sharing one Ray queue for the devices
and Ray's accounting shows what each run uses. Shutting down tears down every worker group, releases the
reservation, then stops the Ray this cluster started, so a run leaves no processes behind, also after an exception
or Ctrl-C; an embedded Ray's session folder is removed too. Starting, attaching to and stopping Ray itself is
`session.py`'s job; this module decides which, and holds the nodes, devices and reservation.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import random
import socket
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlplace.placement.cores import device_cores
from rlplace.scheduler import parking
from rlplace.scheduler.errors import ClusterError
from rlplace.scheduler.group import WorkerGroup, terminate_groups
from rlplace.scheduler.hosts import Device, HostProcess, IdleHosts, host_actor
from rlplace.scheduler.hub import Hosted
from rlplace.scheduler.rendezvous import create_rendezvous
from rlplace.scheduler.reservation import Bundle, Reservation, cpu_bundles, gpu_bundles, process_share
from rlplace.scheduler.session import attach, disconnect, head_address, local_gpus, start_local_ray, started_here

if TYPE_CHECKING:  # for the annotation only: rlplace.core imports the scheduler, never the other way round
    from rlplace.core.config import ClusterConfig
    from rlplace.placement.placement import Placement


class Cluster:
    """The run's Ray cluster: node ranks, node IPs, and the CPU cores of each logical device.

    Use it as a context manager, or call `shutdown()`; it also shuts down at interpreter exit.
    """

    def __init__(
        self,
        cfg: ClusterConfig,
        call_timeout_s: float | None = None,
        placements: Sequence[Placement] = (),
        keep_ray: bool = False,
    ) -> None:
        """`placements`, every worker process the run will launch, are checked against the nodes' cores
        (`cluster.max_oversubscription`; on an embedded Ray before it starts) and split each device's reservation
        between the processes on it; a device none of them names is taken whole by its first process.
        `cluster.reserve_timeout_s` bounds the wait for devices that other runs on the same Ray hold. `keep_ray`: an
        embedded Ray this cluster starts outlives it, for the runs this process starts next (the later jobs of a
        multirun), and stops when the process exits. On an embedded Ray that this process started, a run that ends
        cleanly hands its reservation and worker processes on to the next run of the same shape (`parking.py`)."""
        if cfg.device_type not in ("cpu", "gpu"):
            raise ClusterError(f"cluster.device_type must be 'cpu' or 'gpu', got {cfg.device_type!r}")
        if cfg.num_nodes < 1 or cfg.num_devices_per_node < 1:
            shape = f"{cfg.num_nodes} x {cfg.num_devices_per_node}"
            raise ClusterError(f"need at least 1 node and 1 device per node, got {shape}")
        self.num_nodes = cfg.num_nodes
        self.num_devices_per_node = cfg.num_devices_per_node
        self.device_type = cfg.device_type
        self.run_id = uuid.uuid4().hex[:8]
        """Names this run's placement groups in Ray's accounting."""
        self._groups: list[WorkerGroup] = []
        self._idle = IdleHosts()
        """Retired worker processes kept for the next groups: by a switch (`replace`), or handed on by this process's
        last run (`reserve`)."""
        self._rendezvous: Hosted | None = None
        self._owns_connection = False  # this object called ray.init, so it calls ray.shutdown
        self._started_ray = False  # ... and that ray.init started Ray's processes here
        self._closed = False
        self._keep_ray = keep_ray
        self._reservation: Reservation | None = None
        self._processes_per_device = Counter(p.devices[0] for p in placements if p.devices)
        """Global device -> the worker processes whose first device it is (their bundle is that device's)."""
        self._wanted = Counter(self._first_device(p) for p in placements)
        """The run's processes by the device whose bundle they go in: how many kept processes it can take."""
        self.reserve_timeout_s = cfg.reserve_timeout_s
        load = Counter(p.node_rank for p in placements)
        self._max_oversubscription = cfg.max_oversubscription
        self.call_timeout_s = call_timeout_s
        """Deadline of worker calls waited on without a timeout: a hung worker is reported, never waited for."""

        if ray.is_initialized():
            where = "the Ray this process is connected to"
        elif cfg.address is None:
            check_start(cfg, placements)  # before paying for Ray's start
            start_local_ray(cfg)
            self._owns_connection = self._started_ray = True
            where = "the embedded local Ray"
        else:
            attach(cfg)
            self._owns_connection = True
            where = f"the Ray cluster at {cfg.address!r}"
        self._parks = started_here() and (keep_ray or not self._owns_connection)
        """Whether a clean end parks the reservation and processes for this process's next run (`parking.py`)."""
        atexit.register(self.shutdown)
        try:
            self._nodes = _rank_nodes(where, cfg)
            self._node_cores = self._find_node_cores()
            self._device_cores = [
                split_cores(cores, cfg.num_devices_per_node, cfg.cpus_per_device)
                for cores in (self._node_cores if self.device_type == "cpu" else [])
            ]
            self._check_load(self._device_cores, load)
            self._bundles = [self._node_bundles(rank) for rank in range(self.num_nodes)]
        except BaseException:
            self.shutdown()
            raise

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.num_devices_per_node

    @property
    def node_ids(self) -> list[str]:
        """Ray node ids, by node rank."""
        return [node["NodeID"] for node in self._nodes]

    @property
    def has_gpus(self) -> bool:
        """Whether any node of the run has GPUs: there a worker's CUDA variables must be set before its process
        imports anything (`WorkerGroupSpec.start`)."""
        return any(node["Resources"].get("GPU", 0) > 0 for node in self._nodes)

    def node_ip(self, node_rank: int) -> str:
        return self._nodes[node_rank]["NodeManagerAddress"]

    def node_cores(self, node_rank: int) -> tuple[int, ...]:
        """The CPU cores the workers of node `node_rank` may use (on a gpu node: the ones its processes share)."""
        return tuple(self._node_cores[node_rank])

    def cores_of(self, node_rank: int, local_device: int) -> tuple[int, ...]:
        """The CPU cores owned by logical device `local_device` of node `node_rank` (cpu clusters only)."""
        if self.device_type != "cpu":
            raise ClusterError("cores_of is defined for device_type='cpu' clusters, whose devices are CPU cores")
        return self._device_cores[node_rank][local_device]

    def cores_by_device(self) -> dict[int, list[int]]:
        """Every device (global rank) -> the CPU cores it owns: what a cost measured on it ran on (a run's profile).
        Empty lists on a gpu cluster, whose workers are not pinned to cores."""
        if self.device_type != "cpu":
            return {device: [] for device in range(self.num_devices)}
        per_node = self.num_devices_per_node
        return {device: list(self.cores_of(*divmod(device, per_node))) for device in range(self.num_devices)}

    def cores_by_node(self) -> dict[int, list[int]]:
        """Every node (rank) -> the CPU cores its workers may use: on a gpu node, the cores its processes' CPU work
        (a simulator, the Python around the kernels) shares."""
        return {node: list(self.node_cores(node)) for node in range(self.num_nodes)}

    def _check_load(self, device_cores: list[list[tuple[int, ...]]], load: Counter[int]) -> None:
        _check_load(device_cores, load, self._max_oversubscription)

    def free_port(self, node_rank: int) -> int:
        """A TCP port that is free now on node `node_rank` (for MASTER_PORT)."""
        if self.node_ids[node_rank] == ray.get_runtime_context().get_node_id():
            return _free_port()
        return ray.get(_on_node(_free_port, self.node_ids[node_rank]))

    @property
    def rendezvous(self) -> Hosted:
        """The object through which this cluster's workers find each other for tensor transfers (its `address` is
        what they are given)."""
        if self._rendezvous is None:
            self._rendezvous = create_rendezvous()
        return self._rendezvous

    def check_group_name(self, name: str) -> None:
        """Refuse a launch on a shut-down cluster, or under the name of a running group."""
        if self._closed:
            raise ClusterError(f"cannot launch group {name!r}: the cluster was shut down")
        if any(group.name == name and not group.terminated for group in self._groups):
            raise ValueError(f"a worker group named {name!r} is already running on this cluster")

    def replace(self, placements: Sequence[Placement]) -> None:
        """Make room for a new set of worker processes in the same Ray session (a running job re-placed): stop every
        group and share the devices out anew, for `placements`, at the next launch. The reservation is the whole
        cluster's devices, whatever runs on them, so it is kept: no other run can take the devices between the old
        groups and the new, and the switch never waits for them. On nodes without GPUs the old workers' processes
        are kept for the new ranks on their nodes (`hosts.py`); the others stop. The rendezvous starts afresh, so
        the new groups' names are free. ClusterError if the new processes overload the nodes."""
        self._check_load(self._device_cores, Counter(p.node_rank for p in placements))
        self._wanted = Counter(self._first_device(p) for p in placements)
        if self.has_gpus:
            terminate_groups(self._groups)
            self._groups = []
        else:
            self._retire_groups(self._wanted)
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None
        self._processes_per_device = Counter(p.devices[0] for p in placements if p.devices)

    def _retire_groups(self, wanted: Counter[Device] | None) -> None:
        """Retire every running group's workers and keep their processes for the groups that start next (`hosts.py`),
        up to `wanted` per device (None: all that can be reused)."""
        running = [host for group in self._groups if not group.terminated for host in group.hosts]
        for group in self._groups:
            group.terminated = True
        self._groups = []
        self._idle.keep(running, wanted)

    def add_group(self, group: WorkerGroup) -> None:
        """Track a launched group so that `shutdown` tears it down."""
        self._groups.append(group)

    def reserve(self) -> Reservation:
        """Hold the run's devices in Ray, waiting while other runs on the same Ray hold them (ClusterError after
        `reserve_timeout_s`). The first launch calls it, so a Cluster used only for its Ray connection (a test
        fixture that other runs join) holds no devices; a driver may call it earlier. Idempotent. Takes over what
        this process's last run parked, when made for the same nodes and devices (`parking.py`)."""
        if self._reservation is None and self._parks and (parked := parking.take(self.node_ids, self._bundles)):
            self._reservation, self._idle = parked.reservation, parked.idle
            self._idle.trim(self._wanted)
        if self._reservation is None:
            # Kept from here on, so that `shutdown` withdraws it also when Ctrl-C ends the wait.
            self._reservation = Reservation(f"rlplace.{self.run_id}", self.node_ids, self._bundles)
            try:
                self._reservation.wait(self.reserve_timeout_s)
            except ClusterError:
                self._reservation.release()
                self._reservation = None
                raise
        return self._reservation

    def hosts(self, placements: Sequence[Placement], envs: Sequence[dict[str, str]], name: str) -> list[HostProcess]:
        """A process for each rank of a new group of worker class `name`: one a switch kept on the rank's first
        device (`replace`), or a new one in the bundle of that device, asking for its share of it (`process_share`).
        A process on several devices takes its share of the first device's bundle only (Ray schedules an actor into
        one bundle); the others stay reserved for the run. A process without devices runs in its node's reservation
        and asks for nothing. On a node with GPUs a new process starts with its rank's environment (`envs`), which
        CUDA reads once; elsewhere the rank sets its own (`Worker._start_rank`): a Ray runtime environment costs
        every process a second Python start."""
        reservation = self.reserve()
        found: list[HostProcess] = []
        for placement, env in zip(placements, envs, strict=True):
            device = self._first_device(placement)
            host = self._idle.take(device, name)
            if host is None:
                node_rank, local = device
                there = [*self._held(device), *(other for other in found if other.device == device)]
                share = {} if local is None else self._share(node_rank, local, there)
                options: dict[str, Any] = {"runtime_env": {"env_vars": env}} if self.has_gpus else {}
                actor = host_actor(name).options(
                    scheduling_strategy=reservation.strategy(node_rank, local),
                    num_cpus=share.get("CPU", 0.0),
                    num_gpus=share.get("GPU", 0.0),
                    max_restarts=0,
                    **options,
                )
                host = HostProcess(actor.remote(), device, share, name)
            found.append(host)
        return found

    def _first_device(self, placement: Placement) -> Device:
        """(node rank, local device) of the device whose bundle a process is scheduled into; (node rank, None) for
        a process without devices."""
        return placement.node_rank, placement.local_devices[0] if placement.local_devices else None

    def _held(self, device: Device) -> list[HostProcess]:
        """The processes on `device` now: those of running groups, and the retired ones kept for the next groups."""
        running = (host for group in self._groups if not group.terminated for host in group.hosts)
        return [host for host in (*running, *self._idle) if host.device == device]

    def _share(self, node_rank: int, local: int, there: Sequence[HostProcess]) -> Bundle:
        expected = self._processes_per_device.get(node_rank * self.num_devices_per_node + local, 1)
        return process_share(self._bundles[node_rank][local], expected, [host.share for host in there])

    def _node_bundles(self, node_rank: int) -> list[Bundle]:
        """One bundle per logical device of a node, sized by what Ray offers on that node."""
        resources = self._nodes[node_rank]["Resources"]
        if self.device_type == "gpu":
            return gpu_bundles(self.num_devices_per_node, resources)
        return cpu_bundles(self._device_cores[node_rank], resources["CPU"])

    def shutdown(self, park: bool = False) -> None:
        """Terminate every worker group (gracefully, then by force), then disconnect from Ray, stopping it if it
        was started here and killing any of its processes still alive then. Idempotent. `park` (a run that ended
        cleanly): where this process's next run may take them over, the reservation and the retired workers'
        processes are parked instead (`parking.py`)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        try:
            if park and self._parks and self._reservation is not None and not self.has_gpus:
                self._retire_groups(None)
                parking.park(self._reservation, self._idle, self.node_ids, self._bundles)
            else:
                terminate_groups(self._groups)
                self._idle.stop()
                if self._reservation is not None:
                    self._reservation.release()
            if self._rendezvous is not None:
                self._rendezvous.close()  # when this process stays connected (a Hydra Ray launcher job)
        finally:
            if self._keep_ray and self._started_ray:
                atexit.register(disconnect, stop=True)
            elif self._owns_connection:
                parking.forget()
                disconnect(stop=self._started_ray)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self.shutdown(park=exc_type is None)

    def __repr__(self) -> str:
        return f"Cluster({self.num_nodes} nodes x {self.num_devices_per_node} {self.device_type} devices)"

    def _find_node_cores(self) -> list[list[int]]:
        """Each node's usable CPU cores (its affinity mask), asked of a tiny task on every other node."""
        here = ray.get_runtime_context().get_node_id()
        remote = {i: _on_node(_usable_cores, node_id) for i, node_id in enumerate(self.node_ids) if node_id != here}
        return [_usable_cores() if i not in remote else ray.get(remote[i]) for i in range(self.num_nodes)]


def check_start(cfg: ClusterConfig, placements: Sequence[Placement] = ()) -> None:
    """Refuse (ClusterError) what `Cluster(cfg, placements=...)` would refuse before it starts or joins Ray: for an
    embedded Ray, a cluster this machine cannot be (more nodes than one, more cores or GPUs than it has, more
    worker processes per core than `cluster.max_oversubscription`); for `cluster.address`, one where no Ray head
    answers within `cluster.connect_timeout_s`. `rlplace-train` calls it before it logs or starts anything, so that
    a refusal is its one line."""
    if ray.is_initialized():
        return
    if cfg.address is not None:
        head_address(cfg)
        return
    if cfg.num_nodes > 1:
        raise ClusterError(
            f"an embedded local Ray has one node, but cluster.num_nodes={cfg.num_nodes}: "
            "start a multi-node Ray cluster and set cluster.address"
        )
    # This machine is the whole cluster.
    if cfg.device_type == "cpu":
        load = Counter(p.node_rank for p in placements)
        devices = split_cores(_usable_cores(), cfg.num_devices_per_node, cfg.cpus_per_device)
        _check_load([devices], load, cfg.max_oversubscription)
    elif (gpus := local_gpus()) < cfg.num_devices_per_node:
        raise ClusterError(
            f"cluster.device_type = 'gpu': cluster.num_devices_per_node = {cfg.num_devices_per_node} GPUs "
            f"asked, this machine has {gpus}"
        )


def _check_load(device_cores: list[list[tuple[int, ...]]], load: Counter[int], max_oversubscription: float) -> None:
    """Refuse more worker processes on a cpu node than `cluster.max_oversubscription` per core: past that, every
    process mostly waits for a core and the run measures the machine's scheduler, not a placement."""
    for node, cores_of_devices in enumerate(device_cores):
        processes = load[node]
        cores = len(set().union(*cores_of_devices))
        if processes > max_oversubscription * cores:
            raise ClusterError(
                f"cluster.max_oversubscription = {max_oversubscription:g}: the placement puts {processes} worker "
                f"processes on node {node}'s {cores} CPU core(s) ({processes / cores:.1f} per core); place fewer "
                "processes or devices, or raise cluster.max_oversubscription"
            )


def _rank_nodes(where: str, cfg: ClusterConfig) -> list[dict[str, Any]]:
    """The first `num_nodes` nodes able to host `num_devices_per_node` devices, in stable rank order.

    A gpu node must have that many GPUs; a cpu node needs CPUs. The driver's node comes first (it is usually the
    head), then the head node, then nodes by IP and node id.
    """
    resource = "GPU" if cfg.device_type == "gpu" else "CPU"
    needed = cfg.num_devices_per_node if cfg.device_type == "gpu" else 1
    alive = [node for node in ray.nodes() if node["Alive"]]
    usable = [node for node in alive if node["Resources"].get(resource, 0) >= needed]
    driver = ray.get_runtime_context().get_node_id()

    def rank_key(node: dict[str, Any]) -> tuple[Any, ...]:
        is_head = "node:__internal_head__" in node["Resources"]
        return node["NodeID"] != driver, not is_head, _ip_key(node["NodeManagerAddress"]), node["NodeID"]

    usable.sort(key=rank_key)
    if len(usable) < cfg.num_nodes:
        found = ", ".join(f"{n['NodeManagerAddress']} ({n['Resources'].get(resource, 0):g} {resource})" for n in alive)
        raise ClusterError(
            f"{where} cannot hold {cfg.num_nodes} node(s) x {cfg.num_devices_per_node} {cfg.device_type} device(s): "
            f"{len(usable)} node(s) have at least {needed} {resource}; alive nodes: {found or 'none'}"
        )
    return usable[: cfg.num_nodes]


def _ip_key(ip: str) -> tuple[int, int, str]:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return (9, 0, ip)
    return (address.version, int(address), ip)


def split_cores(cores: list[int], num_devices: int, cpus_per_device: int | None) -> list[tuple[int, ...]]:
    """`device_cores`, refusing an explicit `cpus_per_device` that does not fit, since devices would silently share
    cores."""
    if cpus_per_device is not None and cpus_per_device * num_devices > len(cores):
        raise ClusterError(
            f"cluster.cpus_per_device = {cpus_per_device}: {num_devices} devices x {cpus_per_device} need "
            f"{cpus_per_device * num_devices} cores, but a node has {len(cores)} ({cores}); lower it, or use null"
        )
    return device_cores(cores, num_devices, cpus_per_device)


def _usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


UNCLAIMED_PORTS_FROM = 20000
"""MASTER_PORT candidates start here, above Ray's default worker ports."""


def _free_port() -> int:
    """A TCP port free now, drawn below the OS's ephemeral range and above Ray's worker ports (10002-19999): a process
    that binds port 0 meanwhile (Ray's gRPC servers, the channels' listeners) gets an ephemeral port, so it cannot take
    this one before torch.distributed's store binds it. Falls back to an ephemeral port where that gap is full."""
    candidates = range(UNCLAIMED_PORTS_FROM, _ephemeral_ports()[0])
    for port in random.sample(candidates, min(64, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _ephemeral_ports() -> tuple[int, int]:
    """The OS's range for port-0 binds (Linux's ip_local_port_range; its default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _on_node(function: Any, node_id: str) -> ray.ObjectRef:
    """Run a small function on one node, without asking Ray for a CPU."""
    task = ray.remote(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))(function)
    return task.remote()
