"""Simulator tasks are gymnasium environments, named by their gymnasium id (`task.env_id`), and what a policy needs to
know about them.

Gymnasium's own registry is the task registry: any registered id with a discrete or 1-D continuous action space
trains, so a new gymnasium task is one option file (`conf/task/<name>.yaml` with its `env_id`) and no code; an
environment of your own registers with `gymnasium.register` in a module imported first. Observations that are not
a flat vector (a discrete state, an image, a dict of parts) reach the policy flattened by `gymnasium.spaces.flatten`
(a discrete state one-hot; `observation_flattener`). An id gymnasium does not know, and spaces a policy cannot take, are
refused on the driver, before any worker starts.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache, partial
from typing import Any

import gymnasium as gym
import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActionSpec:
    """The action space as the policy head sees it.

    Discrete: `n` actions, each action a single integer. Continuous: a `dim`-vector bounded by `low`/`high`; the
    policy samples unbounded Gaussian actions and the env slice clips them to these bounds before stepping.
    """

    kind: str
    """`discrete` or `continuous`."""
    n: int = 0
    """Number of discrete actions (discrete only)."""
    dim: int = 0
    """Action vector length (continuous only)."""
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()

    @property
    def discrete(self) -> bool:
        return self.kind == "discrete"

    @classmethod
    def from_space(cls, space: gym.Space) -> ActionSpec:
        if isinstance(space, gym.spaces.Discrete):
            return cls(kind="discrete", n=int(space.n))
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            low, high = space.low.astype(float).tolist(), space.high.astype(float).tolist()
            return cls(kind="continuous", dim=int(space.shape[0]), low=tuple(low), high=tuple(high))
        raise ValueError(f"action space {space} is not supported: expected Discrete or a 1-D Box")


@dataclass(frozen=True)
class EnvSpec:
    """What the driver needs to size a policy and its buffers, read from the env's spaces."""

    env_id: str
    obs_dim: int
    action: ActionSpec


def check_env_id(env_id: str) -> str:
    """`env_id` if gymnasium has it registered, else a ValueError naming it and the closest registered ids."""
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
        hint = f"close: {', '.join(close)}" if close else "gymnasium.pprint_registry() lists them"
        raise ValueError(f"{env_id!r} is not a registered gymnasium environment ({hint})")
    return env_id


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """One gymnasium env; `kwargs` go to `gym.make` (e.g. `max_episode_steps`).

    The passive env checker is off: it only inspects the first step and the tests cover what it would check.
    """
    check_env_id(env_id)
    if str(gym.spec(env_id).entry_point).startswith("gymnasium.envs.mujoco"):
        _log_mujoco_warnings()
    return gym.make(env_id, disable_env_checker=True, **kwargs)


def observation_flattener(space: gym.Space) -> Callable[[Any], np.ndarray] | None:
    """What turns one observation of `space` into the flat vector a policy takes (None: it is one already, a 1-D
    Box). Outside the env rather than a gymnasium wrapper: a checkpoint pickles each sub-env whole, and
    `FlattenObservation` holds a lambda. ValueError for a space without a flat form (Graph, Sequence, Text)."""
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return None
    try:
        gym.spaces.flatdim(space)
    except (NotImplementedError, ValueError):
        raise ValueError(f"observation space {space} has no flat vector form") from None
    return partial(gym.spaces.flatten, space)


def flat_dim(space: gym.Space) -> int:
    """The length of `space`'s observations as the policy takes them (`observation_flattener`)."""
    observation_flattener(space)  # refuses a space without a flat form
    return int(gym.spaces.flatdim(space))


@cache
def _log_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to this module's logger, each text once per process.

    Its default handler appends every warning to MUJOCO_LOG.TXT in the working directory (a file a run must not
    leave behind) and prints it; HalfCheetah's model warns of a deprecated attribute each time it is compiled, that
    is once per simulator."""
    import mujoco

    mujoco.set_mju_user_warning(cache(lambda text: log.warning(f"MuJoCo: {text}")))


@lru_cache(maxsize=32)
def _spec(env_id: str, kwargs_items: tuple[tuple[str, Any], ...]) -> EnvSpec:
    try:
        env = make_env(env_id, **dict(kwargs_items))
    except gym.error.DependencyNotInstalled as err:  # e.g. Box2D for CarRacing: what to install, in one line
        raise ValueError(f"{env_id}: {err}") from None
    try:
        return EnvSpec(env_id, flat_dim(env.observation_space), ActionSpec.from_space(env.action_space))
    except ValueError as err:
        raise ValueError(f"{env_id}: {err}") from None
    finally:
        env.close()


def env_spec(env_id: str, **kwargs: Any) -> EnvSpec:
    """Observation size and action spec of an environment, read from one throwaway env (cached per id and kwargs).

    Reading the spaces instead of hard-coding them keeps the spec right when `kwargs` change the observation (e.g.
    HalfCheetah's `exclude_current_positions_from_observation`).
    """
    return _spec(check_env_id(env_id), tuple(sorted(kwargs.items())))
