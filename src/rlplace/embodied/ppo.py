"""The PPO update (CleanRL's inner loop), written so that data-parallel actor ranks can each run it on their shard.

Each rank calls `ppo_update` on its own shard with the same `algorithm` config section and a generator seeded
identically on every rank. Every rank then takes the same number of optimizer steps, and `allreduce_grads` averages
gradients across ranks before clipping and stepping, so the ranks' models stay identical. With one rank and no
`allreduce_grads` it is CleanRL's update (minus the `target_kl` early stop, which would need the ranks to agree on
stopping).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from rlplace.embodied.config import PPOConfig
from rlplace.embodied.policy import MLPActorCritic

from .losses import entropy_bonus, ppo_policy_loss, value_loss

BATCH_KEYS = ("obs", "actions", "logprobs", "values", "advantages", "returns")
"""The flat ([B, ...]) tensors a batch must hold: rollout-time obs, actions, log-probs and values, plus targets."""


def ppo_update(
    model: MLPActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, Tensor],
    alg: PPOConfig,
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
    min_size = alg.num_minibatches * (2 if alg.norm_adv else 1)  # a std needs two samples
    if batch_size < min_size:
        raise ValueError(f"batch of {batch_size} is too small for {alg.num_minibatches} minibatches")
    trainable = [p for p in model.parameters() if p.requires_grad]
    value_clip = alg.value_clip
    stats: dict[str, list[Tensor]] = {k: [] for k in ("policy_loss", "value_loss", "entropy", "kl", "clip_frac")}
    grad_norms: list[Tensor] = []

    for _ in range(alg.update_epochs):
        order = torch.randperm(batch_size, generator=generator).to(batch["obs"].device)
        for mb in order.tensor_split(alg.num_minibatches):  # exactly num_minibatches steps on every rank
            logprob, entropy, new_value = model.evaluate(batch["obs"][mb], batch["actions"][mb])
            advantages = batch["advantages"][mb]
            if alg.norm_adv:
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            pg_loss, pg_stats = ppo_policy_loss(
                logprob, batch["logprobs"][mb], advantages, alg.clip_ratio_low, alg.clip_ratio_high
            )
            v_loss = value_loss(new_value, batch["values"][mb], batch["returns"][mb], value_clip)
            entropy_mean = entropy_bonus(entropy)
            loss = pg_loss - alg.ent_coef * entropy_mean + alg.vf_coef * v_loss

            optimizer.zero_grad()
            loss.backward()
            if allreduce_grads is not None:
                allreduce_grads([p.grad for p in trainable if p.grad is not None])
            grad_norms.append(nn.utils.clip_grad_norm_(trainable, alg.max_grad_norm))
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
