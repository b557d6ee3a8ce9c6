"""A contiguous slice of sub-environments, addressed by global env index.

Env workers each hold the sub-envs with global indices [start, end), further split into pipeline stages. Everything
that could make results depend on that split is keyed by the global index instead of by position in a worker: sub-env
i is seeded `seed + i`, finished episodes are reported with their global index and the step they ended on, so the
episodes of any split can be merged back into one deterministic order (see `merge_episode_stats`), and a checkpoint
keeps each sub-env's state by global index (`SubEnvState`), so slices of another split can take it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from .normalize import Normalization, Normalizer
from .registry import ActionSpec, flat_dim, make_env, observation_flattener


class EpisodeStats(NamedTuple):
    """Finished episodes, one list entry per episode, ordered by (end_step, env_index)."""

    returns: list[float]
    lengths: list[int]
    env_indices: list[int]
    """Global index of the sub-env that played the episode."""
    end_steps: list[int]
    """The slice's step count (calls to `step` since the first `reset`) on which the episode ended."""


class SubEnvState(NamedTuple):
    """One sub-env between two steps: everything its future observations, rewards and episode stats depend on.

    Per sub-env rather than per slice, so that a checkpoint can store it by global index and a run split differently
    over env processes and stages can resume it (`EnvSlice.restore`).
    """

    env: gym.Env
    """The simulator and its wrappers (the time limit's step count included), mid-episode. A simulator that wraps C
    code (MuJoCo) pickles as its constructor arguments only (gymnasium's `EzPickle`), so it comes back fresh and
    `reset_rng` and `physics` carry what it held."""
    reset_rng: np.random.Generator
    """The simulator's own RNG, which draws the initial state of each auto-reset."""
    physics: np.ndarray | None
    """MuJoCo's integration state (`mj_getState`), None for a pure-Python simulator (pickled whole)."""
    episode_return: float
    episode_length: int
    """The running episode's return and length so far, reported when it ends."""
    step_count: int
    """The slice's step count: finished episodes are ordered by it across slices (`EpisodeStats.end_steps`)."""
    normalizer: Normalizer | None = None
    """Its observation and reward statistics, with task.normalize_observation or task.normalize_reward."""

    @classmethod
    def take(
        cls, env: gym.Env, episode_return: float, episode_length: int, step_count: int, normalizer: Normalizer | None
    ) -> SubEnvState:
        """The state of `env` now; `revive` gives it back as it is, whether pickled in between or not."""
        physics = _get_physics(env)
        return cls(env, env.unwrapped.np_random, physics, episode_return, episode_length, step_count, normalizer)

    def revive(self) -> gym.Env:
        """The simulator as it was taken, also when unpickling rebuilt it fresh from its constructor arguments."""
        self.env.unwrapped.np_random = self.reset_rng
        if self.physics is not None:
            _set_physics(self.env, self.physics)
        return self.env


def _mujoco_env(env: gym.Env) -> Any:
    """The MuJoCo simulator under `env`'s wrappers, or None (always None without the `mujoco` extra)."""
    try:
        from gymnasium.envs.mujoco import MujocoEnv
    except ImportError:
        return None
    return env.unwrapped if isinstance(env.unwrapped, MujocoEnv) else None


def _get_physics(env: gym.Env) -> np.ndarray | None:
    """MuJoCo's integration state: every field the next steps depend on (time, positions, velocities, actuator
    activations, the solver's warm start, controls, applied forces, ...); None for a simulator that is not MuJoCo."""
    sim = _mujoco_env(env)
    if sim is None:
        return None
    import mujoco  # imported with MujocoEnv above

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    physics = np.empty(mujoco.mj_stateSize(sim.model, spec))
    mujoco.mj_getState(sim.model, sim.data, physics, spec)
    return physics


def _set_physics(env: gym.Env, physics: np.ndarray) -> None:
    import mujoco  # only MuJoCo envs have physics to set

    sim = _mujoco_env(env)
    mujoco.mj_setState(sim.model, sim.data, physics, mujoco.mjtState.mjSTATE_INTEGRATION)


def split_stages(start: int, end: int, num_stages: int) -> list[tuple[int, int]]:
    """Split global indices [start, end) into `num_stages` contiguous (start, end) ranges, sizes differing by <= 1.

    The same split serves env workers (split the total over workers) and pipeline stages (split a worker's range);
    the first ranges take the remainder, like `numpy.array_split`.
    """
    n = end - start
    if num_stages < 1 or n < num_stages:
        raise ValueError(f"cannot split envs [{start}, {end}) into {num_stages} stages: need 1 <= stages <= {n}")
    base, extra = divmod(n, num_stages)
    bounds = [start]
    for s in range(num_stages):
        bounds.append(bounds[-1] + base + (s < extra))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def merge_episode_stats(parts: list[EpisodeStats]) -> EpisodeStats:
    """Merge the stats of several slices stepped in lockstep into the order one slice over all of them would give."""
    rows = sorted(
        (end_step, env_index, ret, length)
        for part in parts
        for ret, length, env_index, end_step in zip(*part, strict=True)
    )
    return EpisodeStats(
        returns=[r[2] for r in rows],
        lengths=[r[3] for r in rows],
        env_indices=[r[1] for r in rows],
        end_steps=[r[0] for r in rows],
    )


class EnvSlice:
    """Sub-envs with global indices [start, end), stepped together with same-step auto-reset.

    When a sub-env's episode ends (terminated or truncated), it is reset within the same `step` call and the
    observation returned for it is the new episode's first one, as in CleanRL's vector envs. The finished episode's
    return and length are kept until `pop_episode_stats`. The final observation of the ended episode is not returned:
    advantages follow CleanRL's convention of treating truncation like termination (see `compute_gae`).
    """

    def __init__(
        self, task: str, start: int, end: int, seed: int, normalize: Normalization | None = None, **env_kwargs: Any
    ) -> None:
        if not 0 <= start < end:
            raise ValueError(f"env slice [{start}, {end}) must be a non-empty range of non-negative global indices")
        self.start, self.end, self.seed = start, end, seed
        self.envs = [make_env(task, **env_kwargs) for _ in range(end - start)]
        first = self.envs[0]
        self.obs_dim = flat_dim(first.observation_space)
        self._flatten = observation_flattener(first.observation_space)
        self.normalizers = [None if normalize is None else normalize.new(self.obs_dim) for _ in self.envs]
        """Each sub-env's running statistics (`normalize`), None when the run normalises nothing."""
        self.action_spec = ActionSpec.from_space(first.action_space)
        if not self.action_spec.discrete:
            self._low = np.asarray(self.action_spec.low, dtype=np.float32)
            self._high = np.asarray(self.action_spec.high, dtype=np.float32)
        self._seeded = False
        self._step_count = 0
        self._running_return = [0.0] * self.num_envs
        self._running_length = [0] * self.num_envs
        self._finished = EpisodeStats([], [], [], [])

    @property
    def num_envs(self) -> int:
        return self.end - self.start

    @property
    def global_indices(self) -> np.ndarray:
        """Global env index of each sub-env (keys the action-sampling noise)."""
        return np.arange(self.start, self.end, dtype=np.int64)

    def reset(self) -> np.ndarray:
        """Reset every sub-env; the first call seeds sub-env i with `seed + i`. Returns obs (float32 [n, obs_dim])."""
        obs = np.empty((self.num_envs, self.obs_dim), dtype=np.float32)
        for i, env in enumerate(self.envs):
            seed = None if self._seeded else self.seed + self.start + i
            o, _ = env.reset(seed=seed)
            obs[i] = self._observed(i, o)
        self._seeded = True
        self._running_return = [0.0] * self.num_envs
        self._running_length = [0] * self.num_envs
        return obs

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every sub-env once; returns obs (float32 [n, obs_dim]), rewards (float32 [n]), terminated, truncated.

        `actions` is int [n] for discrete tasks, float [n, dim] for continuous ones (clipped to the bounds here).
        """
        if not self._seeded:
            raise RuntimeError("EnvSlice.step called before reset")
        actions = np.asarray(actions)
        if self.action_spec.discrete:
            actions = actions.reshape(self.num_envs).tolist()  # Python ints: the cheapest thing to hand to a sim
        else:
            actions = np.clip(actions.reshape(self.num_envs, -1), self._low, self._high)
        obs, rewards, terminated, truncated = [], [], [], []  # lists, then one array each: cheaper than item writes
        self._step_count += 1
        ret, length, finished = self._running_return, self._running_length, self._finished
        normalizers = self.normalizers
        for i, env in enumerate(self.envs):
            o, r, term, trunc, _ = env.step(actions[i])
            ret[i] += r
            length[i] += 1
            if term or trunc:
                finished.returns.append(float(ret[i]))
                finished.lengths.append(length[i])
                finished.env_indices.append(self.start + i)
                finished.end_steps.append(self._step_count)
                ret[i], length[i] = 0.0, 0
                o, _ = env.reset()
            if normalizers[i] is not None:
                r = normalizers[i].reward(r, term)
            obs.append(o)
            rewards.append(r)
            terminated.append(term)
            truncated.append(trunc)
        if self._flatten is not None or normalizers[0] is not None:
            obs = [self._observed(i, o) for i, o in enumerate(obs)]
        return (
            np.asarray(obs, dtype=np.float32),
            np.asarray(rewards, dtype=np.float32),
            np.asarray(terminated, dtype=bool),
            np.asarray(truncated, dtype=bool),
        )

    def _observed(self, i: int, obs: Any) -> np.ndarray:
        """Sub-env i's observation as the policy gets it: flattened, then normalised when the run normalises."""
        flat = obs if self._flatten is None else self._flatten(obs)
        normalizer = self.normalizers[i]
        return flat if normalizer is None else normalizer.observation(np.asarray(flat, dtype=np.float32))

    def states(self) -> list[SubEnvState]:
        """Each sub-env's state, in global index order. Take it between steps after `pop_episode_stats`: episodes
        finished but not yet popped are not part of it."""
        parts = zip(self.envs, self._running_return, self._running_length, self.normalizers, strict=True)
        return [SubEnvState.take(env, ret, length, self._step_count, norm) for env, ret, length, norm in parts]

    def restore(self, states: Sequence[SubEnvState]) -> None:
        """Continue from `states` (one per sub-env, in global index order), whichever split of slices took them.

        The simulators come from `states`, so this slice's own (fresh) ones are closed.
        """
        self.close()
        self.envs = [state.revive() for state in states]
        self.normalizers = [state.normalizer for state in states]
        self._running_return = [state.episode_return for state in states]
        self._running_length = [state.episode_length for state in states]
        self._step_count = states[0].step_count
        self._seeded = True

    def pop_episode_stats(self) -> EpisodeStats:
        """Episodes finished since the last call, ordered by (end_step, env_index); clears them."""
        finished, self._finished = self._finished, EpisodeStats([], [], [], [])
        return finished

    def close(self) -> None:
        for env in self.envs:
            env.close()
