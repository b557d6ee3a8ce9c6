"""Token-level losses for LLM RL: PPO's clipped surrogate (with GSPO's sequence-level ratio and dual clip as options),
KL estimators, the critic loss, and per-token log-probs and entropies from logits, as pure tensor functions.

Tensors are [B, T] over response tokens, right-padded, with `mask` the response mask (see `token_advantages`).
Padding never reaches a loss: every reduction is a masked one.

With asynchronous training (runner.max_staleness > 0) the responses come from an older behaviour policy π_behav.
`rlplace.core.off_policy.behaviour_weight` turns that into one detached importance weight per token, which
`token_policy_loss` multiplies into the clipped surrogate it takes against the proximal policy π_prox
(algorithm.off_policy_correction says how).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlplace.reasoning.algorithms import IMPORTANCE_RATIOS, LOSS_AGGREGATIONS

from .advantages import masked_mean

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


@dataclass(frozen=True)
class Counts:
    """A global minibatch's valid tokens and responses (with a valid token), summed over the data-parallel ranks: the
    denominators that make a rank's means its part of the global minibatch's (`rlplace.core.data_parallel`); and the
    generation budget (rollout.max_new_tokens) that `seq_mean_token_sum_norm` divides by."""

    tokens: Tensor
    responses: Tensor
    budget: int | None = None

    def mean(self, x: Tensor, mask: Tensor) -> Tensor:
        """This rank's part of the global masked mean of a per-token `x`."""
        return (x * mask.to(x.dtype)).sum() / self.tokens


def token_mean(x: Tensor, mask: Tensor, counts: Counts | None) -> Tensor:
    """The masked mean of `x` over this minibatch's valid tokens, or this rank's part of the global one."""
    return masked_mean(x, mask) if counts is None else counts.mean(x, mask)


def aggregate_loss(loss_mat: Tensor, mask: Tensor, agg: str, counts: Counts | None = None) -> Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    "token_mean": every valid token weighs the same (DAPO's token-level loss), so long responses weigh more.
    "seq_mean_token_mean": the mean over responses (with at least one valid token) of each response's token mean
    (GRPO's original form), so every response weighs the same whatever its length.
    "seq_mean_token_sum": the mean over responses of each response's token sum.
    "seq_mean_token_sum_norm": every valid token's loss summed, divided by the responses x `counts.budget` (Dr. GRPO:
    a constant in place of each response's length, which removes GRPO's bias towards long wrong answers).
    With `counts` the result is this rank's part of the global minibatch's.
    """
    if agg == "token_mean":
        return token_mean(loss_mat, mask, counts)
    valid = mask.sum(-1) > 0
    if agg == "seq_mean_token_mean":
        seq_losses = masked_mean(loss_mat, mask, dim=-1)
    elif agg in ("seq_mean_token_sum", "seq_mean_token_sum_norm"):
        seq_losses = (loss_mat * mask.to(loss_mat.dtype)).sum(-1)
    else:
        raise ValueError(f"unknown agg {agg!r}: valid are {', '.join(LOSS_AGGREGATIONS)}")
    if agg == "seq_mean_token_sum_norm":
        if counts is None or counts.budget is None:
            raise ValueError("seq_mean_token_sum_norm divides by a token budget: pass counts with one")
        seq_losses = seq_losses / counts.budget
    if counts is None:
        return masked_mean(seq_losses, valid)
    return (seq_losses * valid.to(seq_losses.dtype)).sum() / counts.responses


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """Each response's mean token log-ratio, on each of its positions: log of GSPO's sequence ratio
    s_i = (π_θ(y_i) / π_old(y_i)) ^ (1 / |y_i|). Padding is read as 0."""
    valid = mask.bool()
    total = torch.where(valid, log_ratio, torch.zeros_like(log_ratio)).sum(-1, keepdim=True)
    return (total / valid.sum(-1, keepdim=True).clamp(min=1)).expand_as(log_ratio)


def token_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    agg: str = "token_mean",
    weights: Tensor | None = None,
    counts: Counts | None = None,
    *,
    importance_ratio: str = "token",
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate per token, negated and weighted: w * max(-A * r, -A * clip(r, 1 - low, 1 + high)),
    aggregated by `agg`.

    r = exp(logprobs - old_logprobs), with `old_logprobs` the proximal policy's (see `llm_update`). With
    `importance_ratio="sequence"` (GSPO) every token of a response takes the response's ratio s_i instead
    (`sequence_log_ratio`), with the gradient of GSPO-token: s_i's value, each token's own log-prob's gradient, so
    that under `seq_mean_token_mean` the gradient is GSPO's sequence-level one. `clip_ratio_c` bounds the loss of a
    token with A < 0 by -A * clip_ratio_c (dual clip), however large r is.

    `weights` are w, the per-token importance weights of `behaviour_weight` (detached here: no gradient flows through
    them; padding ignored); None is w = 1, plain PPO. Separate low and high bounds allow DAPO's clip-higher (a larger
    `high` leaves room to raise unlikely tokens). Stats, detached: `clip_frac` is the fraction of valid tokens where
    the clipped term wins strictly, i.e. where the token's gradient is cut off (verl's pg_clipfrac); with dual clip,
    `clip_frac_lower` is the fraction cut off by its bound (verl's pg_clipfrac_lower); `approx_kl` is the masked mean
    of k3 of the token ratio, (r - 1) - log r, an unbiased non-negative estimate of KL(old || new), as the embodied
    `ppo_policy_loss` reports it; both relative to the proximal policy. `behaviour_weight` is the masked mean of w.
    With `counts`, the loss and the stats are this rank's parts of the global minibatch's.
    """
    log_ratio = logprobs - old_logprobs
    if importance_ratio == "token":
        ratio = log_ratio.exp()
    elif importance_ratio == "sequence":
        ratio = (logprobs - logprobs.detach() + sequence_log_ratio(log_ratio, mask).detach()).exp()
    else:
        raise ValueError(f"unknown importance ratio {importance_ratio!r}: valid are {', '.join(IMPORTANCE_RATIOS)}")
    # Padding's weight is 0, so junk there (an infinite weight, say) cannot turn the masked sums into NaN.
    weights = torch.ones_like(ratio) if weights is None else weights.detach()
    weights = torch.where(mask.bool(), weights, torch.zeros_like(weights))
    surrogate = -advantages * ratio
    clipped_surrogate = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    token_losses = torch.max(surrogate, clipped_surrogate)
    stats: dict[str, Tensor] = {}
    if clip_ratio_c is not None:
        bound = -advantages * clip_ratio_c
        negative = advantages < 0
        with torch.no_grad():
            stats["clip_frac_lower"] = token_mean((negative & (token_losses > bound)).to(ratio.dtype), mask, counts)
        token_losses = torch.where(negative, torch.min(token_losses, bound), token_losses)
    loss = aggregate_loss(weights * token_losses, mask, agg, counts)
    with torch.no_grad():
        stats["clip_frac"] = token_mean((clipped_surrogate > surrogate).to(ratio.dtype), mask, counts)
        stats["approx_kl"] = token_mean((log_ratio.exp() - 1.0) - log_ratio, mask, counts)
        stats["behaviour_weight"] = token_mean(weights, mask, counts)
    return loss, stats


def kl_divergence(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probs (Schulman's k1, k2, k3).

    k1 = log p - log q (unbiased, high variance, can be negative); k2 = 0.5 * (log p - log q)^2 (biased, low
    variance); k3 = "low_var_kl" = q/p - log(q/p) - 1 (unbiased, non-negative). k3 follows verl: log(q/p) is clamped
    to [-20, 20] so exp cannot overflow (an inf there would make the gradient NaN), and the result to [-10, 10].
    """
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if kind in ("k3", "low_var_kl"):
        log_q_over_p = torch.clamp(ref_logprobs - logprobs, min=-20.0, max=20.0)
        return torch.clamp(log_q_over_p.exp() - log_q_over_p - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl kind {kind!r}: valid are {', '.join(KL_KINDS)}")


def token_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None,
    counts: Counts | None = None,
) -> Tensor:
    """Half the squared error to the returns, token-mean over valid tokens; with `clip`, the pessimistic max over the
    prediction clipped to within `clip` of the rollout-time value (PPO's trust region for the critic). With `counts`,
    this rank's part of the global minibatch's loss."""
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * token_mean(unclipped, mask, counts)
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * token_mean(torch.max(unclipped, (clipped_values - returns) ** 2), mask, counts)


def logprobs_from_logits(logits: Tensor, tokens: Tensor) -> Tensor:
    """log softmax(logits)[token] per position, in float32: [..., V] logits and [...] tokens -> [...].

    Computed as logit[token] - logsumexp(logits), which never materialises the [..., V] log-softmax; float32 because
    bf16 log-probs are too coarse for importance ratios.
    """
    logits = logits.float()
    picked = logits.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position, in float32: logsumexp(z) - sum(softmax(z) * z).

    The logits are first shifted so their max is 0 (entropy does not change): both terms then stay small, and their
    difference keeps its precision even for logits around 1e4, where float32 would otherwise lose it.
    """
    logits = logits.float()
    logits = logits - logits.max(dim=-1, keepdim=True).values.detach()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
