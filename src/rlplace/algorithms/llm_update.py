"""The LLM policy (and critic) update of reasoning tasks: PPO's clipped surrogate on response tokens, for GRPO,
REINFORCE++ and PPO with a critic. The LLM counterpart of `ppo.ppo_update`, ready for data parallelism the same way.

Each actor rank calls `llm_update` on its own shard of rows with the same `LLMUpdateParams` and a generator seeded
identically on every rank, so every rank takes the same number of optimizer steps; `allreduce_grads`, called after
each backward pass, averages the gradients across ranks before clipping and stepping, so the ranks' models stay
identical. Losses are aggregated over a rank's own minibatch (verl's convention): with unequal token counts across
ranks the average of rank gradients weighs tokens slightly differently from a single-process run.

Advantages are computed once per batch, before the update (`compute_advantages`), from rollout-time log-probs and
values; they stay fixed across the update's epochs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlplace.config import AlgorithmConfig
from rlplace.models.value_model import ValueModel

from .sequences import SequenceBatch, response_logits
from .token_advantages import (
    grpo_advantages,
    kl_penalized,
    masked_mean,
    masked_whiten,
    reinforce_pp_advantages,
    sequence_rewards_to_tokens,
    token_gae,
)
from .token_losses import (
    aggregate_loss,
    entropy_from_logits,
    kl_divergence,
    logprobs_from_logits,
    token_policy_loss,
    token_value_loss,
)

LLM_ALGORITHMS = ("ppo", "grpo", "reinforce_pp")


@dataclass(frozen=True)
class LLMUpdateParams:
    """Hyperparameters of the LLM update; the names are those of `rlplace.config.AlgorithmConfig`."""

    name: str
    """`ppo` (critic + GAE), `grpo` (group-normalised rewards) or `reinforce_pp` (whitened returns)."""
    group_size: int = 4
    """Responses per prompt, adjacent rows."""
    gamma: float = 1.0
    gae_lambda: float = 0.95
    update_epochs: int = 1
    num_minibatches: int = 1
    """Optimizer steps per epoch; on each data-parallel rank, over that rank's shard."""
    clip_ratio_low: float = 0.2
    """The ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]."""
    clip_ratio_high: float = 0.2
    ent_coef: float = 0.0
    max_grad_norm: float = 1.0
    kl_coef: float = 0.0
    """Weight of the KL to the reference model; 0 leaves it out."""
    kl_type: str = "low_var_kl"
    use_kl_loss: bool = True
    """KL as a loss term; False folds it into the token rewards (ppo and reinforce_pp; grpo never does)."""
    loss_agg: str = "token_mean"
    vf_coef: float = 0.5
    clip_vloss: float | None = 0.2
    """ppo: the critic's prediction is clipped to within this of its rollout-time value; None: no clipping."""

    def __post_init__(self) -> None:
        if self.name not in LLM_ALGORITHMS:
            raise ValueError(f"name = {self.name!r} is not an LLM algorithm: valid are {', '.join(LLM_ALGORITHMS)}")

    @classmethod
    def from_config(cls, alg: AlgorithmConfig) -> LLMUpdateParams:
        """The update's view of `algorithm.*`; the value clip is clip_ratio_low when clip_vloss (as in `ppo_update`)."""
        return cls(
            name=alg.name,
            group_size=alg.group_size,
            gamma=alg.gamma,
            gae_lambda=alg.gae_lambda,
            update_epochs=alg.update_epochs,
            num_minibatches=alg.num_minibatches,
            clip_ratio_low=alg.clip_ratio_low,
            clip_ratio_high=alg.clip_ratio_high,
            ent_coef=alg.ent_coef,
            max_grad_norm=alg.max_grad_norm,
            kl_coef=alg.kl_coef,
            kl_type=alg.kl_type,
            use_kl_loss=alg.use_kl_loss,
            loss_agg=alg.loss_agg,
            vf_coef=alg.vf_coef,
            clip_vloss=alg.clip_ratio_low if alg.clip_vloss else None,
        )

    @property
    def kl_in_reward(self) -> bool:
        return self.kl_coef > 0 and not self.use_kl_loss and self.name != "grpo"

    @property
    def kl_in_loss(self) -> bool:
        return self.kl_coef > 0 and self.use_kl_loss


def _rollout_kl(batch: SequenceBatch, params: LLMUpdateParams) -> Tensor:
    """[B, T] KL of the rollout policy to the reference, per token, for the KL-in-reward form."""
    if batch.old_logprobs is None or batch.ref_logprobs is None:
        raise ValueError("KL in the reward (kl_coef > 0, use_kl_loss false) needs batch.old_logprobs and ref_logprobs")
    return kl_divergence(batch.old_logprobs, batch.ref_logprobs, params.kl_type)


def compute_advantages(
    batch: SequenceBatch, params: LLMUpdateParams, values: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """[B, T] advantages for every response token (zeros on padding) and, for ppo, [B, T] returns (else None).

    grpo: group-normalised rewards (its KL, if any, is a loss term). reinforce_pp: whitened returns of the rewards,
    group-baselined when group_size > 1, with the KL penalty in the token rewards unless use_kl_loss. ppo: GAE over the
    token rewards (reward on the EOS, KL penalty unless use_kl_loss) with the critic's rollout-time `values`; the
    advantages are whitened over the batch, the returns (the critic's target) stay in reward units.
    """
    if batch.rewards is None:
        raise ValueError("compute_advantages needs batch.rewards (the reward worker fills them)")
    mask = batch.response_mask
    if params.name == "grpo":
        return grpo_advantages(batch.rewards, mask, params.group_size), None
    token_kl = _rollout_kl(batch, params) if params.kl_in_reward else None
    if params.name == "reinforce_pp":
        group_size = params.group_size if params.group_size > 1 else None  # a group of 1 has no baseline
        advantages = reinforce_pp_advantages(
            batch.rewards, mask, token_kl, params.kl_coef, group_size=group_size, gamma=params.gamma
        )
        return advantages, None
    if values is None:
        raise ValueError("ppo needs the critic's rollout-time values to compute GAE")
    token_rewards = sequence_rewards_to_tokens(batch.rewards.float(), mask)
    if token_kl is not None:
        token_rewards = kl_penalized(token_rewards, token_kl, params.kl_coef, mask)
    advantages, returns = token_gae(
        token_rewards, values.to(token_rewards.device), mask, params.gamma, params.gae_lambda
    )
    return masked_whiten(advantages, mask), returns


def _denominator(mask: Tensor, agg: str) -> Tensor:
    """What `aggregate_loss(..., agg)` divides by: valid tokens, or responses with a valid token."""
    return mask.sum() if agg == "token_mean" else (mask.sum(-1) > 0).sum()


def _share(part: Tensor, whole: Tensor) -> float:
    """The weight that makes a micro-batch's mean add up to the minibatch's mean."""
    return part.item() / max(whole.item(), 1.0)


def _optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float,
    allreduce_grads: Callable[[nn.Module], None] | None,
) -> Tensor:
    """Average grads across ranks, clip, step; returns the total grad norm before clipping."""
    if allreduce_grads is not None:
        allreduce_grads(model)
    grad_norm = nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_grad_norm)
    optimizer.step()
    return grad_norm


def llm_update(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: SequenceBatch,
    advantages: Tensor,
    params: LLMUpdateParams,
    generator: torch.Generator,
    *,
    critic: ValueModel | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    returns: Tensor | None = None,
    old_values: Tensor | None = None,
    allreduce_grads: Callable[[nn.Module], None] | None = None,
    micro_rows: int | None = None,
) -> dict[str, float]:
    """Run `update_epochs` x `num_minibatches` optimizer steps on `batch`'s rows; returns train/* means over them.

    `policy` is a causal LM (logits from `response_logits`); `batch` needs old_logprobs, and ref_logprobs when the KL
    is a loss term. `generator` (CPU) shuffles the rows. `allreduce_grads(model)`, when given, must average the
    gradients of `model`'s parameters across data-parallel ranks in place; it is called once per optimizer step for
    the policy and, with a critic, once more for the critic. `micro_rows` splits each minibatch into micro-batches of
    at most that many rows whose gradients accumulate (exactly the minibatch's gradient, in less memory).

    ppo also needs `critic` (a `ValueModel`), `critic_optimizer`, `returns` and `old_values` ([B, T], rollout-time):
    the critic takes its own step per minibatch on vf_coef * the (clipped) value loss, with its own all-reduce and
    clipping. `train/grad_norm` is the policy's total norm before clipping.
    """
    if batch.old_logprobs is None:
        raise ValueError("llm_update needs batch.old_logprobs (the inference worker fills them)")
    if params.kl_in_loss and batch.ref_logprobs is None:
        raise ValueError("kl_coef > 0 with use_kl_loss needs batch.ref_logprobs (the reference worker fills them)")
    if params.name == "ppo" and critic is None:
        raise ValueError("ppo needs a critic")
    if critic is not None and (critic_optimizer is None or returns is None or old_values is None):
        raise ValueError("a critic needs critic_optimizer, returns and old_values")
    num_rows = batch.num_rows
    if num_rows < params.num_minibatches:
        raise ValueError(f"{num_rows} rows are too few for {params.num_minibatches} minibatches")
    if micro_rows is not None and micro_rows < 1:
        raise ValueError(f"micro_rows = {micro_rows} must be at least 1")

    input_ids, attention_mask = batch.input_ids, batch.attention_mask
    width = batch.prompts.shape[1]
    mask = batch.response_mask
    keys = ["policy_loss", "entropy", "kl", "clip_frac", "approx_kl", "grad_norm"]
    if critic is not None:
        keys.append("value_loss")
    stats: dict[str, list[Tensor]] = {key: [] for key in keys}
    modes = [(model, model.training) for model in (policy, critic) if model is not None]
    for model, _ in modes:
        model.train()

    for _ in range(params.update_epochs):
        order = torch.randperm(num_rows, generator=generator)
        for minibatch in order.tensor_split(params.num_minibatches):  # exactly num_minibatches steps on every rank
            mb_mask = mask[minibatch]
            mb_agg, mb_tokens = _denominator(mb_mask, params.loss_agg), mb_mask.sum()
            micro_batches = minibatch.split(micro_rows) if micro_rows is not None else (minibatch,)
            sums: dict[str, Tensor | float] = dict.fromkeys(keys, 0.0)  # detached; read once at the end (no syncs)

            optimizer.zero_grad()
            for rows in micro_batches:
                logits = response_logits(policy, input_ids[rows], attention_mask[rows], width)
                device = logits.device
                row_mask = mask[rows].to(device)
                agg_share = _share(_denominator(mask[rows], params.loss_agg), mb_agg)
                token_share = _share(mask[rows].sum(), mb_tokens)
                logprobs = logprobs_from_logits(logits, input_ids[rows, width:].to(device))
                pg_loss, pg_stats = token_policy_loss(
                    logprobs,
                    batch.old_logprobs[rows].to(device),
                    advantages[rows].to(device),
                    row_mask,
                    params.clip_ratio_low,
                    params.clip_ratio_high,
                    params.loss_agg,
                )
                entropy = aggregate_loss(entropy_from_logits(logits), row_mask, params.loss_agg)
                loss = pg_loss - params.ent_coef * entropy
                if batch.ref_logprobs is not None:
                    token_kl = kl_divergence(logprobs, batch.ref_logprobs[rows].to(device), params.kl_type)
                    if params.kl_in_loss:
                        loss = loss + params.kl_coef * aggregate_loss(token_kl, row_mask, params.loss_agg)
                    sums["kl"] += token_share * masked_mean(token_kl.detach(), row_mask)
                (agg_share * loss).backward()
                sums["policy_loss"] += agg_share * pg_loss.detach()
                sums["entropy"] += agg_share * entropy.detach()
                sums["clip_frac"] += token_share * pg_stats["clip_frac"]
                sums["approx_kl"] += token_share * pg_stats["approx_kl"]
            sums["grad_norm"] = _optimizer_step(policy, optimizer, params.max_grad_norm, allreduce_grads)

            if critic is not None:
                critic_optimizer.zero_grad()
                for rows in micro_batches:
                    values = critic.response_values(batch, rows)
                    device = values.device
                    v_loss = token_value_loss(
                        values,
                        old_values[rows].to(device),
                        returns[rows].to(device),
                        mask[rows].to(device),
                        params.clip_vloss,
                    )
                    token_share = _share(mask[rows].sum(), mb_tokens)
                    (token_share * params.vf_coef * v_loss).backward()
                    sums["value_loss"] += token_share * v_loss.detach()
                _optimizer_step(critic, critic_optimizer, params.max_grad_norm, allreduce_grads)

            for key in keys:
                stats[key].append(torch.as_tensor(sums[key], dtype=torch.float32))

    for model, mode in modes:
        model.train(mode)
    result = {f"train/{key}": torch.stack(values).mean().item() for key, values in stats.items()}
    result["train/lr"] = float(optimizer.param_groups[0]["lr"])
    return result
