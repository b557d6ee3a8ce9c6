"""PPO's loss terms (Schulman et al., 2017) as pure tensor functions, so each one can be checked by hand.

The total loss, in the paper's notation, is L = L_clip - c2 * S + c1 * L_vf, where `ppo_policy_loss` is L_clip (as a
quantity to minimise), `entropy_bonus` is S and `value_loss` is L_vf.

With asynchronous training (runner.max_staleness > 0) the rollouts come from an older behaviour policy π_behav.
`rlplace.core.off_policy.behaviour_weight` turns that into one detached importance weight per sample, which
`ppo_policy_loss` multiplies into the clipped surrogate it takes against the proximal policy π_prox
(algorithm.off_policy_correction says how).
"""

from __future__ import annotations

import torch
from torch import Tensor


def ppo_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    weight: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped surrogate objective, negated: mean(w * max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))).

    r = exp(logprob - old_logprob), with `old_logprob` the proximal policy's: the rollout policy's in synchronous
    training, the actor's weights at the start of this update otherwise. `weight` is w, the per-sample importance
    weight of `behaviour_weight` (detached here: no gradient flows through it); None is w = 1, PPO as in the paper.
    `clip_low`/`clip_high` may differ (asymmetric clipping, as in DAPO's clip-higher). Stats, detached:
    `clip_frac` is the fraction of samples whose ratio lies outside the clip range, `approx_kl` the low-variance
    estimator mean((r - 1) - log r) of KL(old || new) (Schulman's k3), both relative to the proximal policy;
    `behaviour_weight` is the mean of w.
    """
    log_ratio = logprob - old_logprob
    ratio = log_ratio.exp()
    weight = torch.ones_like(ratio) if weight is None else weight.detach()
    surrogate = -advantages * ratio
    clipped_surrogate = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = (weight * torch.max(surrogate, clipped_surrogate)).mean()
    with torch.no_grad():
        clip_frac = ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).float().mean()
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
    return loss, {"clip_frac": clip_frac, "approx_kl": approx_kl, "behaviour_weight": weight.mean()}


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float | None) -> Tensor:
    """Half the mean squared error to the returns; with `clip`, the pessimistic max over the clipped prediction.

    Clipping keeps the new value within `clip` of the value recorded at rollout time, PPO's trust region applied to
    the critic (CleanRL's `clip_vloss`).
    """
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped.mean()
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * torch.max(unclipped, clipped).mean()


def entropy_bonus(entropy: Tensor) -> Tensor:
    """S in the paper: the mean policy entropy, added to the objective (subtracted from the loss) to keep exploring."""
    return entropy.mean()
