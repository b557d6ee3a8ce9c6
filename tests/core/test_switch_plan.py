"""The phase switch plan: which groups are offloaded and onloaded before each phase, from placement and offload flags.

The phases are the embodied runner's: sync_weights (actor, rollout), generate_rollouts (env, rollout), training
(actor). The plan is the steady state, read off the second pass over the phases.
"""

from __future__ import annotations

import pytest

from rlplace.core.schedule import Switch, switch_plan
from rlplace.embodied.config import COMPONENTS
from rlplace.embodied.phases import PHASES
from rlplace.placement import ComponentPlacement

ALL_OFFLOAD = dict.fromkeys(COMPONENTS, True)


def plan_for(component_placement: dict, num_devices: int, offloadable: dict[str, bool] = ALL_OFFLOAD) -> dict:
    placement = ComponentPlacement(component_placement, 1, num_devices, components=COMPONENTS)
    devices = {name: frozenset(placement.devices_of(name)) for name in COMPONENTS}
    return switch_plan(PHASES, devices, offloadable)


def test_collocated_takes_turns() -> None:
    # Everything on devices 0-1. Before sync the actor and rollout work; env was onloaded for the last generation
    # and offloaded before training, so nothing moves but the rollout coming back. Before generation the actor
    # leaves and env returns; before training env and rollout leave and the actor returns.
    assert plan_for({"actor,env,rollout": "all"}, 2) == {
        "sync_weights": Switch(offload=(), onload=("rollout",)),
        "generate_rollouts": Switch(offload=("actor",), onload=("env",)),
        "training": Switch(offload=("env", "rollout"), onload=("actor",)),
    }


def test_hybrid_seed_example_offloads_what_shares_the_actors_devices() -> None:
    # actor on both devices, env on 0, rollout on 1 (placement=hybrid on cluster=local): the actor shares a device
    # with each of them, so the plan is the collocated one.
    assert plan_for({"actor": "all", "env": "0", "rollout": "1"}, 2) == plan_for({"actor,env,rollout": "all"}, 2)


def test_hybrid_leaves_a_component_alone_on_its_devices() -> None:
    # actor and env share device 0, the rollout has device 1 to itself: the rollout is never offloaded, and the sync
    # phase (actor and rollout) needs no switch at all.
    assert plan_for({"actor,env": "0", "rollout": "1"}, 2) == {
        "sync_weights": Switch(),
        "generate_rollouts": Switch(offload=("actor",), onload=("env",)),
        "training": Switch(offload=("env",), onload=("actor",)),
    }


def test_only_offloadable_components_move() -> None:
    # The seed example with rollout.enable_offload=false: the rollout stays on its device throughout.
    offloadable = {"actor": True, "env": True, "rollout": False}
    assert plan_for({"actor": "all", "env": "0", "rollout": "1"}, 2, offloadable) == {
        "sync_weights": Switch(),
        "generate_rollouts": Switch(offload=("actor",), onload=("env",)),
        "training": Switch(offload=("env",), onload=("actor",)),
    }
    nothing = dict.fromkeys(COMPONENTS, False)
    assert set(plan_for({"actor,env,rollout": "all"}, 2, nothing).values()) == {Switch()}


@pytest.mark.parametrize("offloadable", [ALL_OFFLOAD, dict.fromkeys(COMPONENTS, False)])
def test_disaggregated_switches_nothing(offloadable: dict[str, bool]) -> None:
    # env 0, rollout 1, actor 2-3: no device is shared, so no phase waits for an offload or onload.
    plan = plan_for({"env": "0", "rollout": "1", "actor": "2-3"}, 4, offloadable)
    assert plan == dict.fromkeys(("sync_weights", "generate_rollouts", "training"), Switch())


def test_node_group_components_hold_no_devices() -> None:
    # CPU simulators placed on the node (gpu_single experiment): env shares no device, so only actor and rollout
    # take turns on device 0 (both work while syncing: the rollout, offloaded for training, comes back first).
    placement = {"actor,rollout": 0, "env": {"node_group": "node", "placement": "0:0-1"}}
    assert plan_for(placement, 1) == {
        "sync_weights": Switch(onload=("rollout",)),
        "generate_rollouts": Switch(offload=("actor",)),
        "training": Switch(offload=("rollout",), onload=("actor",)),
    }


def test_reasoning_collocated_preset_moves_the_inference_models_out_while_the_actor_trains() -> None:
    # The reasoning phases: sync_weights (actor, rollout, inference), generate_rollouts (rollout, reward, inference),
    # training (actor). Everything on one device, as placement=reasoning_collocated sets the switches (a rule reward
    # holds no device memory): the engine and the inference group's models leave for training and come back to
    # receive the new weights.
    from rlplace.reasoning.config import COMPONENTS as REASONING
    from rlplace.reasoning.phases import PHASES as REASONING_PHASES

    devices = dict.fromkeys(REASONING, frozenset({0}))
    offloadable = {"actor": True, "rollout": True, "inference": True, "reward": False}
    assert switch_plan(REASONING_PHASES, devices, offloadable) == {
        "sync_weights": Switch(onload=("rollout", "inference")),
        "generate_rollouts": Switch(offload=("actor",)),
        "training": Switch(offload=("rollout", "inference"), onload=("actor",)),
    }
