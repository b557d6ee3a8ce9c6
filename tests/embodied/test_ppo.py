"""ppo_update: lowers the PPO loss on a fixed batch, is deterministic given the generator, averages via allreduce,
and reads its hyperparameters from the `algorithm` config section (PPOConfig) as it is."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from rlplace.embodied.config import PPOConfig
from rlplace.embodied.envs import ActionSpec
from rlplace.embodied.losses import ppo_policy_loss, value_loss
from rlplace.embodied.policy import MLPActorCritic
from rlplace.embodied.ppo import ppo_update

PARAMS = PPOConfig(update_epochs=4, num_minibatches=4, ent_coef=0.0)


def _setup(seed: int = 0) -> tuple[MLPActorCritic, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    model = MLPActorCritic(4, ActionSpec(kind="discrete", n=2), hidden_sizes=(16, 16))
    obs = torch.randn(256, 4)
    with torch.no_grad():
        actions = torch.randint(0, 2, (256,))
        logprobs, _, values = model.evaluate(obs, actions)
    advantages = torch.where(actions == (obs[:, 0] > 0).long(), 1.0, -1.0) + 0.1 * torch.randn(256)  # learnable
    batch = {
        "obs": obs,
        "actions": actions,
        "logprobs": logprobs,
        "values": values,
        "advantages": advantages,
        "returns": values + advantages,
    }
    return model, torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-5), batch


def _loss(model: MLPActorCritic, batch: dict[str, torch.Tensor]) -> float:
    with torch.no_grad():
        logprob, _, value = model.evaluate(batch["obs"], batch["actions"])
        advantages = (batch["advantages"] - batch["advantages"].mean()) / batch["advantages"].std()
        pg_loss, _ = ppo_policy_loss(logprob, batch["logprobs"], advantages, 0.2, 0.2)
        return (pg_loss + 0.5 * value_loss(value, batch["values"], batch["returns"], 0.2)).item()


def test_reduces_loss_and_reports_stats() -> None:
    model, optimizer, batch = _setup()
    before = _loss(model, batch)
    stats = ppo_update(model, optimizer, batch, PARAMS, torch.Generator().manual_seed(0))
    assert _loss(model, batch) < before - 0.05
    expected = {"policy_loss", "value_loss", "entropy", "kl", "clip_frac", "grad_norm"}
    assert set(stats) == {f"train/{k}" for k in expected}
    assert stats["train/kl"] > 0 and stats["train/grad_norm"] > 0


def test_deterministic_given_generator() -> None:
    results = []
    for gen_seed in (5, 5, 6):
        model, optimizer, batch = _setup()
        ppo_update(model, optimizer, batch, PARAMS, torch.Generator().manual_seed(gen_seed))
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    assert not torch.equal(results[0], results[2])


def test_allreduce_keeps_data_parallel_ranks_identical() -> None:
    # Two ranks on threads, each with its own shard and an identically seeded generator; the allreduce averages
    # their gradients through shared slots, as torch.distributed would. The ranks' models must stay identical.
    model, _, batch = _setup()
    shards = [{k: v[rank::2] for k, v in batch.items()} for rank in range(2)]
    models = [copy.deepcopy(model) for _ in range(2)]
    barrier = threading.Barrier(2, timeout=10)
    slots: list[list[torch.Tensor]] = [[], []]
    calls = [0, 0]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        def allreduce(grads: list[torch.Tensor]) -> None:
            calls[rank] += 1
            slots[rank] = [g.clone() for g in grads]
            barrier.wait()
            for g, mine, theirs in zip(grads, slots[rank], slots[1 - rank], strict=True):
                g.copy_((mine + theirs) / 2)
            barrier.wait()  # neither rank overwrites its slot before the other has read it

        try:
            optimizer = torch.optim.Adam(models[rank].parameters(), lr=1e-2, eps=1e-5)
            ppo_update(models[rank], optimizer, shards[rank], PARAMS, torch.Generator().manual_seed(3), allreduce)
        except BaseException as e:  # surfaced below: a thread's exception would otherwise vanish
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert calls == [PARAMS.update_epochs * PARAMS.num_minibatches] * 2
    for a, b, original in zip(models[0].parameters(), models[1].parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert not torch.equal(a, original)


def test_refuses_incomplete_or_tiny_batch() -> None:
    model, optimizer, batch = _setup()
    with pytest.raises(ValueError, match="returns"):
        ppo_update(model, optimizer, {k: v for k, v in batch.items() if k != "returns"}, PARAMS, torch.Generator())
    with pytest.raises(ValueError, match="too small"):
        ppo_update(model, optimizer, {k: v[:6] for k, v in batch.items()}, PARAMS, torch.Generator())


def test_follows_the_algorithm_section() -> None:
    # update_epochs x num_minibatches optimizer steps, each after one gradient average.
    model, optimizer, batch = _setup()
    calls: list[int] = []
    alg = PPOConfig(update_epochs=3, num_minibatches=2, ent_coef=0.0)
    ppo_update(model, optimizer, batch, alg, torch.Generator().manual_seed(0), lambda grads: calls.append(len(grads)))
    assert len(calls) == 6
    # Advantages are normalised per minibatch only with norm_adv, which needs two samples per minibatch.
    tiny = {k: v[:2] for k, v in batch.items()}
    with pytest.raises(ValueError, match="too small"):
        ppo_update(model, optimizer, tiny, PPOConfig(num_minibatches=2), torch.Generator())
    stats = ppo_update(model, optimizer, tiny, PPOConfig(num_minibatches=2, norm_adv=False), torch.Generator())
    assert stats["train/grad_norm"] > 0
    # clip_vloss=False trains the critic on the unclipped loss: the same seed gives other weights.
    results = []
    for clip_vloss in (True, False):
        model, optimizer, batch = _setup()
        ppo_update(model, optimizer, batch, PPOConfig(clip_vloss=clip_vloss), torch.Generator().manual_seed(1))
        results.append(torch.cat([p.detach().flatten() for p in model.critic.parameters()]))
    assert not torch.equal(*results)
