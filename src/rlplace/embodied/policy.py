"""CleanRL's actor-critic MLP, with sampling driven by pre-drawn uniform noise.

Actor and critic are separate MLPs with CleanRL's initialisation (orthogonal, gain sqrt(2) in hidden layers, 0.01
for the policy head so the initial policy is near-uniform, 1.0 for the value head). Width and depth are config
choices, so a benchmark preset can make inference as costly as simulation.

`act` does not draw random numbers itself: it transforms uniform noise from `rlplace.core.rng.uniform_noise`
(keyed by seed, global env index and step) by inverse CDF, so the action taken for an env at a step is the same no
matter which rollout worker or pipeline stage computes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlplace.embodied.envs.registry import ActionSpec

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


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

    The Gaussian's log standard deviation is a learned, state-independent vector (CleanRL's `actor_logstd`). The
    log-probabilities and entropies are written out rather than taken from torch.distributions: on the rollout hot
    path (a few envs per call) building distribution objects cost about a third of `act`.
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

    @torch.no_grad()
    def act(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sample actions by transforming `noise` (uniform (0, 1), [n, noise_dim]); returns action, logprob, value.

        Categorical: the inverse CDF, action = #{i : cdf_i < u}. Gaussian: mean + std * sqrt(2) * erfinv(2u - 1).
        Actions are long [n] (discrete) or float [n, dim] (continuous, unclipped: the env slice clips them).
        """
        out = self.actor(obs)
        noise = noise.to(out)
        if self.action_spec.discrete:
            log_probs = torch.log_softmax(out, dim=-1)
            action = (log_probs.exp().cumsum(dim=-1) < noise[:, :1]).sum(dim=-1).clamp_(max=self.action_spec.n - 1)
            logprob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        else:
            action = out + self.log_std.exp() * math.sqrt(2.0) * torch.erfinv(2.0 * noise - 1.0)
            logprob = self._gaussian_logprob(out, action)
        return action, logprob, self.value(obs)

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """logprob [n], entropy [n] and value [n] of given actions, with gradients, for the PPO update."""
        logprob, entropy = self._logprob_entropy(self.actor(obs), action)
        return logprob, entropy, self.value(obs)

    def logprob(self, obs: Tensor, action: Tensor) -> Tensor:
        """logprob [n] of given actions, the actor's alone: what the proximal policy of an asynchronous update needs,
        over a whole batch, at half the cost of `evaluate` (no critic)."""
        return self._logprob_entropy(self.actor(obs), action)[0]

    def _logprob_entropy(self, out: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        if self.action_spec.discrete:
            log_probs = torch.log_softmax(out, dim=-1)
            logprob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            return logprob, -(log_probs.exp() * log_probs).sum(dim=-1)
        entropy = (0.5 + _HALF_LOG_2PI + self.log_std).sum().expand(out.shape[0])
        return self._gaussian_logprob(out, action), entropy

    def value(self, obs: Tensor) -> Tensor:
        """V(obs), [n]."""
        return self.critic(obs).squeeze(-1)

    def _gaussian_logprob(self, mean: Tensor, action: Tensor) -> Tensor:
        """log N(action; mean, exp(log_std)^2), summed over action dimensions."""
        z = (action - mean) * torch.exp(-self.log_std)
        return (-0.5 * z**2 - self.log_std - _HALF_LOG_2PI).sum(dim=-1)
