"""The LLM policy (and critic) update of reasoning tasks: PPO's clipped surrogate on response tokens, for GRPO,
REINFORCE++, RLOO and PPO with a critic, written so that data-parallel actor ranks can each run it on their shard.

Each actor rank calls `llm_update` on its own shard of rows with the same `algorithm` config section and a generator
seeded identically on every rank, so every rank takes the same number of optimizer steps; the training strategy
(`rlplace.core.strategies`: replicas averaging their gradients, or FSDP2 shards reduce-scattering them) makes each
step's gradient the mean over the ranks before clipping and stepping. Several ranks train the update one process would
train on the whole batch (`rlplace.core.data_parallel`): minibatches are drawn over the global batch, losses and stats
divide by the global minibatch's token and response counts (`losses.Counts`, as verl's global token normalisation), and
the advantages' whitening uses the whole batch's mean and variance. The number of actor ranks (the placement) never
changes the result but for float summation order.

Advantages are computed once per batch, before the update (`compute_advantages`), from rollout-time log-probs and
values; they stay fixed across the update's epochs.

Off-policy correction. PPO's ratio is taken against `batch.old_logprobs`, which the inference worker recomputes with
the training forward pass: they are the proximal policy π_prox, the one the update starts from. When the responses
were sampled by another policy, the behaviour policy π_behav (an older version with runner.max_staleness > 0, or the
rollout engine's own kernels), the caller passes its per-token log-probs as `behaviour_logprobs`, and every token is
weighted by π_prox / π_behav as algorithm.off_policy_correction says (`behaviour_weight`).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable

import torch
from torch import Tensor, nn

from rlplace.core.data_parallel import Shard, global_minibatches, most_over_ranks
from rlplace.core.off_policy import behaviour_weight
from rlplace.core.strategies.base import Strategy
from rlplace.reasoning.algorithms import ALGORITHMS
from rlplace.reasoning.config import ReasoningAlgorithmConfig
from rlplace.reasoning.models.value_model import ValueModel

from .advantages import (
    grpo_advantages,
    kl_penalized,
    masked_whiten,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_rewards_to_tokens,
    token_gae,
)
from .batch import SequenceBatch, response_logits, trimmed_inputs
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
from .micro_batches import PADDING_PASS, MicroBatch, plan_micro_batches

SumOverRanks = Callable[[Tensor], None] | None
"""In-place sum over the data-parallel ranks (`core.data_parallel.Shard.sum_over_ranks`); None on one rank."""


def _rollout_kl(batch: SequenceBatch, alg: ReasoningAlgorithmConfig) -> Tensor:
    """[B, T] KL of the rollout policy to the reference, per token, for the KL-in-reward form."""
    if batch.old_logprobs is None or batch.ref_logprobs is None:
        raise ValueError("KL in the reward (kl_coef > 0, use_kl_loss false) needs batch.old_logprobs and ref_logprobs")
    return kl_divergence(batch.old_logprobs, batch.ref_logprobs, alg.kl_type)


def reward_kl(batch: SequenceBatch, alg: ReasoningAlgorithmConfig, sum_over_ranks: SumOverRanks) -> tuple[float, int]:
    """The step's KL in the reward, as the adaptive controller reads it: each response's mean per-token KL of the
    rollout policy to the reference, averaged over the step's responses (every rank's with `sum_over_ranks`); and
    how many responses that is. Summed in float64, so that rank counts, which add in other orders, differ far below
    what the float32 rewards resolve."""
    mask = batch.action_mask.cpu().double()
    lengths = mask.sum(-1)
    answered = lengths > 0
    per_response = (_rollout_kl(batch, alg).cpu().double() * mask).sum(-1)[answered] / lengths[answered]
    totals = torch.stack([per_response.sum(), answered.sum().double()])
    if sum_over_ranks is not None:
        sum_over_ranks(totals)
    responses = round(float(totals[1]))
    return float(totals[0]) / max(responses, 1), responses


Advantages = tuple[Tensor, Tensor | None]
"""[B, T] advantages and, where the algorithm has a critic, [B, T] returns."""


def estimate_grpo(
    batch: SequenceBatch, alg: ReasoningAlgorithmConfig, values: Tensor | None, _: SumOverRanks
) -> Advantages:
    """Group-normalised rewards (a group lies within one rank's rows); GRPO's KL, if any, is a loss term."""
    return grpo_advantages(batch.rewards, batch.action_mask, alg.group_size, norm_std=alg.norm_adv_by_std), None


def estimate_rloo(
    batch: SequenceBatch, alg: ReasoningAlgorithmConfig, values: Tensor | None, _: SumOverRanks
) -> Advantages:
    """Leave-one-out baselined rewards (a group lies within one rank's rows), with the KL penalty in the token rewards
    unless use_kl_loss."""
    token_kl = _rollout_kl(batch, alg) if alg.kl_in_reward else None
    advantages = rloo_advantages(
        batch.rewards, batch.action_mask, alg.group_size, token_kl, alg.kl_coef, gamma=alg.gamma
    )
    return advantages, None


def estimate_reinforce_pp(
    batch: SequenceBatch, alg: ReasoningAlgorithmConfig, values: Tensor | None, sum_over_ranks: SumOverRanks
) -> Advantages:
    """REINFORCE++-baseline: whitened returns of the group-baselined rewards, with the KL penalty in the token rewards
    unless use_kl_loss."""
    return _reinforce_pp(batch, alg, alg.group_size, sum_over_ranks), None


def estimate_reinforce(
    batch: SequenceBatch, alg: ReasoningAlgorithmConfig, values: Tensor | None, sum_over_ranks: SumOverRanks
) -> Advantages:
    """REINFORCE++ without a baseline (OpenRLHF's `reinforce`): whitened returns of the rewards as they are, so that
    it works with one response per prompt."""
    return _reinforce_pp(batch, alg, None, sum_over_ranks), None


def _reinforce_pp(
    batch: SequenceBatch, alg: ReasoningAlgorithmConfig, group_size: int | None, sum_over_ranks: SumOverRanks
) -> Tensor:
    token_kl = _rollout_kl(batch, alg) if alg.kl_in_reward else None
    return reinforce_pp_advantages(
        batch.rewards,
        batch.action_mask,
        token_kl,
        alg.kl_coef,
        group_size=group_size,
        gamma=alg.gamma,
        sum_over_ranks=sum_over_ranks,
    )


def estimate_ppo(
    batch: SequenceBatch, alg: ReasoningAlgorithmConfig, values: Tensor | None, sum_over_ranks: SumOverRanks
) -> Advantages:
    """GAE over the token rewards (reward on the EOS, KL penalty unless use_kl_loss) with the critic's rollout-time
    `values`; the advantages are whitened over the batch, the returns (the critic's target) stay in reward units."""
    if values is None:
        raise ValueError("ppo needs the critic's rollout-time values to compute GAE")
    mask = batch.action_mask
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


def optimizer_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, strategy: Strategy | None
) -> Tensor:
    """Average grads across ranks, clip, step; returns the total grad norm before clipping."""
    if strategy is None:
        grad_norm = nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_grad_norm)
    else:
        strategy.reduce_grads(model)
        grad_norm = strategy.clip_grad_norm(model, max_grad_norm)
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
    strategy: Strategy | None = None,
    shard: Shard | None = None,
    max_tokens_per_micro_batch: int | None = None,
    max_response_tokens: int | None = None,
    temperature: float = 1.0,
) -> dict[str, float]:
    """Run `update_epochs` x `num_minibatches` optimizer steps on `batch`'s rows; returns train/* means over them.

    `policy` is a causal LM (logits from `response_logits`); `batch` needs old_logprobs, and ref_logprobs when the KL
    is a loss term. `generator` (CPU) shuffles the rows. `strategy` (`rlplace.core.strategies`), when given, reduces
    the gradients over the data-parallel ranks and clips their global norm, once per optimizer step for the policy
    and, with a critic, once more for the critic; None is one process holding the whole model.

    ppo also needs `critic` (a `ValueModel`), `critic_optimizer`, `returns` and `old_values` ([B, T], rollout-time):
    the critic takes its own step per minibatch on vf_coef * the (clipped) value loss, with its own reduction and
    clipping. `train/grad_norm` is the policy's total norm before clipping.

    `behaviour_logprobs` ([B, T]) are the log-probs of the policy that sampled the responses, when it is not the
    proximal one of `batch.old_logprobs` (the actor's weights at the start of this update). None means they are the
    same (synchronous training): w = 1, plain PPO. Otherwise each token's surrogate is weighted by the fixed
    `behaviour_weight(old_logprobs, behaviour_logprobs)` under alg.off_policy_correction and alg.behaviour_weight_cap,
    whose mean over valid tokens is `train/behaviour_weight` (1 without behaviour log-probs).

    `shard` says which rows of the global batch `batch` holds when it is one data-parallel rank's part (None: the
    whole batch); the update and its stats are then the global batch's. `max_tokens_per_micro_batch` cuts each
    optimizer step's rows into passes of about that many tokens (`micro_batches`); None: one pass per step.
    `max_response_tokens` is the generation budget (rollout.max_new_tokens), which alg.loss_agg
    `seq_mean_token_sum_norm` divides by. `temperature` is the one the responses were sampled at
    (`response_logits`), which batch.old_logprobs and ref_logprobs were scored at too. The gradients are freed at the
    end.
    """
    if batch.old_logprobs is None:
        raise ValueError("llm_update needs batch.old_logprobs (the inference worker fills them)")
    if alg.kl_in_loss and batch.ref_logprobs is None:
        raise ValueError("kl_coef > 0 with use_kl_loss needs batch.ref_logprobs (the reference worker fills them)")
    if alg.has_critic and critic is None:
        raise ValueError(f"{alg.name} needs a critic")
    if critic is not None and (critic_optimizer is None or returns is None or old_values is None):
        raise ValueError("a critic needs critic_optimizer, returns and old_values")
    if alg.loss_agg == "seq_mean_token_sum_norm" and max_response_tokens is None:
        raise ValueError("loss_agg seq_mean_token_sum_norm divides by max_response_tokens (rollout.max_new_tokens)")
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

    mask = batch.action_mask
    keys = ["policy_loss", "entropy", "kl", "clip_frac", "approx_kl", "behaviour_weight", "grad_norm"]
    if alg.clip_ratio_c is not None:
        keys.append("clip_frac_lower")
    if critic is not None:
        keys.append("value_loss")
    stats: dict[str, list[Tensor]] = {key: [] for key in keys}
    modes = [(model, model.training) for model in (policy, critic) if model is not None]
    for model, _ in modes:
        model.train()

    minibatches = global_minibatches(num_rows, alg.update_epochs, alg.num_minibatches, generator)
    if shard is None:
        steps = [(rows, _local_counts(mask, rows, max_response_tokens)) for rows in minibatches]
    else:
        global_counts = _global_counts(shard, minibatches, mask, max_response_tokens)
        steps = list(zip(shard.split(minibatches), global_counts, strict=True))
    # Passes are cut by the columns the rows span, the tools' tokens included (the action mask has holes there).
    plans = [
        plan_micro_batches(rows, batch.prompt_mask, batch.response_mask, max_tokens_per_micro_batch)
        for rows, _ in steps
    ]
    if strategy is not None and strategy.collective_passes and shard is not None:
        plans = _in_step(plans, shard)
    # A rank's loss is its part of the global minibatch's; the gradient averaging over ranks divides by their count.
    scale = 1.0 if shard is None else float(shard.world_size)
    for (_, counts), plan in zip(steps, plans, strict=True):  # update_epochs x num_minibatches steps on every rank
        terms = functools.partial(_policy_pass, policy, batch, advantages, weights, alg, temperature, counts=counts)
        step_stats = _accumulate(policy, optimizer, plan, terms, scale, strategy)
        step_stats["grad_norm"] = optimizer_step(policy, optimizer, alg.max_grad_norm, strategy)
        if critic is not None:
            assert critic_optimizer is not None and returns is not None and old_values is not None
            terms = functools.partial(_value_pass, critic, batch, old_values, returns, alg, counts=counts)
            step_stats["value_loss"] = _accumulate(critic, critic_optimizer, plan, terms, scale, strategy)["value_loss"]
            optimizer_step(critic, critic_optimizer, alg.max_grad_norm, strategy)
        for key in keys:  # detached; read once at the end (no device syncs per step)
            stats[key].append(step_stats[key].float())

    for stepped in (optimizer, critic_optimizer):
        # Kept for the next update to zero, the gradients would hold 4 bytes a parameter on the actor's devices through
        # weight sync and generation, and an offloaded actor would move them out and back each step.
        if stepped is not None:
            stepped.zero_grad(set_to_none=True)
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


PassTerms = Callable[[MicroBatch], tuple[Tensor, dict[str, Tensor]]]
"""A pass's loss (its part of the minibatch's) and its detached stats (their parts)."""


def _accumulate(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    plan: list[MicroBatch],
    terms: PassTerms,
    scale: float,
    strategy: Strategy | None,
) -> dict[str, Tensor]:
    """Zero the gradients, then run `plan`'s passes forward and backward, accumulating their gradients and summing
    their stats. A rank with no pass (none of the step's rows, with a strategy whose passes are not collective) adds
    zero gradients to the reduction."""
    optimizer.zero_grad()
    totals: dict[str, Tensor] = defaultdict(lambda: torch.zeros(()))
    for position, micro_batch in enumerate(plan):
        if strategy is not None:
            strategy.sync_grads(model, position == len(plan) - 1)
        loss, pass_stats = terms(micro_batch)
        (loss * (scale * micro_batch.weight)).backward()
        if micro_batch.weight:
            for key, value in pass_stats.items():
                totals[key] = totals[key].to(value.device) + value
    if not plan:
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    return totals


def _policy_pass(
    policy: nn.Module,
    batch: SequenceBatch,
    advantages: Tensor,
    weights: Tensor | None,
    alg: ReasoningAlgorithmConfig,
    temperature: float,
    micro_batch: MicroBatch,
    counts: Counts,
) -> tuple[Tensor, dict[str, Tensor]]:
    rows, columns = micro_batch.rows, slice(None, micro_batch.length)
    input_ids, attention_mask, width = trimmed_inputs(batch, micro_batch)
    logits = response_logits(policy, input_ids, attention_mask, width, temperature)
    device = logits.device
    row_mask = batch.action_mask[rows, columns].to(device)
    logprobs = logprobs_from_logits(logits, input_ids[:, width:].to(device))
    pg_loss, pass_stats = token_policy_loss(
        logprobs,
        batch.old_logprobs[rows, columns].to(device),
        advantages[rows, columns].to(device),
        row_mask,
        alg.clip_ratio_low,
        alg.clip_ratio_high,
        alg.loss_agg,
        None if weights is None else weights[rows, columns].to(device),
        counts,
        importance_ratio=alg.importance_ratio,
        clip_ratio_c=alg.clip_ratio_c,
    )
    token_entropy = entropy_from_logits(logits)
    loss = pg_loss - alg.ent_coef * aggregate_loss(token_entropy, row_mask, alg.loss_agg, counts)
    pass_stats["kl"] = torch.zeros((), device=device)
    if batch.ref_logprobs is not None:
        token_kl = kl_divergence(logprobs, batch.ref_logprobs[rows, columns].to(device), alg.kl_type)
        if alg.kl_in_loss:
            loss = loss + alg.kl_coef * aggregate_loss(token_kl, row_mask, alg.loss_agg, counts)
        pass_stats["kl"] = token_mean(token_kl.detach(), row_mask, counts)
    # The entropy logged is the mean over response tokens whatever loss_agg weighs the bonus by: comparable across runs.
    pass_stats.update(policy_loss=pg_loss.detach(), entropy=token_mean(token_entropy.detach(), row_mask, counts))
    return loss, pass_stats


def _value_pass(
    critic: ValueModel,
    batch: SequenceBatch,
    old_values: Tensor,
    returns: Tensor,
    alg: ReasoningAlgorithmConfig,
    micro_batch: MicroBatch,
    counts: Counts,
) -> tuple[Tensor, dict[str, Tensor]]:
    rows, columns = micro_batch.rows, slice(None, micro_batch.length)
    input_ids, attention_mask, width = trimmed_inputs(batch, micro_batch)
    values = critic.values_after(input_ids, attention_mask, width)
    device = values.device
    v_loss = token_value_loss(
        values,
        old_values[rows, columns].to(device),
        returns[rows, columns].to(device),
        batch.action_mask[rows, columns].to(device),
        alg.value_clip,
        counts,
    )
    return alg.vf_coef * v_loss, {"value_loss": v_loss.detach()}


def _local_counts(mask: Tensor, rows: Tensor, budget: int | None) -> Counts:
    """A minibatch's valid tokens and responses, on one process (at least 1 each, as `masked_mean` divides)."""
    row_mask = mask[rows]
    tokens = row_mask.sum().float().clamp(min=1.0)
    responses = (row_mask.sum(-1) > 0).sum().float().clamp(min=1.0)
    return Counts(tokens=tokens.to(mask.device), responses=responses.to(mask.device), budget=budget)


def _in_step(plans: list[list[MicroBatch]], shard: Shard) -> list[list[MicroBatch]]:
    """Every rank's plans padded with zero-weighted passes to the most passes any rank runs in each step: one
    collective call for the update."""
    most = most_over_ranks([len(plan) for plan in plans], shard.rank, shard.world_size, shard.sum_over_ranks)
    return [plan + [PADDING_PASS] * (n - len(plan)) for plan, n in zip(plans, most, strict=True)]


def _global_counts(shard: Shard, minibatches: list[Tensor], mask: Tensor, budget: int | None) -> list[Counts]:
    """Each global minibatch's valid tokens and responses over every rank: one collective call for the update."""
    local = shard.split(minibatches)
    counts = torch.tensor(
        [[float(mask[rows].sum()), float((mask[rows].sum(-1) > 0).sum())] for rows in local], dtype=torch.float64
    )
    shard.sum_over_ranks(counts)
    counts = counts.float().to(mask.device)
    return [Counts(tokens=row[0], responses=row[1], budget=budget) for row in counts]
