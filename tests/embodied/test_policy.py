"""MLPActorCritic: shapes, CleanRL init, noise-driven sampling that agrees with evaluate and with the distribution."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlplace.core.rng import uniform_noise
from rlplace.embodied.envs import ActionSpec
from rlplace.embodied.policy import MLPActorCritic

DISCRETE = ActionSpec(kind="discrete", n=3)
CONTINUOUS = ActionSpec(kind="continuous", dim=2, low=(-1.0, -1.0), high=(1.0, 1.0))


@pytest.mark.parametrize(("spec", "action_shape"), [(DISCRETE, (5,)), (CONTINUOUS, (5, 2))])
def test_shapes_and_act_logprob_equals_evaluate(spec: ActionSpec, action_shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = MLPActorCritic(4, spec, hidden_sizes=(32, 16, 8), activation="relu")
    obs = torch.randn(5, 4)
    action, logprob, value = model.act(obs, uniform_noise(0, np.arange(5), 0, model.noise_dim))
    assert action.shape == action_shape and logprob.shape == value.shape == (5,)
    assert not logprob.requires_grad
    new_logprob, entropy, new_value = model.evaluate(obs, action)
    assert entropy.shape == (5,) and new_logprob.requires_grad
    torch.testing.assert_close(new_logprob.detach(), logprob)
    torch.testing.assert_close(new_value.detach(), value)
    torch.testing.assert_close(model.value(obs).detach(), value)


def test_cleanrl_init() -> None:
    model = MLPActorCritic(4, DISCRETE, hidden_sizes=(64, 64))
    linears = [m for m in model.actor if isinstance(m, torch.nn.Linear)]
    assert [lin.out_features for lin in linears] == [64, 64, 3]
    # Orthogonal with gain g: W W^T = g^2 I for a wide-enough matrix; policy head gain 0.01, value head 1.0.
    torch.testing.assert_close(linears[1].weight @ linears[1].weight.T, 2.0 * torch.eye(64), atol=1e-4, rtol=0)
    assert linears[-1].weight.norm().item() == pytest.approx(0.01 * math.sqrt(3), rel=1e-4)
    assert model.critic[-1].weight.norm().item() == pytest.approx(1.0, rel=1e-4)
    assert all(lin.bias.abs().max() == 0 for lin in linears)


def test_categorical_inverse_cdf_matches_probabilities() -> None:
    torch.manual_seed(1)
    model = MLPActorCritic(2, DISCRETE, hidden_sizes=(8,))
    with torch.no_grad():
        model.actor[-1].weight.mul_(300.0)  # a peaked, non-uniform policy
    obs = torch.tensor([[0.3, -0.7]]).expand(20_000, 2)
    action, _, _ = model.act(obs, uniform_noise(4, np.arange(20_000), 0, 1))
    freq = torch.bincount(action, minlength=3).float() / 20_000
    probs = torch.softmax(model.actor(obs[:1]), dim=-1)[0].detach()
    assert probs.max() > 0.5 and probs.min() > 0.05
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


def test_gaussian_noise_transform() -> None:
    model = MLPActorCritic(3, CONTINUOUS, init_log_std=math.log(0.5))
    obs = torch.zeros(1, 3).expand(50_000, 3)
    action, _, _ = model.act(obs, uniform_noise(2, np.arange(50_000), 7, 2))
    mean = model.actor(obs[:1]).detach()
    torch.testing.assert_close(action.mean(0), mean[0], atol=0.01, rtol=0)
    torch.testing.assert_close(action.std(0), torch.full((2,), 0.5), atol=0.01, rtol=0)
    # u = 0.5 gives the mean exactly; the noise is the only randomness.
    torch.testing.assert_close(model.act(obs[:1], torch.full((1, 2), 0.5))[0], mean)


@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS])
def test_logprob_and_entropy_match_torch_distributions(spec: ActionSpec) -> None:
    torch.manual_seed(2)
    model = MLPActorCritic(4, spec, init_log_std=-0.3)
    obs = torch.randn(6, 4)
    action, _, _ = model.act(obs, uniform_noise(0, np.arange(6), 1, model.noise_dim))
    logprob, entropy, _ = model.evaluate(obs, action)
    out = model.actor(obs)
    if spec.discrete:
        dist = torch.distributions.Categorical(logits=out)
        expected_logprob, expected_entropy = dist.log_prob(action), dist.entropy()
    else:
        dist = torch.distributions.Normal(out, model.log_std.exp().expand_as(out))
        expected_logprob, expected_entropy = dist.log_prob(action).sum(-1), dist.entropy().sum(-1)
    torch.testing.assert_close(logprob, expected_logprob)
    torch.testing.assert_close(entropy, expected_entropy)


def test_unknown_activation() -> None:
    with pytest.raises(ValueError, match="'gelu'.*tanh, relu"):
        MLPActorCritic(4, DISCRETE, activation="gelu")
