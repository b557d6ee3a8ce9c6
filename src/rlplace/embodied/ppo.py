"""The PPO update (CleanRL's inner loop), written so that data-parallel actor ranks can each run it on their shard.

Each rank calls `ppo_update` on its own shard with the same `algorithm` config section and a generator seeded
identically on every rank. With one rank and no `allreduce_grads` it is CleanRL's update (minus the `target_kl` early
stop, which would need the ranks to agree on stopping). Several ranks run that same update of the whole batch
(`rlplace.core.data_parallel`): global minibatches, advantages normalised with the global minibatch's mean and std,
each rank's loss weighted by its share of the minibatch before `allreduce_grads` averages the gradients, and global
means as stats.

Asynchronous training (runner.max_staleness = K > 0) trains step t on rollouts of policy version max(0, t - K), the
behaviour policy. The actor then calls `proximal_logprobs` once over its shard, with its current weights, before
the update and passes the result as the batch's "prox_logprobs": the loss clips against that proximal policy and
weighs each sample by π_prox / π_behav as algorithm.off_policy_correction says (see `behaviour_weight`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlplace.core.data_parallel import Shard, global_minibatches
from rlplace.core.off_policy import behaviour_weight
from rlplace.embodied.config import PPOConfig
from rlplace.embodied.policy import MLPActorCritic

from .losses import entropy_bonus, ppo_policy_loss, value_loss

BATCH_KEYS = ("obs", "actions", "logprobs", "values", "advantages", "returns")
"""The flat ([B, ...]) tensors a batch must hold: rollout-time obs, actions, log-probs and values, plus targets."""

PROXIMAL_KEY = "prox_logprobs"
"""The optional [B] log-probs of the actions under the actor's weights at the start of the update (asynchronous
training); with it, "logprobs" are the behaviour policy's."""


def make_optimizer(model: MLPActorCritic, lr: float) -> torch.optim.Adam:
    """The actor's Adam (eps 1e-5, as CleanRL's PPO), fused: one kernel updates every parameter, where the unfused
    one runs about ten ops per parameter, a large part of a 64-wide MLP's minibatch step (`benchmarks/actor_update.py`
    times both; the values agree to float rounding)."""
    return torch.optim.Adam(model.parameters(), lr=lr, eps=1e-5, fused=True)


@torch.no_grad()
def proximal_logprobs(model: MLPActorCritic, obs: Tensor, actions: Tensor) -> Tensor:
    """[B] log-probs of `actions` under `model`'s current weights: π_prox, the batch's "prox_logprobs".

    The actor calls it once over its shard right before `ppo_update`, so every minibatch step of the update clips
    against the same policy, whatever policy version generated the rollouts."""
    return model.logprob(obs, actions)


def ppo_update(
    model: MLPActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, Tensor],
    alg: PPOConfig,
    generator: torch.Generator,
    allreduce_grads: Callable[[list[Tensor]], None] | None = None,
    shard: Shard | None = None,
) -> dict[str, float]:
    """Run `update_epochs` x `num_minibatches` PPO steps on `batch`; returns train/* means over those steps.

    Without "prox_logprobs" in `batch`, "logprobs" are both the behaviour and the proximal policy's (synchronous
    training): plain PPO. With it (from `proximal_logprobs`), the ratio is taken against "prox_logprobs" and each
    sample weighted by `behaviour_weight(prox_logprobs, logprobs)` under alg.off_policy_correction and
    alg.behaviour_weight_cap; the weights are fixed for the whole update, as both log-probs are.

    `generator` (a CPU torch.Generator) shuffles the minibatches. `allreduce_grads`, when given, receives the list of
    parameter gradients after each backward pass and must average them across ranks in place. `shard` says which
    samples of the global batch `batch` holds when it is one rank's part (None: the whole batch). `grad_norm` is the
    total norm before clipping; `behaviour_weight` the mean importance weight (1 without "prox_logprobs").
    """
    missing = [key for key in BATCH_KEYS if key not in batch]
    if missing:
        raise ValueError(f"batch is missing {missing}: ppo_update needs {', '.join(BATCH_KEYS)}")
    proximal, weights = batch["logprobs"], None  # synchronous: the rollout policy is the proximal one
    if PROXIMAL_KEY in batch:
        proximal = batch[PROXIMAL_KEY]
        if proximal.shape != batch["logprobs"].shape:
            raise ValueError(
                f"{PROXIMAL_KEY} has shape {tuple(proximal.shape)}, logprobs {tuple(batch['logprobs'].shape)}"
            )
        weights = behaviour_weight(proximal, batch["logprobs"], alg.off_policy_correction, alg.behaviour_weight_cap)
    batch_size = batch["obs"].shape[0] if shard is None else shard.size
    min_size = alg.num_minibatches * (2 if alg.norm_adv else 1)  # a std needs two samples
    if batch_size < min_size:
        raise ValueError(f"batch of {batch_size} is too small for {alg.num_minibatches} minibatches")
    device = batch["obs"].device
    minibatches = global_minibatches(batch_size, alg.update_epochs, alg.num_minibatches, generator)
    if shard is None:
        steps = [StepPlan(mb.to(device)) for mb in minibatches]
    else:
        steps = shard_steps(shard, minibatches, batch["advantages"] if alg.norm_adv else None, device)
    stats: dict[str, list[Tensor]] = {k: [] for k in STAT_KEYS}
    for plan in steps:  # exactly update_epochs x num_minibatches steps on every rank
        step_stats = minibatch_step(model, optimizer, batch, plan.mb, proximal, weights, alg, allreduce_grads, plan)
        for key, value in step_stats.items():
            stats[key].append(value)
    stacked = {key: torch.stack(values).float() for key, values in stats.items()}
    if shard is not None:  # each rank's minibatch means, weighted by its share: the global minibatch's means
        means = torch.stack([stacked[key] for key in MEAN_KEYS]).cpu()
        shares = torch.tensor([plan.share / shard.world_size for plan in steps])
        means.mul_(shares)
        shard.sum_over_ranks(means)
        stacked.update(zip(MEAN_KEYS, means, strict=True))
    return {f"train/{key}": values.mean().item() for key, values in stacked.items()}


STAT_KEYS = ("policy_loss", "value_loss", "entropy", "kl", "clip_frac", "behaviour_weight", "grad_norm")
MEAN_KEYS = STAT_KEYS[:-1]
"""The stats that are means over a minibatch's samples (the grad norm is taken after averaging: the same on every
rank)."""


@dataclass(frozen=True)
class StepPlan:
    """One minibatch step of a rank: its samples, the weight of its loss, and the global minibatch's advantage mean
    and std (None: normalise over `mb` itself, the one-rank update)."""

    mb: Tensor
    share: float = 1.0
    """The rank's share of the global minibatch times the ranks: averaged over the ranks, the weighted gradients
    are the gradient of the global minibatch's mean loss."""
    norm: tuple[Tensor, Tensor] | None = None


def shard_steps(
    shard: Shard, minibatches: list[Tensor], advantages: Tensor | None, device: torch.device
) -> list[StepPlan]:
    """This rank's part of each global minibatch (in the global order), its share, and, when advantages are
    normalised, the global minibatch's mean and std: two collective calls for the whole update, since the
    advantages stay fixed across it."""
    local = shard.split(minibatches)
    sizes = torch.tensor([mb.numel() for mb in minibatches], dtype=torch.float64)
    shares = [part.numel() / size for part, size in zip(local, sizes.tolist(), strict=True)]
    norms: list[tuple[Tensor, Tensor] | None] = [None] * len(local)
    if advantages is not None:
        values = advantages.detach().cpu().double()
        sums = torch.stack([values[part].sum() for part in local])
        shard.sum_over_ranks(sums)
        means = sums / sizes
        squares = torch.stack([((values[part] - mean) ** 2).sum() for part, mean in zip(local, means, strict=True)])
        shard.sum_over_ranks(squares)
        stds = (squares / (sizes - 1)).sqrt()
        dtype = advantages.dtype
        norms = [(m.to(device, dtype), s.to(device, dtype)) for m, s in zip(means, stds, strict=True)]
    return [
        StepPlan(part.to(device), share * shard.world_size, norm)
        for part, share, norm in zip(local, shares, norms, strict=True)
    ]


def minibatch_step(
    model: MLPActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, Tensor],
    mb: Tensor,
    proximal: Tensor,
    weights: Tensor | None,
    alg: PPOConfig,
    allreduce_grads: Callable[[list[Tensor]], None] | None = None,
    plan: StepPlan | None = None,
) -> dict[str, Tensor]:
    """One optimizer step on the samples `mb` (indices into `batch`), against the proximal log-probs `proximal` with
    the behaviour weights `weights` (None: all 1); returns the step's detached stats (means over `mb`), grad_norm
    included. `plan` (from `shard_steps`) weights the loss by this rank's share of a global minibatch and normalises
    advantages with its mean and std; None: `mb` is the whole minibatch.

    Apart from `ppo_update` so that `rlplace.embodied.profile` times exactly this unit of work (one minibatch's loss,
    backward and optimizer step), which the update repeats update_epochs x num_minibatches times."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if mb.numel() == 0:  # no sample of this global minibatch lies in this rank's shard: it adds nothing
        return _empty_step(trainable, optimizer, alg, allreduce_grads)
    logprob, entropy, new_value = model.evaluate(batch["obs"][mb], batch["actions"][mb])
    advantages = batch["advantages"][mb]
    if alg.norm_adv and plan is not None and plan.norm is not None:
        mean, std = plan.norm
        advantages = (advantages - mean) / (std + 1e-8)
    elif alg.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss, pg_stats = ppo_policy_loss(
        logprob,
        proximal[mb],
        advantages,
        alg.clip_ratio_low,
        alg.clip_ratio_high,
        None if weights is None else weights[mb],
    )
    v_loss = value_loss(new_value, batch["values"][mb], batch["returns"][mb], alg.value_clip)
    entropy_mean = entropy_bonus(entropy)
    loss = pg_loss - alg.ent_coef * entropy_mean + alg.vf_coef * v_loss
    if plan is not None and plan.share != 1.0:
        loss = loss * plan.share  # the ranks' average is then the gradient of the global minibatch's mean

    optimizer.zero_grad()
    loss.backward()
    if allreduce_grads is not None:
        allreduce_grads([p.grad for p in trainable if p.grad is not None])
    grad_norm = nn.utils.clip_grad_norm_(trainable, alg.max_grad_norm)
    optimizer.step()
    return {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy_mean.detach(),
        "kl": pg_stats["approx_kl"].detach(),
        "clip_frac": pg_stats["clip_frac"].detach(),
        "behaviour_weight": pg_stats["behaviour_weight"].detach(),
        "grad_norm": grad_norm,
    }


def _empty_step(
    trainable: list[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    alg: PPOConfig,
    allreduce_grads: Callable[[list[Tensor]], None] | None,
) -> dict[str, Tensor]:
    """A rank's step on none of the minibatch's samples: zero gradients into the averaging, then the same clipped
    step as every other rank."""
    optimizer.zero_grad()
    for p in trainable:
        p.grad = torch.zeros_like(p)
    if allreduce_grads is not None:
        allreduce_grads([p.grad for p in trainable])
    grad_norm = nn.utils.clip_grad_norm_(trainable, alg.max_grad_norm)
    optimizer.step()
    zero = torch.zeros((), device=grad_norm.device)
    return {key: zero for key in MEAN_KEYS} | {"grad_norm": grad_norm}
