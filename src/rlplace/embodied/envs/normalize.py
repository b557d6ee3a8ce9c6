"""Running normalisation of one sub-env's observations and rewards, as CleanRL's continuous-control PPO wraps each
of its envs (gymnasium's `NormalizeObservation` and `NormalizeReward`, each followed by a clip to +-10).

It lives beside the simulator rather than around it: the episode returns a run reports are the simulator's own
rewards, and the statistics go into the sub-env's checkpoint state (`SubEnvState.normalizer`). They are kept per
sub-env, so they depend on that sub-env's stream alone, never on how sub-envs are split over workers and stages, and
a run normalises alike in every placement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gymnasium.wrappers.utils import RunningMeanStd

CLIP = 10.0
"""Normalised observations and rewards are clipped to [-CLIP, CLIP] (CleanRL's bound)."""
EPSILON = 1e-8
"""Added to a variance before its square root (gymnasium's wrappers' default)."""


@dataclass(frozen=True)
class Normalization:
    """What a run normalises (`task.normalize_observation`, `task.normalize_reward`), and the discount of the return
    by which rewards are scaled (`algorithm.gamma`)."""

    observations: bool
    rewards: bool
    gamma: float

    def new(self, obs_dim: int) -> Normalizer:
        """A sub-env's fresh statistics."""
        return Normalizer(
            self.gamma,
            RunningMeanStd(shape=(obs_dim,), dtype=np.float32) if self.observations else None,
            RunningMeanStd(shape=()) if self.rewards else None,
        )


@dataclass
class Normalizer:
    """One sub-env's running statistics: of its observations (`observation_rms`, None when off), and of its
    discounted return (`return_rms`, None when off), by which each reward is scaled."""

    gamma: float
    observation_rms: RunningMeanStd | None
    return_rms: RunningMeanStd | None
    discounted_return: float = 0.0

    def observation(self, obs: np.ndarray) -> np.ndarray:
        """`obs` (one sub-env's, flat) after updating the statistics with it: standardised and clipped."""
        if self.observation_rms is None:
            return obs
        self.observation_rms.update(obs[None])
        scaled = (obs - self.observation_rms.mean) / np.sqrt(self.observation_rms.var + EPSILON)
        return np.clip(scaled, -CLIP, CLIP).astype(np.float32)

    def reward(self, reward: float, terminated: bool) -> float:
        """`reward` divided by the running standard deviation of the discounted return (which a termination
        restarts), clipped; unchanged when reward normalisation is off."""
        if self.return_rms is None:
            return reward
        self.discounted_return = self.discounted_return * self.gamma * (1.0 - terminated) + reward
        self.return_rms.update(np.array([self.discounted_return]))
        return float(np.clip(reward / np.sqrt(self.return_rms.var + EPSILON), -CLIP, CLIP))
