"""The PPO update (CleanRL's inner loop), written so that data-parallel actor ranks can each run it on their shard.

Each rank calls `ppo_update` on its own shard with the same `algorithm` config section and a generator seeded
identically on every rank. Every rank then takes the same number of optimizer steps, and `allreduce_grads` averages
gradients across ranks before clipping and stepping, so the ranks' models stay identical. With one rank and no
`allreduce_grads` it is CleanRL's update (minus the `target_kl` early stop, which would need the ranks to agree on
stopping).

Asynchronous training (runner.max_staleness = K > 0) trains step t on rollouts of policy version max(0, t - K), the
behaviour policy. The actor then calls `proximal_logprobs` once over its shard, with its current weights, before
the update and passes the result as the batch's "prox_logprobs": the loss clips against that proximal policy and
weighs each sample by π_prox / π_behav as algorithm.off_policy_correction says (see `behaviour_weight`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

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
    on a 2-core CPU: the default run's update in 85-87 ms against 98-99 ms; values agree to 1e-7)."""
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
) -> dict[str, float]:
    """Run `update_epochs` x `num_minibatches` PPO steps on `batch`; returns train/* means over those steps.

    Without "prox_logprobs" in `batch`, "logprobs" are both the behaviour and the proximal policy's (synchronous
    training): plain PPO. With it (from `proximal_logprobs`), the ratio is taken against "prox_logprobs" and each
    sample weighted by `behaviour_weight(prox_logprobs, logprobs)` under alg.off_policy_correction and
    alg.behaviour_weight_cap; the weights are fixed for the whole update, as both log-probs are.

    `generator` (a CPU torch.Generator) shuffles the minibatches. `allreduce_grads`, when given, receives the list of
    parameter gradients after each backward pass and must average them across ranks in place. `grad_norm` is the
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
    batch_size = batch["obs"].shape[0]
    min_size = alg.num_minibatches * (2 if alg.norm_adv else 1)  # a std needs two samples
    if batch_size < min_size:
        raise ValueError(f"batch of {batch_size} is too small for {alg.num_minibatches} minibatches")
    keys = ("policy_loss", "value_loss", "entropy", "kl", "clip_frac", "behaviour_weight", "grad_norm")
    stats: dict[str, list[Tensor]] = {k: [] for k in keys}
    for _ in range(alg.update_epochs):
        order = torch.randperm(batch_size, generator=generator).to(batch["obs"].device)
        for mb in order.tensor_split(alg.num_minibatches):  # exactly num_minibatches steps on every rank
            step_stats = minibatch_step(model, optimizer, batch, mb, proximal, weights, alg, allreduce_grads)
            for key, value in step_stats.items():
                stats[key].append(value)
    return {f"train/{key}": torch.stack(values).float().mean().item() for key, values in stats.items()}


def minibatch_step(
    model: MLPActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, Tensor],
    mb: Tensor,
    proximal: Tensor,
    weights: Tensor | None,
    alg: PPOConfig,
    allreduce_grads: Callable[[list[Tensor]], None] | None = None,
) -> dict[str, Tensor]:
    """One optimizer step on the samples `mb` (indices into `batch`), against the proximal log-probs `proximal` with
    the behaviour weights `weights` (None: all 1); returns the step's detached stats, grad_norm included.

    Apart from `ppo_update` so that `rlplace.embodied.profile` times exactly this unit of work (one minibatch's loss,
    backward and optimizer step), which the update repeats update_epochs x num_minibatches times."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    logprob, entropy, new_value = model.evaluate(batch["obs"][mb], batch["actions"][mb])
    advantages = batch["advantages"][mb]
    if alg.norm_adv:
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
