"""Task names -> gymnasium environments, and what a policy needs to know about them.

A task is named in configs (`cartpole`, `halfcheetah`) or by its gymnasium id (`CartPole-v1`); both resolve here, and
anything else is refused with the valid choices, so a typo fails on the driver before any worker starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import gymnasium as gym
import numpy as np

TASKS: dict[str, str] = {
    "cartpole": "CartPole-v1",
    "halfcheetah": "HalfCheetah-v5",  # MuJoCo: needs the `mujoco` extra
}
"""Task name -> gymnasium environment id."""

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

    task: str
    env_id: str
    obs_dim: int
    action: ActionSpec


def resolve_env_id(task_name_or_env_id: str) -> str:
    """`cartpole` or `CartPole-v1` -> `CartPole-v1`; anything else is a ValueError naming the valid values."""
    if task_name_or_env_id in TASKS:
        return TASKS[task_name_or_env_id]
    if task_name_or_env_id in TASKS.values():
        return task_name_or_env_id
    valid = ", ".join(f"{name} ({env_id})" for name, env_id in TASKS.items())
    raise ValueError(f"unknown task {task_name_or_env_id!r}: valid tasks are {valid}")


def make_env(task_name_or_env_id: str, **kwargs: Any) -> gym.Env:
    """One gymnasium env for a task; `kwargs` go to `gym.make` (e.g. `max_episode_steps`).

    The passive env checker is off: it only inspects the first step and the tests cover what it would check.
    """
    env_id = resolve_env_id(task_name_or_env_id)
    if str(gym.spec(env_id).entry_point).startswith("gymnasium.envs.mujoco"):
        _log_mujoco_warnings()
    return gym.make(env_id, disable_env_checker=True, **kwargs)


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
    env = make_env(env_id, **dict(kwargs_items))
    try:
        obs_shape = env.observation_space.shape
        if obs_shape is None or len(obs_shape) != 1:
            raise ValueError(f"{env_id}: observation space {env.observation_space} is not a flat vector")
        task = next(name for name, known_id in TASKS.items() if known_id == env_id)
        return EnvSpec(
            task=task, env_id=env_id, obs_dim=int(np.prod(obs_shape)), action=ActionSpec.from_space(env.action_space)
        )
    finally:
        env.close()


def env_spec(task_name_or_env_id: str, **kwargs: Any) -> EnvSpec:
    """Observation size and action spec of a task, read from one throwaway env (cached per task and kwargs).

    Reading the spaces instead of hard-coding them keeps the spec right when `kwargs` change the observation (e.g.
    HalfCheetah's `exclude_current_positions_from_observation`).
    """
    return _spec(resolve_env_id(task_name_or_env_id), tuple(sorted(kwargs.items())))
