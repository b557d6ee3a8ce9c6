"""ppo_update: lowers the PPO loss on a fixed batch, is deterministic given the generator, averages via allreduce,
corrects for an older behaviour policy (asynchronous training) and reads its hyperparameters from the `algorithm`
config section (PPOConfig) as it is."""

from __future__ import annotations

import copy
import functools
import threading

import pytest
import torch

from rlplace.core.data_parallel import Shard
from rlplace.core.errors import ConfigError
from rlplace.core.off_policy import behaviour_weight
from rlplace.embodied.config import PPOConfig
from rlplace.embodied.envs import ActionSpec
from rlplace.embodied.losses import ppo_policy_loss, value_loss
from rlplace.embodied.policy import MLPActorCritic
from rlplace.embodied.ppo import ppo_update, proximal_logprobs
from tests.data_parallel import ThreadRanks

PARAMS = PPOConfig(update_epochs=4, num_minibatches=4, ent_coef=0.0)


DISCRETE = ActionSpec(kind="discrete", n=2)
CONTINUOUS = ActionSpec(kind="continuous", dim=2, low=(-1.0, -1.0), high=(1.0, 1.0))
"""A HalfCheetah-like head: Gaussian actions."""


def _setup(
    seed: int = 0, action: ActionSpec = DISCRETE
) -> tuple[MLPActorCritic, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    model = MLPActorCritic(4, action, hidden_sizes=(16, 16))
    obs = torch.randn(256, 4)
    with torch.no_grad():
        actions = torch.randint(0, 2, (256,)) if action.discrete else torch.randn(256, action.dim)
        logprobs, _, values = model.evaluate(obs, actions)
    right = actions == (obs[:, 0] > 0).long() if action.discrete else (actions[:, 0] > 0) == (obs[:, 0] > 0)
    advantages = torch.where(right, 1.0, -1.0) + 0.1 * torch.randn(256)  # learnable
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
    expected = {"policy_loss", "value_loss", "entropy", "kl", "clip_frac", "behaviour_weight", "grad_norm"}
    assert set(stats) == {f"train/{k}" for k in expected}
    assert stats["train/kl"] > 0 and stats["train/grad_norm"] > 0
    assert stats["train/behaviour_weight"] == 1.0  # on-policy: no prox_logprobs, w = 1


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


def _data_parallel(
    world_size: int, stale: bool, action: ActionSpec, seed: int = 0
) -> tuple[list[torch.Tensor], dict[str, float]]:
    """The update of `_setup`'s batch, laid out as T=16 steps x N=16 env columns, on `world_size` ranks (threads),
    each with the contiguous env columns an actor rank gets. Returns rank 0's parameters and stats (after checking
    that every rank has the same)."""
    model, _, batch = _setup(seed, action)
    if stale:  # an older behaviour policy: the update weighs samples by pi_prox / pi_behav
        batch["prox_logprobs"] = batch["logprobs"] + 0.05 * torch.randn(256, generator=torch.Generator().manual_seed(9))
    if world_size == 1:  # the one-process update, no shard
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-5)
        stats = ppo_update(model, optimizer, batch, PARAMS, torch.Generator().manual_seed(3))
        return [p.detach() for p in model.parameters()], stats
    steps, columns = 16, 16
    per_rank = columns // world_size
    ranks = ThreadRanks(world_size)

    def train(rank: int) -> tuple[list[torch.Tensor], dict[str, float]]:
        columns_of_rank = torch.arange(rank * per_rank, (rank + 1) * per_rank)
        index = (torch.arange(steps)[:, None] * columns + columns_of_rank[None, :]).flatten()
        shard = Shard(index, steps * columns, world_size, lambda t: ranks.sum(rank, t), rank)
        mine = copy.deepcopy(model)
        optimizer = torch.optim.Adam(mine.parameters(), lr=1e-2, eps=1e-5)
        local = {k: v[index] for k, v in batch.items()}
        average = functools.partial(ranks.average_grads, rank)
        stats = ppo_update(mine, optimizer, local, PARAMS, torch.Generator().manual_seed(3), average, shard)
        return [p.detach() for p in mine.parameters()], stats

    results = ranks.run(train)
    for params, stats in results[1:]:
        assert stats == results[0][1]
        for a, b in zip(params, results[0][0], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    return results[0]


@pytest.mark.parametrize("stale", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("action", [DISCRETE, CONTINUOUS], ids=["discrete", "continuous"])
def test_the_rank_count_does_not_change_the_update(stale: bool, action: ActionSpec) -> None:
    # 1, 2 and 4 ranks train the same update of the same global batch: same minibatches, advantages normalised over
    # the global minibatch, losses weighted by each rank's share. What differs is float summation order (sums over
    # ranks instead of one tensor's mean), a few ulps per step that 16 Adam steps carry on: hence 1e-5, not 0.
    params_1, stats_1 = _data_parallel(1, stale, action)
    for world_size in (2, 4):
        params, stats = _data_parallel(world_size, stale, action)
        for a, b in zip(params, params_1, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert stats.keys() == stats_1.keys()
        for key, value in stats.items():
            assert value == pytest.approx(stats_1[key], rel=1e-4, abs=1e-6), key


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


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize(
    "alg",
    [
        PARAMS,
        PPOConfig(
            update_epochs=4,
            num_minibatches=4,
            ent_coef=0.0,
            off_policy_correction="truncated_is",
            behaviour_weight_cap=2.0,
        ),
    ],
    ids=["decoupled", "truncated_is"],
)
def test_proximal_equal_to_behaviour_is_plain_ppo_bit_for_bit(alg: PPOConfig) -> None:
    # K = 0: the actor's weights at the start of the update are the ones that sampled the batch, so
    # proximal_logprobs recomputes "logprobs" exactly, every weight is 1, and the update is today's, to the last bit.
    results = []
    for with_proximal in (False, True):
        model, optimizer, batch = _setup()
        if with_proximal:
            batch["prox_logprobs"] = proximal_logprobs(model, batch["obs"], batch["actions"])
            assert torch.equal(batch["prox_logprobs"], batch["logprobs"]) and not batch["prox_logprobs"].requires_grad
        stats = ppo_update(model, optimizer, batch, alg, torch.Generator().manual_seed(0))
        results.append((stats, _flat(model)))
    (stats, params), (stats_prox, params_prox) = results
    assert torch.equal(params, params_prox)
    assert stats == stats_prox and stats["train/behaviour_weight"] == 1.0


def test_stale_rollouts_are_clipped_against_the_proximal_policy_and_weighted() -> None:
    # The batch was sampled by an older policy (behaviour); the actor has moved on since (proximal). One step on the
    # whole batch: the ratio against the proximal policy is exactly 1, so nothing is clipped and there is no KL, and
    # the loss is -mean(w * A) over the normalised advantages, with w = π_prox / π_behav.
    model, _, batch = _setup()
    behaviour_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.actor.parameters():  # the actor's later weights
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
        batch["logprobs"], _, _ = behaviour_model.evaluate(batch["obs"], batch["actions"])
    batch["prox_logprobs"] = proximal_logprobs(model, batch["obs"], batch["actions"])
    advantages = batch["advantages"]
    normalised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    one_step = {"update_epochs": 1, "num_minibatches": 1, "ent_coef": 0.0}
    for correction, cap in (("decoupled", None), ("decoupled", 1.5), ("truncated_is", 1.5)):
        alg = PPOConfig(**one_step, off_policy_correction=correction, behaviour_weight_cap=cap)
        weight = behaviour_weight(batch["prox_logprobs"], batch["logprobs"], correction, cap)
        trained = copy.deepcopy(model)
        stats = ppo_update(
            trained, torch.optim.Adam(trained.parameters()), batch, alg, torch.Generator().manual_seed(0)
        )
        assert stats["train/clip_frac"] == 0.0 and abs(stats["train/kl"]) < 1e-6
        assert stats["train/behaviour_weight"] == pytest.approx(weight.mean().item(), rel=1e-6)
        assert stats["train/policy_loss"] == pytest.approx(-(weight * normalised).mean().item(), abs=1e-6)
    assert not torch.equal(batch["prox_logprobs"], batch["logprobs"])
    # The caps engage on this batch: some weights above 1.5 are dropped (decoupled) or clamped (truncated_is).
    weight = behaviour_weight(batch["prox_logprobs"], batch["logprobs"], "decoupled", None)
    assert (weight > 1.5).any() and (weight < 1.0).any()
    # Without the proximal log-probs, the same batch would be clipped against the behaviour policy.
    stats = ppo_update(
        model,
        torch.optim.Adam(model.parameters()),
        {k: v for k, v in batch.items() if k != "prox_logprobs"},
        PPOConfig(**one_step),
        torch.Generator().manual_seed(0),
    )
    assert stats["train/clip_frac"] > 0 and stats["train/behaviour_weight"] == 1.0
    with pytest.raises(ValueError, match="prox_logprobs has shape"):
        ppo_update(
            model,
            torch.optim.Adam(model.parameters()),
            batch | {"prox_logprobs": batch["logprobs"][:-1]},
            PARAMS,
            torch.Generator(),
        )


def test_off_policy_correction_is_checked_in_the_algorithm_section() -> None:
    assert (PARAMS.off_policy_correction, PARAMS.behaviour_weight_cap) == ("decoupled", None)  # AReaL's, uncapped
    PPOConfig(off_policy_correction="truncated_is", behaviour_weight_cap=2.0)
    PPOConfig(behaviour_weight_cap=1.0)
    with pytest.raises(
        ConfigError, match=r"algorithm.off_policy_correction = 'vtrace' is invalid: valid: decoupled, truncated_is"
    ):
        PPOConfig(off_policy_correction="vtrace")
    with pytest.raises(ConfigError, match=r"algorithm.behaviour_weight_cap = None is invalid: .*truncated_is"):
        PPOConfig(off_policy_correction="truncated_is")
    with pytest.raises(ConfigError, match=r"algorithm.behaviour_weight_cap = 0.5 is invalid: null or at least 1"):
        PPOConfig(behaviour_weight_cap=0.5)
