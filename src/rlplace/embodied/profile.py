"""A run's own per-unit costs (`runner.profile=true`), written to profile.json in the run folder for the planner.

The planner (`rlplace-plan plan.profile=<run folder>`) predicts the step time of other placements from what each
component's unit of work costs: one env step of n sub-envs, one inference on n observations, one minibatch update on
n samples, one gradient averaging over the actor ranks. Timed inside the step loop, these costs are mixed with
waiting and with whatever else shares the devices, so after the last step (and its checkpoint, which nothing here
touches) the runner asks one component at a time, on its rank 0 alone, to time its unit at several sizes while every
other process idles. Each worker times its unit with `median_seconds`: medians, because a stray preemption of one
call must not move the cost.

profile.json: {"family", "env_id", "device_type", "devices": {device: [cpu cores]} (empty lists on gpu clusters),
"node_cores": {node: [cpu cores]}, "placement": ComponentPlacement.to_dict(), "config": {the fields that size the
units and the step}, "env" | "rollout" | "actor": {"sizes": [n, ...], "seconds": [s, ...]}, "average": {"ranks",
"seconds", "bytes"} or null}.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlplace.embodied.config import FAMILY, EmbodiedConfig
from rlplace.placement import ComponentPlacement

if TYPE_CHECKING:
    from rlplace.scheduler import Cluster, WorkerGroup

PROFILE_FILE = "profile.json"
"""The profile's name in the run folder, next to summary.json and timeline.json."""
TARGET_S = 0.2
"""Roughly how long the timed calls of one size take together: long enough for a steady median, short enough that
the default CartPole run profiles in a few seconds."""
MIN_REPEATS = 3
"""Fewest timed calls per size, however slow one is: a median of at least three."""
MAX_REPEATS = 200
"""Most timed calls per size, however fast one is."""
WARMUP = 2
"""Untimed calls before timing: first calls pay for allocations, caches and lazy initialisation."""
FIRST_ACTOR_SIZE = 8
"""The smallest minibatch timed: below it an update costs about the same whatever its size."""


def sizes_up_to(last: int, first: int = 1) -> list[int]:
    """The powers of two from `first` (a power of two) to `last`, and `last` itself: [1, 2, 4, 8, 12] for 12.

    Doubling sizes cover a range with few points, which the planner interpolates between; `last` is the size this
    run used. Just [last] when it is below `first`."""
    if first < 1 or first & (first - 1):
        raise ValueError(f"first size {first} is not a power of two")
    if last < 1:
        raise ValueError(f"last size {last} is not positive")
    sizes = []
    size = first
    while size <= last:
        sizes.append(size)
        size *= 2
    return sizes if sizes and sizes[-1] == last else [*sizes, last]


def minibatch_size(cfg: EmbodiedConfig) -> int:
    """Samples per minibatch over all actor ranks: one step's samples over algorithm.num_minibatches (each actor
    rank's minibatch is its share of it)."""
    return cfg.task.total_num_envs * cfg.rollout.num_steps // cfg.algorithm.num_minibatches


def seconds_of(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def repeats_for(seconds: float) -> int:
    """Timed calls for a unit that took `seconds` once: about TARGET_S worth, within [MIN_REPEATS, MAX_REPEATS]."""
    return max(MIN_REPEATS, min(MAX_REPEATS, round(TARGET_S / max(seconds, 1e-9))))


def median_seconds(call: Callable[[], object], repeats: int | None = None, warmup: int = WARMUP) -> float:
    """Median seconds of `call` over `repeats` timed calls after `warmup` untimed ones; `repeats` None: one more
    timed call decides (`repeats_for`). `call` must finish its work before it returns (synchronise a GPU)."""
    for _ in range(warmup):
        call()
    if repeats is None:
        repeats = repeats_for(seconds_of(call))
    return statistics.median(seconds_of(call) for _ in range(repeats))


def cores_by_device(cluster: Cluster) -> dict[int, list[int]]:
    """Every device of the cluster (global rank) -> the CPU cores it owns: what a cost measured on it ran on. Empty
    lists on a gpu cluster, whose workers are not pinned to cores."""
    per_node = cluster.num_devices_per_node
    if cluster.device_type != "cpu":
        return {device: [] for device in range(cluster.num_devices)}
    return {device: list(cluster.cores_of(*divmod(device, per_node))) for device in range(cluster.num_devices)}


def cores_by_node(cluster: Cluster) -> dict[int, list[int]]:
    """Every node (rank) -> the CPU cores its workers may use: on a gpu node, the cores its processes' CPU work (a
    simulator, the Python around the kernels) shares."""
    return {node: list(cluster.node_cores(node)) for node in range(cluster.num_nodes)}


def measure(
    cfg: EmbodiedConfig,
    placement: ComponentPlacement,
    cores: dict[int, list[int]],
    node_cores: dict[int, list[int]],
    *,
    env: WorkerGroup,
    rollout: WorkerGroup,
    actor: WorkerGroup,
    switch: Callable[[str], None],
) -> dict[str, Any]:
    """Time each component's unit of work, one component at a time on its rank 0, and return the profile.

    `switch(phase)` onloads the components of a phase of the run (and offloads those sharing their devices), so each
    is timed as it works in the loop: env and rollout in generation, the actor in training. The run ended in
    training, and the switch plan holds for the loop's order of phases, so the phases come in that order. Gradient
    averaging is collective: every actor rank takes part, and nothing else runs meanwhile."""
    run_sizes, actor_sizes = sizes_up_to(cfg.task.total_num_envs), sizes_up_to(minibatch_size(cfg), FIRST_ACTOR_SIZE)
    switch("sync_weights")
    switch("generate_rollouts")
    env_seconds = env.execute_on(0).profile_step(run_sizes).wait()[0]
    rollout_seconds = rollout.execute_on(0).profile_infer(run_sizes).wait()[0]
    switch("training")
    actor_seconds = actor.execute_on(0).profile_update(actor_sizes).wait()[0]
    average = None
    if actor.world_size > 1:
        # The slowest rank's time: every rank of an update waits for it.
        timed = actor.profile_average().wait()
        average = {"ranks": actor.world_size, "seconds": max(t["seconds"] for t in timed), "bytes": timed[0]["bytes"]}
    return {
        "family": FAMILY,
        "env_id": cfg.task.env_id,
        "device_type": cfg.cluster.device_type,
        "devices": {str(device): found for device, found in cores.items()},
        "node_cores": {str(node): found for node, found in node_cores.items()},
        "placement": placement.to_dict(),
        "config": {
            "total_num_envs": cfg.task.total_num_envs,
            "num_steps": cfg.rollout.num_steps,
            "pipeline_stage_num": cfg.rollout.pipeline_stage_num,
            "update_epochs": cfg.algorithm.update_epochs,
            "num_minibatches": cfg.algorithm.num_minibatches,
            "hidden_sizes": list(cfg.model.hidden_sizes),
            "max_staleness": cfg.runner.max_staleness,
            "offload": {name: getattr(cfg, name).enable_offload for name in ("env", "rollout", "actor")},
        },
        "env": {"sizes": run_sizes, "seconds": env_seconds},
        "rollout": {"sizes": run_sizes, "seconds": rollout_seconds},
        "actor": {"sizes": actor_sizes, "seconds": actor_seconds},
        "average": average,
    }
