"""The importance weight that corrects a policy loss for rollouts sampled by an older policy (asynchronous training).

With runner.max_staleness > 0 the rollouts of a step come from a behaviour policy π_behav older than the actor's
weights at the start of the update, the proximal policy π_prox. Both families' losses take PPO's ratio against
π_prox and weigh each sample (embodied) or token (reasoning) by the detached w of `behaviour_weight`.
"""

from __future__ import annotations

import torch
from torch import Tensor

OFF_POLICY_CORRECTIONS = ("decoupled", "truncated_is")
"""The values of algorithm.off_policy_correction."""


def behaviour_weight(proximal_logprob: Tensor, behaviour_logprob: Tensor, correction: str, cap: float | None) -> Tensor:
    """The detached importance weight w of each sample from π_prox / π_behav, as `correction` bounds it.

    "decoupled" (AReaL, Fu et al. 2025): w = π_prox / π_behav, and where a `cap` is given, samples with w > cap get
    w = 0 (dropped, as AReaL's behav_imp_weight_cap). "truncated_is" (Yao et al. 2025; IMPALA's and ACER's
    truncation): w = min(π_prox / π_behav, cap), every sample kept; it needs a cap. With equal log-probs w is exactly 1.
    """
    with torch.no_grad():
        weight = (proximal_logprob - behaviour_logprob).exp()
        if correction == "decoupled":
            return weight if cap is None else torch.where(weight > cap, torch.zeros_like(weight), weight)
        if correction == "truncated_is":
            if cap is None:
                raise ValueError("truncated_is needs a cap (algorithm.behaviour_weight_cap)")
            return torch.clamp(weight, max=cap)
    raise ValueError(f"unknown correction {correction!r}: valid are {', '.join(OFF_POLICY_CORRECTIONS)}")
