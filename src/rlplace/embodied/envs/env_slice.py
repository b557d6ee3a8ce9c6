"""A contiguous slice of sub-environments, addressed by global env index.

Env workers each hold the sub-envs with global indices [start, end), further split into pipeline stages. Everything
that could make results depend on that split is keyed by the global index instead of by position in a worker: sub-env
i is seeded `seed + i`, and finished episodes are reported with their global index and the step they ended on, so the
episodes of any split can be merged back into one deterministic order (see `merge_episode_stats`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .registry import ActionSpec, make_env


class EpisodeStats(NamedTuple):
    """Finished episodes, one list entry per episode, ordered by (end_step, env_index)."""

    returns: list[float]
    lengths: list[int]
    env_indices: list[int]
    """Global index of the sub-env that played the episode."""
    end_steps: list[int]
    """The slice's step count (calls to `step` since the first `reset`) on which the episode ended."""


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

    def __init__(self, task: str, start: int, end: int, seed: int, **env_kwargs: Any) -> None:
        if not 0 <= start < end:
            raise ValueError(f"env slice [{start}, {end}) must be a non-empty range of non-negative global indices")
        self.start, self.end, self.seed = start, end, seed
        self.envs = [make_env(task, **env_kwargs) for _ in range(end - start)]
        first = self.envs[0]
        self.obs_dim = int(np.prod(first.observation_space.shape))
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
            obs[i], _ = env.reset(seed=seed)
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
            obs.append(o)
            rewards.append(r)
            terminated.append(term)
            truncated.append(trunc)
        return (
            np.asarray(obs, dtype=np.float32),
            np.asarray(rewards, dtype=np.float32),
            np.asarray(terminated, dtype=bool),
            np.asarray(truncated, dtype=bool),
        )

    def pop_episode_stats(self) -> EpisodeStats:
        """Episodes finished since the last call, ordered by (end_step, env_index); clears them."""
        finished, self._finished = self._finished, EpisodeStats([], [], [], [])
        return finished

    def close(self) -> None:
        for env in self.envs:
            env.close()
