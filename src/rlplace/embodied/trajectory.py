"""The unit of data that flows from rollout to actor: one pipeline stream's T steps, in (T, n, ...) tensors.

A stream is the sub-envs of one env worker's pipeline stage. Rollout workers fill one `Trajectory` per stream they
serve; actor workers merge them by global env index, so the batch the actor trains on is the same whatever the
split of envs over workers and stages.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

PER_ENV = ("env_indices", "versions", "last_value", "last_done")
"""The fields with one entry per env column ([n]); the others are [T, n, ...]."""


@dataclass
class Trajectory:
    env_indices: Tensor
    """Global env index of each column, int64 [n]."""
    versions: Tensor
    """The policy version (updates the weights had) that chose each column's actions, int64 [n]."""
    obs: Tensor
    """Observation the action was chosen from, [T, n, obs_dim]."""
    actions: Tensor
    """[T, n] (discrete) or [T, n, dim] (continuous, unclipped)."""
    logprobs: Tensor
    """Log-probability of the action under the behaviour policy, [T, n]."""
    values: Tensor
    """Critic value of obs, [T, n]."""
    rewards: Tensor
    """Reward received for the action, [T, n]."""
    dones: Tensor
    """Whether obs[t] is the first observation of a new episode (CleanRL's `done`), [T, n]."""
    last_value: Tensor
    """Critic value of the observation after the last step, [n] (bootstraps GAE)."""
    last_done: Tensor
    """Whether that observation starts a new episode, [n]."""

    @staticmethod
    def allocate(
        num_steps: int, env_indices: Tensor, obs_dim: int, action_shape: tuple[int, ...], version: int
    ) -> Trajectory:
        """Pre-allocated buffers for `num_steps` steps of the given envs acted on with weights `version`, filled in
        place by the rollout."""
        n = len(env_indices)
        return Trajectory(
            env_indices=env_indices.clone(),
            versions=torch.full((n,), version, dtype=torch.int64),
            obs=torch.zeros(num_steps, n, obs_dim),
            actions=torch.zeros((num_steps, n, *action_shape)),
            logprobs=torch.zeros(num_steps, n),
            values=torch.zeros(num_steps, n),
            rewards=torch.zeros(num_steps, n),
            dones=torch.zeros(num_steps, n),
            last_value=torch.zeros(n),
            last_done=torch.zeros(n),
        )

    @staticmethod
    def merge(parts: list[Trajectory]) -> Trajectory:
        """Concatenate streams along the env axis, ordered by global env index."""
        order = torch.argsort(torch.cat([p.env_indices for p in parts]))
        merged = {}
        for f in fields(Trajectory):
            per_env_axis = 0 if f.name in PER_ENV else 1
            merged[f.name] = torch.cat([getattr(p, f.name) for p in parts], dim=per_env_axis).index_select(
                per_env_axis, order
            )
        return Trajectory(**merged)

    def ending(self) -> Ending:
        """What only the env's answer to the last action fills: sent after the rest of the trajectory, so that the
        rest travels while the env takes its last step."""
        return Ending(self.env_indices, self.rewards[-1], self.last_value, self.last_done)

    def finish(self, ending: Ending) -> None:
        """Take in the `ending` of these columns (in place)."""
        assert torch.equal(ending.env_indices, self.env_indices), "an ending belongs to the columns it was cut from"
        self.rewards[-1], self.last_value, self.last_done = ending.last_reward, ending.last_value, ending.last_done

    @staticmethod
    def assemble(parts: list[Trajectory | Ending]) -> Trajectory:
        """The batch from trajectories sent without their endings and those endings, in any order (several rollout
        ranks write to one actor): each ending finishes the trajectory of the same envs; then `merge`."""
        endings = {int(p.env_indices[0]): p for p in parts if isinstance(p, Ending)}
        bodies = [p for p in parts if isinstance(p, Trajectory)]
        assert len(bodies) == len(endings), f"{len(bodies)} trajectories and {len(endings)} endings"
        for body in bodies:
            body.finish(endings[int(body.env_indices[0])])
        return Trajectory.merge(bodies)

    def columns(self, start: int, end: int) -> Trajectory:
        """The envs in positions [start, end) of this trajectory (an actor rank's data-parallel shard)."""
        picked = {}
        for f in fields(Trajectory):
            value = getattr(self, f.name)
            picked[f.name] = value[start:end] if f.name in PER_ENV else value[:, start:end]
        return Trajectory(**picked)


@dataclass
class Ending:
    """The end of a trajectory's columns, known only once the env answered the last action (`Trajectory.ending`)."""

    env_indices: Tensor
    last_reward: Tensor
    """The reward for the last action, [n]: the trajectory's rewards[-1]."""
    last_value: Tensor
    last_done: Tensor
