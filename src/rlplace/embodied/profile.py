"""A run's own per-unit costs (`runner.profile=true`), written to profile.json in the run folder for the planner.

The planner (`rlplace-plan plan.profile=<run folder>`) predicts the step time of other placements from what each
component's unit of work costs: one env step of n sub-envs, one inference on n observations, one minibatch update on
n samples, one gradient averaging over the actor ranks. Timed inside the step loop, these costs are mixed with
waiting and with whatever else shares the devices, so after the last step (and its checkpoint, which nothing here
touches) the runner asks one component at a time, on its rank 0 alone, to time its unit at several sizes while every
other process idles, its sizes in turns (`core.timing.interleaved_medians`).

profile.json: {"family", "env_id", "device_type", "devices": {device: [cpu cores]} (empty lists on gpu clusters),
"node_cores": {node: [cpu cores]}, "placement": ComponentPlacement.to_dict(), "config": {the fields that size the
units and the step}, "env" | "rollout" | "actor": {"sizes": [n, ...], "seconds": [s, ...]}, "average": {"ranks",
"seconds", "bytes"} or null}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlplace.core.timing import sizes_up_to, where_it_ran
from rlplace.embodied.config import FAMILY, EmbodiedConfig
from rlplace.placement import ComponentPlacement

if TYPE_CHECKING:
    from rlplace.scheduler import WorkerGroup

PROFILE_FILE = "profile.json"
"""The profile's name in the run folder, next to summary.json and timeline.json."""
FIRST_ACTOR_SIZE = 8
"""The smallest minibatch timed: below it an update costs about the same whatever its size."""


def shape(cfg: EmbodiedConfig) -> dict[str, Any]:
    """The sizes that fix a step's work, and what decides its phases."""
    return {
        "total_num_envs": cfg.task.total_num_envs,
        "num_steps": cfg.rollout.num_steps,
        "pipeline_stage_num": cfg.rollout.pipeline_stage_num,
        "update_epochs": cfg.algorithm.update_epochs,
        "num_minibatches": cfg.algorithm.num_minibatches,
        "hidden_sizes": list(cfg.model.hidden_sizes),
        "max_staleness": cfg.runner.max_staleness,
        "offload": {name: getattr(cfg, name).enable_offload for name in ("env", "rollout", "actor")},
    }


def minibatch_size(cfg: EmbodiedConfig) -> int:
    """Samples per minibatch over all actor ranks: one step's samples over algorithm.num_minibatches (each actor
    rank's minibatch is its share of it)."""
    return cfg.task.total_num_envs * cfg.rollout.num_steps // cfg.algorithm.num_minibatches


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
        **where_it_ran(cfg.cluster.device_type, cores, node_cores, placement),
        "config": shape(cfg),
        "env": {"sizes": run_sizes, "seconds": env_seconds},
        "rollout": {"sizes": run_sizes, "seconds": rollout_seconds},
        "actor": {"sizes": actor_sizes, "seconds": actor_seconds},
        "average": average,
    }
