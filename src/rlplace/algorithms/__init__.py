"""RL math as pure tensor functions: counter-based noise, advantage estimators, PPO losses and the PPO update."""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_gae,
    get_advantage_estimator,
    group_normalized_advantages,
)
from .losses import entropy_bonus, ppo_policy_loss, value_loss
from .ppo import BATCH_KEYS, PPOParams, ppo_update
from .rng import uniform_noise

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "BATCH_KEYS",
    "PPOParams",
    "compute_gae",
    "entropy_bonus",
    "get_advantage_estimator",
    "group_normalized_advantages",
    "ppo_policy_loss",
    "ppo_update",
    "uniform_noise",
    "value_loss",
]
