"""The PPO update (CleanRL's inner loop), written so that data-parallel actor ranks can each run it on their shard.

Each rank calls `ppo_update` on its own shard with the same `PPOParams` and a generator seeded identically on every
rank. Every rank then takes the same number of optimizer steps, and `allreduce_grads` averages gradients across
ranks before clipping and stepping, so the ranks' models stay identical. With one rank and no `allreduce_grads` it is
CleanRL's update (minus the `target_kl` early stop, which would need the ranks to agree on stopping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlplace.models.mlp_policy import MLPActorCritic

from .losses import entropy_bonus, ppo_policy_loss, value_loss

BATCH_KEYS = ("obs", "actions", "logprobs", "values", "advantages", "returns")
"""The flat ([B, ...]) tensors a batch must hold: rollout-time obs, actions, log-probs and values, plus targets."""


@dataclass(frozen=True)
class PPOParams:
    """PPO hyperparameters; the names are those of `rlplace.config.AlgorithmConfig` (CleanRL's defaults)."""

    update_epochs: int = 4
    """Passes over the batch per update."""
    num_minibatches: int = 4
    """Minibatches (optimizer steps) per epoch; on each data-parallel rank, over that rank's shard."""
    clip_ratio_low: float = 0.2
    """The ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]."""
    clip_ratio_high: float = 0.2
    clip_vloss: bool = True
    """Clip the value prediction to +-clip_ratio_low around the rollout-time value (CleanRL's clip_coef)."""
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    """Normalise advantages per minibatch to zero mean and unit std."""


def ppo_update(
    model: MLPActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, Tensor],
    params: PPOParams,
    generator: torch.Generator,
    allreduce_grads: Callable[[list[Tensor]], None] | None = None,
) -> dict[str, float]:
    """Run `update_epochs` x `num_minibatches` PPO steps on `batch`; returns train/* means over those steps.

    `generator` (a CPU torch.Generator) shuffles the minibatches. `allreduce_grads`, when given, receives the list of
    parameter gradients after each backward pass and must average them across ranks in place. `grad_norm` is the
    total norm before clipping.
    """
    missing = [key for key in BATCH_KEYS if key not in batch]
    if missing:
        raise ValueError(f"batch is missing {missing}: ppo_update needs {', '.join(BATCH_KEYS)}")
    batch_size = batch["obs"].shape[0]
    min_size = params.num_minibatches * (2 if params.norm_adv else 1)  # a std needs two samples
    if batch_size < min_size:
        raise ValueError(f"batch of {batch_size} is too small for {params.num_minibatches} minibatches")
    trainable = [p for p in model.parameters() if p.requires_grad]
    value_clip = params.clip_ratio_low if params.clip_vloss else None
    stats: dict[str, list[Tensor]] = {k: [] for k in ("policy_loss", "value_loss", "entropy", "kl", "clip_frac")}
    grad_norms: list[Tensor] = []

    for _ in range(params.update_epochs):
        order = torch.randperm(batch_size, generator=generator).to(batch["obs"].device)
        for mb in order.tensor_split(params.num_minibatches):  # exactly num_minibatches steps on every rank
            logprob, entropy, new_value = model.evaluate(batch["obs"][mb], batch["actions"][mb])
            advantages = batch["advantages"][mb]
            if params.norm_adv:
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            pg_loss, pg_stats = ppo_policy_loss(
                logprob, batch["logprobs"][mb], advantages, params.clip_ratio_low, params.clip_ratio_high
            )
            v_loss = value_loss(new_value, batch["values"][mb], batch["returns"][mb], value_clip)
            entropy_mean = entropy_bonus(entropy)
            loss = pg_loss - params.ent_coef * entropy_mean + params.vf_coef * v_loss

            optimizer.zero_grad()
            loss.backward()
            if allreduce_grads is not None:
                allreduce_grads([p.grad for p in trainable if p.grad is not None])
            grad_norms.append(nn.utils.clip_grad_norm_(trainable, params.max_grad_norm))
            optimizer.step()

            for key, value in (
                ("policy_loss", pg_loss),
                ("value_loss", v_loss),
                ("entropy", entropy_mean),
                ("kl", pg_stats["approx_kl"]),
                ("clip_frac", pg_stats["clip_frac"]),
            ):
                stats[key].append(value.detach())

    stats["grad_norm"] = grad_norms
    return {f"train/{key}": torch.stack(values).float().mean().item() for key, values in stats.items()}
