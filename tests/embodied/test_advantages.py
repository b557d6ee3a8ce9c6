"""GAE and group-normalised advantages against hand-computed examples, and the `algorithm.adv_estimator` registry."""

from __future__ import annotations

import pytest
import torch

from rlplace.core.errors import ConfigError
from rlplace.embodied.advantages import compute_advantages, compute_gae, group_normalized_advantages
from rlplace.embodied.algorithms import ADVANTAGE_ESTIMATORS
from rlplace.embodied.config import PPOConfig
from rlplace.embodied.trajectory import Trajectory


def test_gae_hand_computed() -> None:
    # One env, T = 3, gamma = 0.5, lambda = 0.5 (gamma * lambda = 0.25). An episode ends after step 1, so obs[2]
    # starts a new one (dones[2] = 1); the observation after step 2 is mid-episode (last_done = 0), V = 4.
    #   rewards = [1, 2, 3], values = [1, 1, 2]
    #   t=2: delta = 3 + 0.5 * 4 * 1 - 2 = 3;                 A2 = 3
    #   t=1: delta = 2 + 0.5 * 2 * 0 - 1 = 1 (episode ended); A1 = 1 + 0.25 * 0 * 3 = 1
    #   t=0: delta = 1 + 0.5 * 1 * 1 - 1 = 0.5;               A0 = 0.5 + 0.25 * 1 * 1 = 0.75
    #   returns = A + V = [1.75, 2, 5]
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[1.0], [1.0], [2.0]])
    dones = torch.tensor([[0.0], [0.0], [1.0]])
    advantages, returns = compute_gae(rewards, values, dones, torch.tensor([4.0]), torch.tensor([0.0]), 0.5, 0.5)
    torch.testing.assert_close(advantages, torch.tensor([[0.75], [1.0], [3.0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.75], [2.0], [5.0]]))


def test_gae_last_done_stops_bootstrap() -> None:
    # The last transition ended an episode: A = r - V = 1 - 0.5, whatever the next value.
    advantages, _ = compute_gae(
        torch.ones(1, 1),
        torch.full((1, 1), 0.5),
        torch.zeros(1, 1),
        torch.tensor([100.0]),
        torch.tensor([1.0]),
        0.99,
        0.95,
    )
    torch.testing.assert_close(advantages, torch.tensor([[0.5]]))


def test_gae_lambda_one_is_discounted_return_minus_value() -> None:
    torch.manual_seed(0)
    rewards, values = torch.rand(5, 2), torch.rand(5, 2)
    last_value = torch.rand(2)
    _, returns = compute_gae(rewards, values, torch.zeros(5, 2), last_value, torch.zeros(2), 0.9, 1.0)
    expected = last_value.clone()
    for t in reversed(range(5)):
        expected = rewards[t] + 0.9 * expected
    torch.testing.assert_close(returns[0], expected)


def test_group_normalized_hand_computed() -> None:
    # Two groups of two envs, T = 3, gamma = 1. Env 0: one episode, rewards 1+1+1 = 3. Env 1: an episode of 1 step
    # (return 1), then one of 2 steps (return 2). Group 0's scores: [3, 1, 2], mean 2, std sqrt(2/3) = 0.8165.
    #   env 0 -> (3 - 2) / 0.8165 = 1.2247 on all steps; env 1 -> -1.2247, then 0, 0.
    # Env 2: rewards [2, 0, 0] (score 2); env 3: rewards [0, 0, 4] (score 4): mean 3, std 1 -> -1 and +1.
    rewards = torch.tensor([[1.0, 1.0, 2.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 4.0]])
    dones = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    advantages, returns = group_normalized_advantages(rewards, dones, gamma=1.0, group_size=2)
    a = (3 - 2) / (2 / 3) ** 0.5
    expected = torch.tensor([[a, -a, -1.0, 1.0], [a, 0.0, -1.0, 1.0], [a, 0.0, -1.0, 1.0]])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=1e-5)
    # Returns are rewards-to-go within each episode: env 1 restarts at t = 1.
    torch.testing.assert_close(returns[:, 1], torch.tensor([1.0, 2.0, 1.0]))
    torch.testing.assert_close(returns[:, 3], torch.tensor([4.0, 4.0, 4.0]))


def test_group_normalized_single_episode_group_is_zero() -> None:
    advantages, _ = group_normalized_advantages(torch.ones(4, 1), torch.zeros(4, 1), 0.99, 1)
    torch.testing.assert_close(advantages, torch.zeros(4, 1))


def test_group_size_must_divide_envs() -> None:
    with pytest.raises(ValueError, match="group_size = 3"):
        group_normalized_advantages(torch.ones(2, 4), torch.zeros(2, 4), 1.0, 3)


def _batch(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor) -> Trajectory:
    num_steps, num_envs = rewards.shape
    batch = Trajectory.allocate(num_steps, torch.arange(num_envs), obs_dim=1, action_shape=(), version=0)
    batch.rewards, batch.values, batch.dones = rewards, values, dones
    return batch


def test_registry_uniform_call_and_unknown_name() -> None:
    # Every estimator takes (batch, algorithm section) and is what `compute_advantages` dispatches to by name.
    batch = _batch(torch.ones(3, 2), torch.zeros(3, 2), torch.zeros(3, 2))
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "group_norm"}
    for name, estimator in ADVANTAGE_ESTIMATORS.items():
        alg = PPOConfig(adv_estimator=name, gamma=0.99, gae_lambda=0.95, group_size=2)
        advantages, returns = estimator.load()(batch, alg)
        assert advantages.shape == returns.shape == (3, 2)
        for got, expected in zip(compute_advantages(batch, alg), (advantages, returns), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # An unknown name never reaches the registry: the algorithm section refuses it, naming the valid ones.
    with pytest.raises(ConfigError, match="'vtrace'.*gae, group_norm"):
        PPOConfig(adv_estimator="vtrace")


def test_estimators_read_the_algorithm_section() -> None:
    # gae follows gamma and gae_lambda (the hand-computed example above); group_norm follows gamma and group_size.
    batch = _batch(torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[1.0], [1.0], [2.0]]), torch.zeros(3, 1))
    batch.dones[2], batch.last_value = 1.0, torch.tensor([4.0])
    advantages, returns = compute_advantages(batch, PPOConfig(adv_estimator="gae", gamma=0.5, gae_lambda=0.5))
    torch.testing.assert_close(advantages, torch.tensor([[0.75], [1.0], [3.0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.75], [2.0], [5.0]]))
    rewards = torch.tensor([[1.0, 1.0, 2.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 4.0]])
    dones = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    alg = PPOConfig(adv_estimator="group_norm", gamma=1.0, group_size=2)
    advantages, returns = compute_advantages(_batch(rewards, torch.zeros(3, 4), dones), alg)
    expected = group_normalized_advantages(rewards, dones, gamma=1.0, group_size=2)
    torch.testing.assert_close(advantages, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(returns, expected[1], rtol=0, atol=0)
