"""`Reservation`: the run's devices held in Ray as placement groups, so that Ray's accounting shows what it uses.

Every node of the run gets one placement group with one bundle per logical device, pinned to that node by its
`ray.io/node-id` label: STRICT_PACK alone would let Ray choose the node, and the `node:<ip>` resource cannot tell
apart nodes that share a machine. A cpu device's bundle is the CPUs it owns (`cpu_bundles`); a gpu device's is one
GPU and its part of the node's CPUs. Each worker is scheduled into the bundle of its first device and asks for its
share of it (`process_share`), so `ray status` shows the run's use device by device.

Runs that share one Ray (the jobs of Hydra's Ray launcher, drivers attached to one cluster) queue in Ray itself: a
placement group waits until its bundles fit. The groups are never detached, so they are owned by the driver and Ray
removes them when it exits, also when it is killed: a dead run never blocks the next.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlplace.scheduler.errors import ClusterError

log = logging.getLogger(__name__)

RESOURCE_STEPS = 10_000
"""Ray counts resources in steps of 1/10000: amounts are rounded down to a step, so shares never sum past their
bundle."""
WAIT_NOTICE_S = 1.0
"""How long a reservation may take before the run says that it waits for other runs."""
NODE_ID_LABEL = "ray.io/node-id"
"""The label every Ray node carries with its own node id."""

Bundle = dict[str, float]


def quantize(amount: float) -> float:
    """`amount` rounded down to Ray's granularity (with slack for float error: 0.3 / 0.1 is 2.9999...)."""
    return math.floor(amount * RESOURCE_STEPS + 1e-6) / RESOURCE_STEPS


def cpu_bundles(device_cores: Sequence[tuple[int, ...]], node_cpus: float) -> list[Bundle]:
    """The bundles of a cpu node's logical devices: each device's CPUs, a core shared by k devices (more devices
    than cores) counting 1/k for each, scaled down when Ray offers the node fewer CPUs than its devices own."""
    sharers = Counter(core for cores in device_cores for core in cores)
    owned = [sum(1 / sharers[core] for core in cores) for cores in device_cores]
    scale = min(1.0, node_cpus / sum(owned))
    return [{"CPU": quantize(cpus * scale)} for cpus in owned]


def gpu_bundles(num_devices: int, node_resources: dict[str, float]) -> list[Bundle]:
    """The bundles of a gpu node's devices: one GPU each, with the node's CPUs per GPU (workers feed their GPU)."""
    cpus = quantize(node_resources.get("CPU", 0.0) / node_resources["GPU"])
    return [{"GPU": 1.0, "CPU": cpus} if cpus else {"GPU": 1.0} for _ in range(num_devices)]


def process_share(bundle: Bundle, expected: int, held: Sequence[Bundle]) -> Bundle:
    """What a new process asks of its device's bundle when processes holding `held` are already on the device.

    What the bundle has left is split evenly between the processes of the device still to come (of `expected`), so
    shares that processes kept from another placement (a switch's reused hosts, `hosts.py`) and the new ones never
    sum past the bundle; processes past `expected` (a driver that declared fewer) ask for nothing, so none waits
    forever.
    """
    to_come = expected - len(held)
    if to_come <= 0:
        return {}
    left = {name: amount - sum(share.get(name, 0.0) for share in held) for name, amount in bundle.items()}
    return {name: quantize(max(0.0, amount) / to_come) for name, amount in left.items()}


class Reservation:
    """The placement groups holding a run's devices, one per node (`bundles[node_rank]`, by local device)."""

    def __init__(self, name: str, node_ids: Sequence[str], bundles: Sequence[list[Bundle]]) -> None:
        self.bundles = [list(node_bundles) for node_bundles in bundles]
        self.groups: list[PlacementGroup] = [
            placement_group(
                node_bundles,
                strategy="STRICT_PACK",
                name=f"{name}.node{rank}",
                bundle_label_selector=[{NODE_ID_LABEL: node_id}] * len(node_bundles),
            )
            for rank, (node_id, node_bundles) in enumerate(zip(node_ids, self.bundles, strict=True))
        ]

    def wait(self, timeout_s: float) -> None:
        """Return once Ray placed every bundle; says so once when that takes a while (other runs hold the devices),
        and raises ClusterError after `timeout_s`. Blocking in `ray.get` also lends Ray the CPU of a driver that is
        itself a Ray task, so jobs of a Ray-launched sweep do not hold each other's reservations up."""
        ready = [group.ready() for group in self.groups]
        start = time.monotonic()
        try:
            ray.get(ready, timeout=min(WAIT_NOTICE_S, timeout_s))
            return
        except ray.exceptions.GetTimeoutError:
            log.warning(
                f"rlplace: waiting up to {timeout_s:g} s for Ray to reserve this run's devices ({self.demand()}); "
                "another run sharing this Ray holds them"
            )
        try:
            ray.get(ready, timeout=max(0.0, timeout_s - (time.monotonic() - start)))
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(
                f"Ray did not reserve this run's devices ({self.demand()}) within {timeout_s:g} s: other runs held "
                f"them (free now: {_free(ray.available_resources())}); retry later, or wait longer"
            ) from None

    def strategy(self, node_rank: int, local_device: int | None) -> PlacementGroupSchedulingStrategy:
        """Schedule into one device's bundle; `None` (a process without devices) into any bundle of its node."""
        return PlacementGroupSchedulingStrategy(
            self.groups[node_rank],
            placement_group_bundle_index=-1 if local_device is None else local_device,
            placement_group_capture_child_tasks=False,
        )

    def demand(self) -> str:
        """What the run reserves, summed over its nodes: `2 node(s), 4 CPU, 2 GPU`."""
        totals = Counter[str]()
        for bundle in (bundle for node_bundles in self.bundles for bundle in node_bundles):
            totals.update(bundle)
        return ", ".join([f"{len(self.bundles)} node(s)", *(f"{amount:g} {name}" for name, amount in totals.items())])

    def release(self) -> None:
        """Give the devices back to Ray (placed or still waiting)."""
        for group in self.groups:
            remove_placement_group(group)


def _free(available: dict[str, float]) -> str:
    return ", ".join(f"{available.get(name, 0.0):g} {name}" for name in ("CPU", "GPU"))
