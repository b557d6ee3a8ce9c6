"""The LLM policy (and critic) update of reasoning tasks: PPO's clipped surrogate on response tokens, for GRPO,
REINFORCE++ and PPO with a critic, written so that data-parallel actor ranks can each run it on their shard.

Each actor rank calls `llm_update` on its own shard of rows with the same `algorithm` config section and a generator
seeded identically on every rank, so every rank takes the same number of optimizer steps; `allreduce_grads`, called
after each backward pass, averages the gradients across ranks before clipping and stepping, so the ranks' models
stay identical. Several ranks train the update one process would train on the whole batch
(`rlplace.core.data_parallel`): minibatches are drawn over the global batch, losses and stats divide by the global
minibatch's token and response counts (`losses.Counts`, as verl's global token normalisation), and the advantages'
whitening uses the whole batch's mean and variance. The number of actor ranks (the placement) never changes the
result but for float summation order.

Advantages are computed once per batch, before the update (`compute_advantages`), from rollout-time log-probs and
values; they stay fixed across the update's epochs.

Off-policy correction. PPO's ratio is taken against `batch.old_logprobs`, which the inference worker recomputes with
the training forward pass: they are the proximal policy π_prox, the one the update starts from. When the responses
were sampled by another policy, the behaviour policy π_behav (an older version with runner.max_staleness > 0, or the
rollout engine's own kernels), the caller passes its per-token log-probs as `behaviour_logprobs`, and every token is
weighted by π_prox / π_behav as algorithm.off_policy_correction says (`behaviour_weight`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch import Tensor, nn

from rlplace.core.data_parallel import Shard, global_minibatches
from rlplace.core.off_policy import behaviour_weight
from rlplace.reasoning.algorithms import ALGORITHMS
from rlplace.reasoning.config import ReasoningAlgorithmConfig
from rlplace.reasoning.models.value_model import ValueModel

from .advantages import (
    grpo_advantages,
    kl_penalized,
    masked_whiten,
    reinforce_pp_advantages,
    sequence_rewards_to_tokens,
    token_gae,
)
from .batch import SequenceBatch, response_logits
from .losses import (
    Counts,
    aggregate_loss,
    entropy_from_logits,
    kl_divergence,
    logprobs_from_logits,
    token_mean,
    token_policy_loss,
    token_value_loss,
)

SumOverRanks = Callable[[Tensor], None] | None
"""In-place sum over the data-parallel ranks (`core.data_parallel.Shard.sum_over_ranks`); None on one rank."""


def _rollout_kl(batch: SequenceBatch, alg: ReasoningAlgorithmConfig) -> Tensor:
    """[B, T] KL of the rollout policy to the reference, per token, for the KL-in-reward form."""
    if batch.old_logprobs is None or batch.ref_logprobs is None:
        raise ValueError("KL in the reward (kl_coef > 0, use_kl_loss false) needs batch.old_logprobs and ref_logprobs")
    return kl_divergence(batch.old_logprobs, batch.ref_logprobs, alg.kl_type)


Advantages = tuple[Tensor, Tensor | None]
"""[B, T] advantages and, where the algorithm has a critic, [B, T] returns."""


def estimate_grpo(
    batch: SequenceBatch, alg: ReasoningAlgorithmConfig, values: Tensor | None, _: SumOverRanks
) -> Advantages:
    """Group-normalised rewards (a group lies within one rank's rows); GRPO's KL, if any, is a loss term."""
    return grpo_advantages(batch.rewards, batch.response_mask, alg.group_size), None


def estimate_reinforce_pp(
    batch: SequenceBatch, alg: ReasoningAlgorithmConfig, values: Tensor | None, sum_over_ranks: SumOverRanks
) -> Advantages:
    """Whitened returns of the rewards, group-baselined when group_size > 1, with the KL penalty in the token rewards
    unless use_kl_loss."""
    token_kl = _rollout_kl(batch, alg) if alg.kl_in_reward else None
    group_size = alg.group_size if alg.group_size > 1 else None  # a group of 1 has no baseline
    advantages = reinforce_pp_advantages(
        batch.rewards,
        batch.response_mask,
        token_kl,
        alg.kl_coef,
        group_size=group_size,
        gamma=alg.gamma,
        sum_over_ranks=sum_over_ranks,
    )
    return advantages, None


def estimate_ppo(
    batch: SequenceBatch, alg: ReasoningAlgorithmConfig, values: Tensor | None, sum_over_ranks: SumOverRanks
) -> Advantages:
    """GAE over the token rewards (reward on the EOS, KL penalty unless use_kl_loss) with the critic's rollout-time
    `values`; the advantages are whitened over the batch, the returns (the critic's target) stay in reward units."""
    if values is None:
        raise ValueError("ppo needs the critic's rollout-time values to compute GAE")
    mask = batch.response_mask
    token_rewards = sequence_rewards_to_tokens(batch.rewards.float(), mask)
    if alg.kl_in_reward:
        token_rewards = kl_penalized(token_rewards, _rollout_kl(batch, alg), alg.kl_coef, mask)
    advantages, returns = token_gae(token_rewards, values.to(token_rewards.device), mask, alg.gamma, alg.gae_lambda)
    return masked_whiten(advantages, mask, sum_over_ranks=sum_over_ranks), returns


def compute_advantages(
    batch: SequenceBatch,
    alg: ReasoningAlgorithmConfig,
    values: Tensor | None = None,
    sum_over_ranks: SumOverRanks = None,
) -> Advantages:
    """[B, T] advantages for every response token (zeros on padding) and, for ppo, [B, T] returns (else None).

    `values` are the critic's rollout-time values, which only ppo reads. With `sum_over_ranks`, `batch` is one
    data-parallel rank's rows, and statistics over the batch are taken over every rank's."""
    if batch.rewards is None:
        raise ValueError("compute_advantages needs batch.rewards (the reward worker fills them)")
    return ALGORITHMS[alg.name].advantage_estimator()(batch, alg, values, sum_over_ranks)


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
    alg: ReasoningAlgorithmConfig,
    generator: torch.Generator,
    *,
    critic: ValueModel | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    returns: Tensor | None = None,
    old_values: Tensor | None = None,
    behaviour_logprobs: Tensor | None = None,
    allreduce_grads: Callable[[nn.Module], None] | None = None,
    shard: Shard | None = None,
) -> dict[str, float]:
    """Run `update_epochs` x `num_minibatches` optimizer steps on `batch`'s rows; returns train/* means over them.

    `policy` is a causal LM (logits from `response_logits`); `batch` needs old_logprobs, and ref_logprobs when the KL
    is a loss term. `generator` (CPU) shuffles the rows. `allreduce_grads(model)`, when given, must average the
    gradients of `model`'s parameters across data-parallel ranks in place; it is called once per optimizer step for
    the policy and, with a critic, once more for the critic.

    ppo also needs `critic` (a `ValueModel`), `critic_optimizer`, `returns` and `old_values` ([B, T], rollout-time):
    the critic takes its own step per minibatch on vf_coef * the (clipped) value loss, with its own all-reduce and
    clipping. `train/grad_norm` is the policy's total norm before clipping.

    `behaviour_logprobs` ([B, T]) are the log-probs of the policy that sampled the responses, when it is not the
    proximal one of `batch.old_logprobs` (the actor's weights at the start of this update). None means they are the
    same (synchronous training): w = 1, plain PPO. Otherwise each token's surrogate is weighted by the fixed
    `behaviour_weight(old_logprobs, behaviour_logprobs)` under alg.off_policy_correction and alg.behaviour_weight_cap,
    whose mean over valid tokens is `train/behaviour_weight` (1 without behaviour log-probs).

    `shard` says which rows of the global batch `batch` holds when it is one data-parallel rank's part (None: the
    whole batch); the update and its stats are then the global batch's.
    """
    if batch.old_logprobs is None:
        raise ValueError("llm_update needs batch.old_logprobs (the inference worker fills them)")
    if alg.kl_in_loss and batch.ref_logprobs is None:
        raise ValueError("kl_coef > 0 with use_kl_loss needs batch.ref_logprobs (the reference worker fills them)")
    if alg.has_critic and critic is None:
        raise ValueError(f"{alg.name} needs a critic")
    if critic is not None and (critic_optimizer is None or returns is None or old_values is None):
        raise ValueError("a critic needs critic_optimizer, returns and old_values")
    num_rows = batch.num_rows if shard is None else shard.size
    if num_rows < alg.num_minibatches:
        raise ValueError(f"{num_rows} rows are too few for {alg.num_minibatches} minibatches")
    weights = None  # fixed for the whole update, as both log-probs are
    if behaviour_logprobs is not None:
        if behaviour_logprobs.shape != batch.old_logprobs.shape:
            raise ValueError(
                f"behaviour_logprobs has shape {tuple(behaviour_logprobs.shape)}, "
                f"batch.old_logprobs {tuple(batch.old_logprobs.shape)}"
            )
        weights = behaviour_weight(
            batch.old_logprobs,
            behaviour_logprobs.to(batch.old_logprobs.device),
            alg.off_policy_correction,
            alg.behaviour_weight_cap,
        )

    input_ids, attention_mask = batch.input_ids, batch.attention_mask
    width = batch.prompts.shape[1]
    mask = batch.response_mask
    keys = ["policy_loss", "entropy", "kl", "clip_frac", "approx_kl", "behaviour_weight", "grad_norm"]
    if critic is not None:
        keys.append("value_loss")
    stats: dict[str, list[Tensor]] = {key: [] for key in keys}
    modes = [(model, model.training) for model in (policy, critic) if model is not None]
    for model, _ in modes:
        model.train()

    minibatches = global_minibatches(num_rows, alg.update_epochs, alg.num_minibatches, generator)
    if shard is None:
        steps: list[tuple[Tensor, Counts | None]] = [(rows, None) for rows in minibatches]
    else:
        steps = list(zip(shard.split(minibatches), _global_counts(shard, minibatches, mask), strict=True))
    # A rank's loss is its part of the global minibatch's; the gradient averaging over ranks divides by their count.
    scale = 1.0 if shard is None else float(shard.world_size)
    for rows, counts in steps:  # exactly update_epochs x num_minibatches steps on every rank
        step_stats: dict[str, Tensor] = {}
        if rows.numel() == 0:  # none of this global minibatch's rows is this rank's: it adds nothing
            step_stats = _empty_step(policy, optimizer, critic, critic_optimizer, alg, allreduce_grads)
            for key in keys:
                stats[key].append(step_stats[key].float())
            continue
        optimizer.zero_grad()
        logits = response_logits(policy, input_ids[rows], attention_mask[rows], width)
        device = logits.device
        row_mask = mask[rows].to(device)
        logprobs = logprobs_from_logits(logits, input_ids[rows, width:].to(device))
        pg_loss, pg_stats = token_policy_loss(
            logprobs,
            batch.old_logprobs[rows].to(device),
            advantages[rows].to(device),
            row_mask,
            alg.clip_ratio_low,
            alg.clip_ratio_high,
            alg.loss_agg,
            None if weights is None else weights[rows].to(device),
            counts,
        )
        entropy = aggregate_loss(entropy_from_logits(logits), row_mask, alg.loss_agg, counts)
        loss = pg_loss - alg.ent_coef * entropy
        step_stats["kl"] = torch.zeros((), device=device)
        if batch.ref_logprobs is not None:
            token_kl = kl_divergence(logprobs, batch.ref_logprobs[rows].to(device), alg.kl_type)
            if alg.kl_in_loss:
                loss = loss + alg.kl_coef * aggregate_loss(token_kl, row_mask, alg.loss_agg, counts)
            step_stats["kl"] = token_mean(token_kl.detach(), row_mask, counts)
        (loss * scale if scale != 1.0 else loss).backward()
        step_stats["grad_norm"] = _optimizer_step(policy, optimizer, alg.max_grad_norm, allreduce_grads)
        step_stats.update(policy_loss=pg_loss.detach(), entropy=entropy.detach(), **pg_stats)

        if critic is not None:
            critic_optimizer.zero_grad()
            values = critic.response_values(batch, rows)
            device = values.device
            v_loss = token_value_loss(
                values,
                old_values[rows].to(device),
                returns[rows].to(device),
                mask[rows].to(device),
                alg.value_clip,
                counts,
            )
            (alg.vf_coef * scale * v_loss).backward()
            _optimizer_step(critic, critic_optimizer, alg.max_grad_norm, allreduce_grads)
            step_stats["value_loss"] = v_loss.detach()

        for key in keys:  # detached; read once at the end (no device syncs per step)
            stats[key].append(step_stats[key].float())

    for model, mode in modes:
        model.train(mode)
    stacked = {key: torch.stack(values) for key, values in stats.items()}
    if shard is not None:  # each rank's parts of the global minibatches' means: summed, the global means
        means = [key for key in keys if key != "grad_norm"]  # the grad norm is taken after averaging: every rank's
        parts = torch.stack([stacked[key].cpu() for key in means])
        shard.sum_over_ranks(parts)
        stacked.update(zip(means, parts, strict=True))
    result = {f"train/{key}": values.mean().item() for key, values in stacked.items()}
    result["train/lr"] = float(optimizer.param_groups[0]["lr"])
    return result


def _global_counts(shard: Shard, minibatches: list[Tensor], mask: Tensor) -> list[Counts]:
    """Each global minibatch's valid tokens and responses over every rank: one collective call for the update."""
    local = shard.split(minibatches)
    counts = torch.tensor(
        [[float(mask[rows].sum()), float((mask[rows].sum(-1) > 0).sum())] for rows in local], dtype=torch.float64
    )
    shard.sum_over_ranks(counts)
    counts = counts.float().to(mask.device)
    return [Counts(tokens=row[0], responses=row[1]) for row in counts]


def _empty_step(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    critic: nn.Module | None,
    critic_optimizer: torch.optim.Optimizer | None,
    alg: ReasoningAlgorithmConfig,
    allreduce_grads: Callable[[nn.Module], None] | None,
) -> dict[str, Tensor]:
    """A rank's step on none of a global minibatch's rows: zero gradients into the averaging, then the same clipped
    step as every other rank (and the critic's)."""
    grad_norm = torch.zeros(())
    for model, model_optimizer in ((policy, optimizer), (critic, critic_optimizer)):
        if model is None or model_optimizer is None:
            continue
        model_optimizer.zero_grad()
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        norm = _optimizer_step(model, model_optimizer, alg.max_grad_norm, allreduce_grads)
        grad_norm = norm if model is policy else grad_norm
    zero = torch.zeros((), device=grad_norm.device)
    return defaultdict(lambda: zero, grad_norm=grad_norm)
