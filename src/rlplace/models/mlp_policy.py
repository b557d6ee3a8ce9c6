"""CleanRL's actor-critic MLP, with sampling driven by pre-drawn uniform noise.

Actor and critic are separate MLPs with CleanRL's initialisation (orthogonal, gain sqrt(2) in hidden layers, 0.01
for the policy head so the initial policy is near-uniform, 1.0 for the value head). Width and depth are config
choices, so a benchmark preset can make inference as costly as simulation.

`act` does not draw random numbers itself: it transforms uniform noise from `rlplace.algorithms.rng.uniform_noise`
(keyed by seed, global env index and step) by inverse CDF, so the action taken for an env at a step is the same no
matter which rollout worker or pipeline stage computes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.distributions import Categorical, Distribution, Normal

from rlplace.envs.registry import ActionSpec

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """CleanRL's init: orthogonal weights with gain `std`, constant bias."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, hidden_sizes: Sequence[int], out_dim: int, activation: str, out_std: float) -> nn.Sequential:
    """in -> hidden layers with `activation` -> linear out (initialised with gain `out_std`)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}: valid are {', '.join(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    for width in hidden_sizes:
        layers += [layer_init(nn.Linear(in_dim, width)), ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)


class MLPActorCritic(nn.Module):
    """Separate actor and critic MLPs; a Categorical head for discrete actions, a Gaussian one for continuous.

    The Gaussian's log standard deviation is a learned, state-independent vector (CleanRL's `actor_logstd`).
    """

    def __init__(
        self,
        obs_dim: int,
        action_spec: ActionSpec,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        init_log_std: float = 0.0,
    ) -> None:
        super().__init__()
        self.action_spec = action_spec
        out_dim = action_spec.n if action_spec.discrete else action_spec.dim
        self.actor = mlp(obs_dim, hidden_sizes, out_dim, activation, out_std=0.01)
        self.critic = mlp(obs_dim, hidden_sizes, 1, activation, out_std=1.0)
        if not action_spec.discrete:
            self.log_std = nn.Parameter(torch.full((action_spec.dim,), float(init_log_std)))

    @property
    def noise_dim(self) -> int:
        """Uniforms `act` needs per env: one for a categorical draw, one per action dimension for a Gaussian."""
        return 1 if self.action_spec.discrete else self.action_spec.dim

    def distribution(self, obs: Tensor) -> Distribution:
        """The policy pi(. | obs) as a torch distribution over a batch of observations."""
        out = self.actor(obs)
        if self.action_spec.discrete:
            return Categorical(logits=out, validate_args=False)  # validation costs more than the draw on the hot path
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    @torch.no_grad()
    def act(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sample actions by transforming `noise` (uniform (0, 1), [n, noise_dim]); returns action, logprob, value.

        Categorical: the inverse CDF, action = #{i : cdf_i < u}. Gaussian: mean + std * sqrt(2) * erfinv(2u - 1).
        Actions are long [n] (discrete) or float [n, dim] (continuous, unclipped: the env slice clips them).
        """
        dist = self.distribution(obs)
        noise = noise.to(device=obs.device, dtype=obs.dtype)
        if self.action_spec.discrete:
            cdf = dist.probs.cumsum(dim=-1)
            action = (cdf < noise[:, :1]).sum(dim=-1).clamp_(max=self.action_spec.n - 1)
        else:
            action = dist.mean + dist.stddev * math.sqrt(2.0) * torch.erfinv(2.0 * noise - 1.0)
        return action, self._logprob(dist, action), self.value(obs)

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """logprob [n], entropy [n] and value [n] of given actions, with gradients, for the PPO update."""
        dist = self.distribution(obs)
        entropy = dist.entropy() if self.action_spec.discrete else dist.entropy().sum(dim=-1)
        return self._logprob(dist, action), entropy, self.value(obs)

    def value(self, obs: Tensor) -> Tensor:
        """V(obs), [n]."""
        return self.critic(obs).squeeze(-1)

    def _logprob(self, dist: Distribution, action: Tensor) -> Tensor:
        if self.action_spec.discrete:
            return dist.log_prob(action.long())
        return dist.log_prob(action).sum(dim=-1)
