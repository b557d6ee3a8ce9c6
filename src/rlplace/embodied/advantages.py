"""Advantage estimators over (T, N) rollout buffers, as pure tensor functions, and `compute_advantages`, which picks
the one `algorithm.adv_estimator` names (`rlplace.embodied.algorithms.ADVANTAGE_ESTIMATORS`).

Buffers follow CleanRL's layout: row t holds what was seen *before* step t's transition. `dones[t]` is 1 when obs[t]
is the first observation of a new episode (the transition at t - 1 ended one); `last_done` is that flag for the
observation after the last step, and `last_value` its value estimate.

Truncation (CartPole's 500-step limit, for one) is treated like termination, CleanRL's simple convention: the value
after an ended episode is never bootstrapped. It biases returns near the time limit slightly downwards, and keeps
the env slices from having to ship the final observation of every truncated episode.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlplace.embodied.algorithms import ADVANTAGE_ESTIMATORS
from rlplace.embodied.config import PPOConfig
from rlplace.embodied.trajectory import Trajectory


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    last_value: Tensor,
    last_done: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016), exactly CleanRL's recursion.

    delta_t = r_t + gamma * V(s_{t+1}) * (1 - done_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lambda * (1 - done_{t+1}) * A_{t+1}
    Returns (advantages [T, N], returns = advantages + values [T, N]).
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last_gae_lam = torch.zeros_like(last_value)
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            next_non_terminal = 1.0 - last_done.to(rewards.dtype)
            next_values = last_value
        else:
            next_non_terminal = 1.0 - dones[t + 1].to(rewards.dtype)
            next_values = values[t + 1]
        delta = rewards[t] + gamma * next_values * next_non_terminal - values[t]
        advantages[t] = last_gae_lam = delta + gamma * gae_lambda * next_non_terminal * last_gae_lam
    return advantages, advantages + values


def group_normalized_advantages(
    rewards: Tensor,
    dones: Tensor,
    gamma: float,
    group_size: int,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Critic-free, GRPO-style advantages: each episode's return, normalised over the episodes of its env group.

    The embodied analogue of GRPO's "one group = several answers to one prompt" is "one group = `group_size`
    neighbouring sub-envs" (columns [g * group_size, (g + 1) * group_size)), whose episodes are compared with each
    other. Each env's rollout window is cut into episodes at `dones`; an episode's score is its discounted return
    from its first step in the window, and every step of the episode gets the advantage
    (score - mean of the group's scores) / (std of the group's scores + eps), each episode counting once. Episodes cut
    by the window's edges are scored on what lies inside it; with the GRPO set-up (every env reset at the start of the
    rollout and T at least the episode limit) every episode is whole. A group with one episode gets advantage 0.

    Returns (advantages [T, N], returns [T, N]) where returns are the discounted rewards-to-go within each episode
    (no bootstrap), a valid value target should a critic be trained alongside.
    """
    num_steps, num_envs = rewards.shape
    if group_size < 1 or num_envs % group_size != 0:
        raise ValueError(f"group_size = {group_size} must be positive and divide the number of envs ({num_envs})")
    returns = rewards.clone()  # the window's last step has no successor inside it: its return is its reward
    for t in reversed(range(num_steps - 1)):
        returns[t] += gamma * (1.0 - dones[t + 1].to(rewards.dtype)) * returns[t + 1]

    starts = dones.bool().clone()
    starts[0] = True  # the window's first step starts a (possibly cut) episode
    score = returns.clone()  # every step carries the score (return at the start) of its episode
    for t in range(1, num_steps):
        score[t] = torch.where(starts[t], returns[t], score[t - 1])

    num_groups = num_envs // group_size
    weight = starts.to(rewards.dtype).view(num_steps, num_groups, group_size)
    grouped_scores = score.view(num_steps, num_groups, group_size)
    count = weight.sum(dim=(0, 2))
    mean = (grouped_scores * weight).sum(dim=(0, 2)) / count
    var = (((grouped_scores - mean.view(1, -1, 1)) ** 2) * weight).sum(dim=(0, 2)) / count
    advantages = (grouped_scores - mean.view(1, -1, 1)) / (var.sqrt().view(1, -1, 1) + eps)
    return advantages.reshape(num_steps, num_envs), returns


def gae(batch: Trajectory, alg: PPOConfig) -> tuple[Tensor, Tensor]:
    """`algorithm.adv_estimator=gae`: GAE with the critic's rollout-time values."""
    return compute_gae(
        batch.rewards, batch.values, batch.dones, batch.last_value, batch.last_done, alg.gamma, alg.gae_lambda
    )


def group_norm(batch: Trajectory, alg: PPOConfig) -> tuple[Tensor, Tensor]:
    """`algorithm.adv_estimator=group_norm`: critic-free returns normalised within groups of sub-envs."""
    return group_normalized_advantages(batch.rewards, batch.dones, alg.gamma, alg.group_size)


def compute_advantages(batch: Trajectory, alg: PPOConfig) -> tuple[Tensor, Tensor]:
    """(advantages [T, N], returns [T, N]) of `batch` by the estimator `alg.adv_estimator` names."""
    return ADVANTAGE_ESTIMATORS[alg.adv_estimator].load()(batch, alg)
