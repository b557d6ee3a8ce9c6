"""Token-level advantage estimators for LLM RL (GRPO, REINFORCE++, RLOO, GAE), as pure tensor functions.

Every tensor is [B, T]: B responses, T response tokens, right-padded. `mask` is the action mask (1 for the tokens the
model generated, the EOS token included; bool or float); in a response made in turns it has holes where a tool wrote,
which the recursions (GAE, returns-to-go) step over, as if the tool's tokens were not there. The responses to one
prompt are contiguous rows, so group g is rows [g * group_size, (g + 1) * group_size). Every estimator returns zeros
where the mask is 0 and never reads the values there, so whatever such a position holds changes nothing.

The masked statistics that the losses share (`masked_mean`, `masked_whiten`) live here too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _float_mask(mask: Tensor, like: Tensor) -> Tensor:
    """The mask in `like`'s floating dtype (float32 for integer inputs), so it can weight sums."""
    dtype = like.dtype if like.is_floating_point() else torch.float32
    return mask.to(dtype)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over the positions where `mask` is set (over `dim`, or everything); 0 where nothing is set."""
    mask = _float_mask(mask, x)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_whiten(
    x: Tensor, mask: Tensor, eps: float = 1e-8, sum_over_ranks: Callable[[Tensor], None] | None = None
) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the valid positions, zero on padding.

    The variance is unbiased (Bessel-corrected), as verl's `masked_whiten`, so the numbers match verl's; that needs at
    least two valid positions, and a ValueError says so otherwise. With `sum_over_ranks` (in place, every data-parallel
    rank calling it in the same order) `x` is one rank's part of the batch, and mean and variance are the whole
    batch's (`rlplace.core.data_parallel`).
    """
    fmask = _float_mask(mask, x)
    if sum_over_ranks is None:
        count = fmask.sum()
        mean = masked_mean(x, fmask)
    else:
        sums = torch.stack([(x * fmask).sum(), fmask.sum()]).double()
        sum_over_ranks(sums)
        count, mean = sums[1], (sums[0] / sums[1]).to(x.dtype)
    if count < 2:
        raise ValueError(f"masked_whiten needs at least 2 valid positions, got {int(count.item())}")
    if sum_over_ranks is None:
        var = masked_mean((x - mean) ** 2, fmask) * count / (count - 1)
    else:
        squares = (((x - mean) ** 2) * fmask).sum().double().reshape(1)
        sum_over_ranks(squares)
        var = (squares[0] / (count - 1)).to(x.dtype)
    return (x - mean) * torch.rsqrt(var + eps) * fmask


def sequence_rewards_to_tokens(rewards: Tensor, mask: Tensor) -> Tensor:
    """[B] sequence rewards -> [B, T] token rewards: each reward sits on its response's last valid token (the EOS).

    This is where an outcome reward belongs for a token-level critic or returns-to-go: only the final token earns it.
    A response with no valid token gets no reward.
    """
    fmask = _float_mask(mask, rewards)
    lengths = fmask.sum(-1, keepdim=True)
    is_last = fmask * (fmask.cumsum(-1) == lengths).to(fmask.dtype)  # the valid position that completes the count
    return is_last * rewards.unsqueeze(-1).to(fmask.dtype)


def kl_penalized(token_rewards: Tensor, token_kl: Tensor, kl_coef: float, mask: Tensor) -> Tensor:
    """Token rewards with the KL-to-reference penalty folded in: r_t - kl_coef * kl_t, zero on padding.

    The "KL in reward" form of PPO for LLMs (Ouyang et al., 2022) and REINFORCE++, as opposed to a KL loss term.
    """
    return (token_rewards - kl_coef * token_kl) * _float_mask(mask, token_rewards)


def adaptive_kl_coef(kl_coef: float, kl: float, target: float, horizon: int, responses: int) -> float:
    """The next step's coefficient of a KL in the reward under the adaptive controller of Ziegler et al. (2019):
    scaled by 1 + e * responses / horizon, where e is the relative error of this step's `kl` to `target`, clipped to
    [-0.2, 0.2] so that one unusual batch moves it little."""
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * responses / horizon)


def grpo_advantages(rewards: Tensor, mask: Tensor, group_size: int, norm_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO (Shao et al., 2024), outcome supervision: (r - group mean) / (group std + eps) on every response token.

    The std is unbiased (torch.std), as verl computes it. `norm_std=False` drops the division (Dr. GRPO's
    correction, Liu et al., 2025). A group whose rewards are all equal carries no signal and gets 0; so does every
    response when group_size is 1 (nothing to compare with).
    """
    batch = rewards.shape[0]
    if group_size < 1 or batch % group_size != 0:
        raise ValueError(f"group_size = {group_size} must be positive and divide the batch size ({batch})")
    scores = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)
    centered = scores - scores.mean(dim=1, keepdim=True)
    if norm_std and group_size > 1:
        centered = centered / (scores.std(dim=1, keepdim=True) + eps)
    return centered.reshape(batch, 1) * _float_mask(mask, centered)


def _returns_to_go(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t'} along T, t' the next position in `mask`, with G = 0 after the last one; a position
    outside the mask carries the G after it."""
    fmask = _float_mask(mask, token_rewards)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = (token_rewards[:, t] + gamma * running) * fmask[:, t] + running * (1 - fmask[:, t])
        returns[:, t] = running
    return returns


def reinforce_pp_advantages(
    rewards: Tensor,
    mask: Tensor,
    token_kl: Tensor | None,
    kl_coef: float,
    group_size: int | None = None,
    gamma: float = 1.0,
    eps: float = 1e-8,
    sum_over_ranks: Callable[[Tensor], None] | None = None,
) -> Tensor:
    """REINFORCE++ (Hu, 2025): discounted returns of KL-penalised token rewards, whitened over the whole batch
    (over every rank's part of it with `sum_over_ranks`, as `masked_whiten`).

    Token reward: -kl_coef * token_kl at every response token, plus the sequence reward on the last one. With
    `group_size` the sequence reward is first reduced by its group's mean (REINFORCE++-baseline), which removes the
    prompt's difficulty before the batch-wide whitening. `token_kl` None means no KL in the reward (e.g. a KL loss
    instead). The whitening (masked mean and unbiased std over every valid token of the batch) replaces a critic.
    """
    scores = rewards if rewards.is_floating_point() else rewards.float()
    if group_size is not None:
        batch = scores.shape[0]
        if group_size < 1 or batch % group_size != 0:
            raise ValueError(f"group_size = {group_size} must be positive and divide the batch size ({batch})")
        grouped = scores.view(-1, group_size)
        scores = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(batch)
    token_rewards = sequence_rewards_to_tokens(scores, mask)
    if token_kl is not None:
        token_rewards = kl_penalized(token_rewards, token_kl, kl_coef, mask)
    returns = _returns_to_go(token_rewards, mask, gamma)
    return masked_whiten(returns, mask, eps=eps, sum_over_ranks=sum_over_ranks)


def rloo_advantages(
    rewards: Tensor,
    mask: Tensor,
    group_size: int,
    token_kl: Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
) -> Tensor:
    """RLOO (Kool et al., 2019; Ahmadian et al., 2024): each response's reward minus the mean reward of the other
    responses to its prompt, r_i - (sum_j r_j - r_i) / (G - 1), as returns-to-go of its token rewards.

    The baselined reward sits on the last token; with `token_kl` each token also gets -kl_coef * token_kl (the KL in
    the reward, as OpenRLHF's RLOO); without it and with gamma 1, every token of a response gets its baselined
    reward, as verl's rloo. No whitening: the leave-one-out baseline is unbiased on its own.
    """
    batch = rewards.shape[0]
    if group_size < 2 or batch % group_size != 0:
        raise ValueError(f"group_size = {group_size} must be at least 2 and divide the batch size ({batch})")
    grouped = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    token_rewards = sequence_rewards_to_tokens((grouped - others).reshape(batch), mask)
    if token_kl is not None:
        token_rewards = kl_penalized(token_rewards, token_kl, kl_coef, mask)
    return _returns_to_go(token_rewards, mask, gamma) * _float_mask(mask, token_rewards)


def token_gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al., 2016) over each response's tokens, for PPO with a critic.

    delta_t = r_t + gamma * V_{t'} - V_t, A_t = delta_t + gamma * lam * A_{t'}, t' the next valid token, with V and A
    taken as 0 after the last one (the episode ends at EOS: nothing to bootstrap); the tokens of a tool in between are
    stepped over (verl's multi-turn GAE). Returns (advantages, returns = advantages + values), both zero outside the
    mask. The advantages are not whitened: PPO usually whitens them over the batch (`masked_whiten`), while the
    returns, the critic's target, must stay in reward units.
    """
    fmask = _float_mask(mask, token_rewards)
    rewards = token_rewards * fmask
    values = values.to(fmask.dtype) * fmask  # padding values read as 0: the bootstrap after the last valid token
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(rewards[:, 0])
    next_values = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        valid = fmask[:, t]
        gae = (rewards[:, t] + gamma * next_values - values[:, t] + gamma * lam * last_gae) * valid
        advantages[:, t] = gae
        last_gae = gae + last_gae * (1 - valid)
        next_values = values[:, t] + next_values * (1 - valid)
    return advantages, (advantages + values) * fmask
