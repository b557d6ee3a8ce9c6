"""llm_update on a real tiny LM: GRPO learns from rewards, the KL and clipping stats start at 0, the critic fits the
returns, data parallelism changes nothing, behaviour log-probs of an older policy are corrected for, and
compute_advantages dispatches per algorithm. The update reads the `algorithm` config section
(ReasoningAlgorithmConfig) as it is."""

from __future__ import annotations

import copy
import functools
from dataclasses import replace

import pytest
import torch

from rlplace.core.data_parallel import Shard
from rlplace.core.errors import ConfigError
from rlplace.core.off_policy import behaviour_weight
from rlplace.core.strategies.replica import Replica
from rlplace.reasoning.advantages import grpo_advantages, masked_mean, reinforce_pp_advantages
from rlplace.reasoning.batch import SequenceBatch, response_logprobs, scoring_passes
from rlplace.reasoning.config import ReasoningAlgorithmConfig
from rlplace.reasoning.losses import kl_divergence
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm, load_causal_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.models.value_model import ValueModel
from rlplace.reasoning.tasks.prompts import Problem
from rlplace.reasoning.update import compute_advantages, llm_update, reward_kl
from rlplace.reasoning.workers.actor import mismatch_kl
from tests.data_parallel import ThreadRanks

GROUP = 4
PROMPTS = ["1+2=", "10+20="]
RESPONSES = ["3", "41", "5", "62", "30", "1", "70", "8"]
"""Rows of one prompt are adjacent; within a group no two responses share a first token, so each can move alone.
Each group holds 10 tokens (EOS included), which makes per-rank token means average to the full batch's."""
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def algorithm(name: str, **fields: object) -> ReasoningAlgorithmConfig:
    """The `algorithm` section with the settings these tests were written for (one plain step, no entropy bonus,
    no KL, gamma 1, grad norm clipped at 1), changed by `fields`."""
    settings = {
        "group_size": GROUP,
        "gamma": 1.0,
        "gae_lambda": 0.95,
        "update_epochs": 1,
        "num_minibatches": 1,
        "ent_coef": 0.0,
        "max_grad_norm": 1.0,
    }
    return ReasoningAlgorithmConfig(name=name, **(settings | fields))


GRPO = algorithm("grpo", update_epochs=2, num_minibatches=2)
BUDGET = 8
"""rollout.max_new_tokens of these batches: more than their longest response."""
DR_GRPO = replace(GRPO, norm_adv_by_std=False, loss_agg="seq_mean_token_sum_norm")
GSPO_DR = replace(DR_GRPO, importance_ratio="sequence", clip_ratio_low=0.01, clip_ratio_high=0.01)
"""GSPO's sequence ratio with Dr. GRPO's advantage and constant-budget loss: both forms in one update. The clip
range is wider than GSPO's 3e-4, so that some of these updates' sequence ratios are clipped and some are not."""
RLOO_DUAL_CLIP = algorithm("rloo", update_epochs=2, num_minibatches=2, clip_ratio_c=1.02, loss_agg="seq_mean_token_sum")
"""The dual clip's bound close to 1, so that it engages on some tokens of these updates."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), TinyLMShape(num_layers=1, hidden_size=64))


def _batch(folder, policy, groups: slice = slice(None)) -> SequenceBatch:
    """The prompts of `groups`, each answered GROUP times, with rewards and the policy's own log-probs as old."""
    prompts = [p for p in PROMPTS[groups] for _ in range(GROUP)]
    rows = slice(groups.start * GROUP if groups.start else 0, groups.stop * GROUP if groups.stop else None)
    tokenizer = load_tokenizer(folder)
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    ids = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in RESPONSES[rows]]
    width = max(len(r) for r in ids)
    responses = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, tokens in enumerate(ids):
        responses[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    batch = SequenceBatch(
        0,
        encoded["input_ids"],
        encoded["attention_mask"],
        responses,
        mask,
        [Problem(p, r) for p, r in zip(prompts, RESPONSES[rows], strict=True)],  # the responses as answers
        torch.tensor(REWARDS[rows]),
    )
    batch.old_logprobs = response_logprobs(policy, batch)
    return batch


def _sequence_logprobs(policy, batch: SequenceBatch) -> torch.Tensor:
    return (response_logprobs(policy, batch) * batch.response_mask).sum(-1)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_grpo_raises_rewarded_responses_and_lowers_the_rest(folder):
    policy = load_causal_lm(folder)
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    batch = _batch(folder, policy)
    before = _sequence_logprobs(policy, batch)
    for _ in range(3):  # three training steps, each on fresh rollout-time log-probs
        batch.old_logprobs = response_logprobs(policy, batch)
        advantages, returns = compute_advantages(batch, GRPO)
        stats = llm_update(policy, optimizer, batch, advantages, GRPO, generator)
    assert returns is None
    change = _sequence_logprobs(policy, batch) - before
    rewarded = torch.tensor(REWARDS) > 0
    assert (change[rewarded] > 0.05).all() and (change[~rewarded] < -0.05).all(), change
    expected = {"policy_loss", "entropy", "kl", "clip_frac", "approx_kl", "behaviour_weight", "grad_norm", "lr"}
    assert set(stats) == {f"train/{key}" for key in expected}
    assert stats["train/lr"] == 3e-3 and stats["train/grad_norm"] > 0 and stats["train/entropy"] > 0
    assert stats["train/behaviour_weight"] == 1.0  # no behaviour log-probs: on-policy, w = 1
    assert policy.training is False  # load_causal_lm's eval mode is restored after the update


def test_the_update_scores_responses_at_the_temperature_they_were_sampled_at(folder):
    """At rollout.temperature T the rollout samples from softmax(logits / T): the log-probs, the PPO ratio and the
    entropy are that policy's, so that old log-probs scored at T start the update at ratio 1 and the entropy is the
    sampling distribution's; scored at 1 instead, the first step is already off-policy."""
    policy = load_causal_lm(folder)
    batch = _batch(folder, policy)
    width = batch.prompts.shape[1]
    logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.detach()
    cooled = torch.log_softmax(logits[:, width - 1 : -1] / 0.5, dim=-1).gather(-1, batch.responses[..., None])[..., 0]
    mask = batch.response_mask.bool()
    assert torch.allclose(response_logprobs(policy, batch, 0.5)[mask], cooled[mask], atol=1e-5)
    assert not torch.allclose(response_logprobs(policy, batch)[mask], cooled[mask], atol=1e-2)
    advantages, _ = compute_advantages(batch, GRPO)
    one_step = replace(GRPO, update_epochs=1, num_minibatches=1)
    approx_kl = {}
    for scored_at in (0.5, 1.0):
        batch.old_logprobs = response_logprobs(policy, batch, scored_at)
        copy = load_causal_lm(folder)
        optimizer = torch.optim.Adam(copy.parameters(), lr=1e-2)
        stats = llm_update(copy, optimizer, batch, advantages, one_step, torch.Generator(), temperature=0.5)
        approx_kl[scored_at] = abs(stats["train/approx_kl"])
    assert approx_kl[0.5] < 1e-6 < 1e-3 < approx_kl[1.0]


def test_scoring_in_passes_of_a_token_budget_gives_the_same_logprobs(folder):
    """inference.max_tokens_per_micro_batch: rows shortest first, each pass trimmed to the columns its rows use."""
    policy = load_causal_lm(folder)
    batch = _batch(folder, policy)
    passes = scoring_passes(batch, 3 * batch.input_ids.shape[1])
    assert len(passes) > 2 and any(p.left > 0 or p.length < batch.responses.shape[1] for p in passes)
    assert sorted(torch.cat([p.rows for p in passes]).tolist()) == list(range(batch.num_rows))
    mask = batch.response_mask.bool()
    whole = response_logprobs(policy, batch)
    torch.testing.assert_close(response_logprobs(policy, batch, passes=passes)[mask], whole[mask], rtol=0, atol=1e-5)


def test_first_minibatch_on_its_own_logprobs_is_unclipped(folder):
    policy = load_causal_lm(folder)
    batch = _batch(folder, policy)  # old_logprobs = the current policy's: every ratio is exactly 1
    advantages, _ = compute_advantages(batch, GRPO)
    one_step = replace(GRPO, update_epochs=1, num_minibatches=1)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    stats = llm_update(policy, optimizer, batch, advantages, one_step, torch.Generator().manual_seed(0))
    assert stats["train/clip_frac"] == 0.0
    assert abs(stats["train/approx_kl"]) < 1e-6
    assert stats["train/kl"] == 0.0  # no reference
    # At ratio 1 the surrogate is -mean(A) over tokens; GRPO's advantages are not zero-mean over tokens when
    # response lengths differ, so compare with the number rather than 0.
    expected = -masked_mean(advantages, batch.response_mask).item()
    assert stats["train/policy_loss"] == pytest.approx(expected, abs=1e-5)
    # Many epochs on the same rollout push ratios out of [0.8, 1.2]: clipping engages.
    many = replace(GRPO, update_epochs=8, num_minibatches=1)
    stats = llm_update(policy, optimizer, batch, advantages, many, torch.Generator().manual_seed(0))
    assert stats["train/clip_frac"] > 0 and stats["train/approx_kl"] > 1e-4


def test_kl_loss_starts_at_zero_and_pulls_towards_the_reference(folder, tmp_path):
    policy = load_causal_lm(folder)
    batch = _batch(folder, policy)
    batch.ref_logprobs = batch.old_logprobs.clone()
    params = replace(GRPO, update_epochs=1, num_minibatches=1, kl_coef=0.5)
    advantages, _ = compute_advantages(batch, params)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    stats = llm_update(policy, optimizer, batch, advantages, params, torch.Generator().manual_seed(0))
    assert abs(stats["train/kl"]) < 1e-6

    # Equal rewards leave no policy-gradient signal (GRPO advantages are 0): only the KL loss moves the policy, and
    # it moves it towards a different reference model.
    reference = load_causal_lm(build_tiny_lm(tmp_path / "ref", TinyLMShape(num_layers=1, hidden_size=64), seed=1))
    batch.ref_logprobs = response_logprobs(reference, batch)
    batch.rewards = torch.ones(len(REWARDS))
    advantages, _ = compute_advantages(batch, params)
    assert advantages.abs().max() == 0
    kls = []
    for _ in range(5):
        batch.old_logprobs = response_logprobs(policy, batch)
        kls.append(llm_update(policy, optimizer, batch, advantages, params, torch.Generator())["train/kl"])
    assert kls[0] > 0.1 and kls[-1] < 0.5 * kls[0], kls

    batch.ref_logprobs = None
    with pytest.raises(ValueError, match="ref_logprobs"):
        llm_update(policy, optimizer, batch, advantages, params, torch.Generator())


def test_ppo_critic_fits_the_returns(folder):
    policy, critic = load_causal_lm(folder), ValueModel.from_pretrained(folder)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=5e-3)
    # gamma = lambda = 1: the returns are the Monte Carlo returns (the reward on every token), whatever the values.
    params = algorithm("ppo", gae_lambda=1.0, update_epochs=2, num_minibatches=2)
    batch = _batch(folder, policy)
    mask = batch.response_mask

    def critic_loss(returns: torch.Tensor) -> float:
        with torch.no_grad():
            return 0.5 * masked_mean((critic.response_values(batch) - returns) ** 2, mask).item()

    losses, generator = [], torch.Generator().manual_seed(0)
    for _ in range(10):
        batch.old_logprobs = response_logprobs(policy, batch)
        with torch.no_grad():
            old_values = critic.response_values(batch)
        advantages, returns = compute_advantages(batch, params, old_values)
        losses.append(critic_loss(returns))
        stats = llm_update(
            policy,
            optimizer,
            batch,
            advantages,
            params,
            generator,
            critic=critic,
            critic_optimizer=critic_optimizer,
            returns=returns,
            old_values=old_values,
        )
    torch.testing.assert_close(returns, torch.tensor(REWARDS)[:, None] * mask)
    losses.append(critic_loss(returns))
    # Fitting the returns row by row (0.133 at the start; the best constant gives 0.105) down to near the floor:
    # the first response token's state is the prompt alone, where the best value is the group's mean reward,
    # costing 0.5 * (4 * 0.25 + 3 * 0.0625 + 0.5625) / 20 tokens = 0.044.
    assert losses[-1] < 0.07 and losses[-1] < 0.5 * losses[0], losses
    assert "train/value_loss" in stats and stats["train/value_loss"] > 0
    # Nothing of the update stays behind it: the gradients of both models are freed.
    assert all(p.grad is None for model in (policy, critic) for p in model.parameters())
    with pytest.raises(ValueError, match="critic"):
        llm_update(policy, optimizer, batch, advantages, params, generator)


class RecordingReplica(Replica):
    """One rank's strategy that records which model each optimizer step reduces."""

    def __init__(self) -> None:
        super().__init__(1, torch.device("cpu"))
        self.seen: list[torch.nn.Module] = []

    def reduce_grads(self, model: torch.nn.Module) -> None:
        self.seen.append(model)


def test_gradients_are_reduced_once_per_step_and_a_one_rank_strategy_changes_nothing(folder):
    policy = load_causal_lm(folder)
    batch = _batch(folder, policy)
    advantages, _ = compute_advantages(batch, GRPO)
    twins = [copy.deepcopy(policy) for _ in range(2)]
    recording = RecordingReplica()
    results = []
    for twin, strategy in zip(twins, (None, recording), strict=True):
        optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2)
        results.append(
            llm_update(twin, optimizer, batch, advantages, GRPO, torch.Generator().manual_seed(1), strategy=strategy)
        )
    assert len(recording.seen) == GRPO.update_epochs * GRPO.num_minibatches
    assert all(m is twins[1] for m in recording.seen)
    assert results[0] == results[1]
    assert torch.equal(_flat(twins[0]), _flat(twins[1]))


GROUPS = {
    "1+2=": (["3", "41", "5", "62"], [1.0, 0.0, 0.0, 0.0]),
    "10+20=": (["30", "1", "70", "8"], [1.0, 1.0, 0.0, 0.0]),
    "3+4=": (["7", "77", "0", "12"], [1.0, 0.0, 1.0, 1.0]),
    "7+7=": (["14", "4", "141", "2"], [0.0, 1.0, 0.0, 0.0]),
}
"""Four prompt groups, one micro-batch each, with responses of unequal lengths: ranks hold unequal token counts."""


def _micro_batches(folder, policy) -> list[SequenceBatch]:
    """One micro-batch per prompt group (index = its position), responses padded to one width as the rollout pads
    them to max_new_tokens, with the policy's log-probs as old."""
    tokenizer = load_tokenizer(folder)
    width = 1 + max(len(r) for responses, _ in GROUPS.values() for r in responses)  # a character a token, and EOS
    parts = []
    for index, (prompt, (responses, rewards)) in enumerate(GROUPS.items()):
        encoded = tokenizer([prompt] * GROUP, padding=True, return_tensors="pt")
        ids = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in responses]
        tokens, mask = torch.zeros(GROUP, width, dtype=torch.long), torch.zeros(GROUP, width, dtype=torch.long)
        for row, response in enumerate(ids):
            tokens[row, : len(response)], mask[row, : len(response)] = torch.tensor(response), 1
        problems = [Problem(prompt, r) for r in responses]  # the responses as answers
        part = SequenceBatch(
            index, encoded["input_ids"], encoded["attention_mask"], tokens, mask, problems, torch.tensor(rewards)
        )
        part.old_logprobs = response_logprobs(policy, part)
        parts.append(part)
    return parts


def _train(
    folder, params, world_size: int, stale: bool, max_tokens: int | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """One update of the four groups' batch on `world_size` ranks (threads), micro-batch m on rank m % world_size as
    the actor routes them; returns rank 0's policy (and critic) weights and its stats, after checking every rank
    ends the same."""
    torch.manual_seed(0)
    policy = load_causal_lm(folder)
    critic = ValueModel.from_pretrained(folder) if params.name == "ppo" else None
    parts = _micro_batches(folder, policy)
    noise = torch.Generator().manual_seed(5)
    for part in parts:  # an older behaviour policy sampled the responses: the update weighs tokens by pi_prox/pi_behav
        part.behaviour = part.old_logprobs + 0.1 * torch.randn(part.old_logprobs.shape, generator=noise)
        if params.kl_coef:  # and the reference model is another one
            part.ref_logprobs = part.old_logprobs + 0.1 * torch.randn(part.old_logprobs.shape, generator=noise)
    ranks = ThreadRanks(world_size)

    def train(rank: int) -> tuple[torch.Tensor, dict[str, float]]:
        mine = [part for part in parts if part.index % world_size == rank]
        batch = SequenceBatch.concat(mine)
        behaviour = SequenceBatch.concat([replace(part, old_logprobs=part.behaviour) for part in mine]).old_logprobs
        shard, sum_over_ranks = None, None
        if world_size > 1:
            index = torch.cat([part.index * GROUP + torch.arange(GROUP) for part in mine])
            shard = Shard(index, len(parts) * GROUP, world_size, functools.partial(ranks.sum, rank), rank)
            sum_over_ranks = shard.sum_over_ranks
        model, value_model = copy.deepcopy(policy), copy.deepcopy(critic)
        critic_args = {}
        old_values = None
        if value_model is not None:
            with torch.no_grad():
                old_values = value_model.response_values(batch)
        advantages, returns = compute_advantages(batch, params, old_values, sum_over_ranks)
        kl_stats = {}
        if params.kl_in_reward:
            kl, responses = reward_kl(batch, params, sum_over_ranks)
            kl_stats = {"reward_kl": kl, "responses": responses}
        if value_model is not None:
            critic_optimizer = torch.optim.SGD(value_model.parameters(), lr=0.1)
            critic_args = dict(critic=value_model, critic_optimizer=critic_optimizer, returns=returns)
            critic_args["old_values"] = old_values

        average = functools.partial(ranks.mean, rank)
        stats = llm_update(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            batch,
            advantages,
            params,
            torch.Generator().manual_seed(3),
            behaviour_logprobs=behaviour if stale else None,
            strategy=Replica(world_size, torch.device("cpu"), average=average) if world_size > 1 else None,
            shard=shard,
            max_tokens_per_micro_batch=max_tokens,
            max_response_tokens=BUDGET,
            **critic_args,
        )
        weights = [_flat(model)] + ([] if value_model is None else [_flat(value_model)])
        return torch.cat(weights), stats | kl_stats

    results = ranks.run(train)
    for weights, stats in results[1:]:
        assert stats == results[0][1]
        assert torch.equal(weights, results[0][0])
    return results[0]


@pytest.mark.parametrize("stale", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    "params",
    [
        replace(GRPO, kl_coef=0.0),
        replace(GRPO, loss_agg="seq_mean_token_mean"),
        algorithm("reinforce_pp", update_epochs=2, num_minibatches=2, kl_coef=0.05, use_kl_loss=False, kl_type="k1"),
        algorithm("ppo", update_epochs=2, num_minibatches=2),
        RLOO_DUAL_CLIP,
        GSPO_DR,
    ],
    ids=["grpo", "grpo_seq_mean", "reinforce_pp_kl_in_reward", "ppo", "rloo_dual_clip", "gspo_dr_grpo"],
)
def test_the_rank_count_does_not_change_the_update(folder, params, stale):
    # 1, 2 and 4 ranks train the update of the same global batch: minibatches drawn over it, losses and stats divided
    # by the global minibatch's token and response counts, REINFORCE++'s and PPO's whitening over the whole batch, the
    # KL in the reward averaged over the whole batch for the adaptive controller (`reward_kl`). The
    # ranks hold unequal token counts (responses of unequal length). What differs is float summation order and the
    # padding of a rank's rows (its prompts and responses padded to its own widths): a few ulps, hence 1e-5.
    weights_1, stats_1 = _train(folder, params, 1, stale)
    for world_size in (2, 4):
        weights, stats = _train(folder, params, world_size, stale)
        torch.testing.assert_close(weights, weights_1, rtol=1e-5, atol=1e-6)
        assert stats.keys() == stats_1.keys()
        for key, value in stats.items():
            assert value == pytest.approx(stats_1[key], rel=1e-4, abs=1e-6), key
    assert not torch.equal(weights_1, _train_start(folder, params))
    assert stats_1.get("train/clip_frac_lower", 1.0) > 0  # where the dual clip is on, it engages


def _train_start(folder, params) -> torch.Tensor:
    """The weights before the update: it must have changed them."""
    torch.manual_seed(0)
    weights = [_flat(load_causal_lm(folder))]
    if params.name == "ppo":
        weights.append(_flat(ValueModel.from_pretrained(folder)))
    return torch.cat(weights)


@pytest.mark.parametrize(
    "params",
    [GRPO, replace(GRPO, off_policy_correction="truncated_is", behaviour_weight_cap=2.0)],
    ids=["decoupled", "truncated_is"],
)
def test_behaviour_equal_to_proximal_is_plain_ppo_bit_for_bit(folder, params):
    # K = 0: the responses were sampled by the weights the update starts from, every weight is exactly 1, and the
    # update is today's to the last bit.
    policy = load_causal_lm(folder)
    batch = _batch(folder, policy)
    advantages, _ = compute_advantages(batch, params)
    results = []
    for behaviour in (None, batch.old_logprobs.clone()):
        twin = copy.deepcopy(policy)
        optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2)
        stats = llm_update(
            twin, optimizer, batch, advantages, params, torch.Generator().manual_seed(0), behaviour_logprobs=behaviour
        )
        results.append((stats, _flat(twin)))
    (stats, params_plain), (stats_weighted, params_weighted) = results
    assert torch.equal(params_plain, params_weighted)
    assert stats == stats_weighted and stats["train/behaviour_weight"] == 1.0


def test_stale_responses_are_clipped_against_the_proximal_policy_and_weighted(folder, tmp_path):
    # The responses were sampled by another (older) policy, whose log-probs come as behaviour_logprobs; old_logprobs
    # are the current weights' (proximal). One step on the whole batch: the ratio against the proximal policy is
    # exactly 1, so nothing is clipped, and the loss is the token mean of -w * A with w = π_prox / π_behav.
    policy = load_causal_lm(folder)
    batch = _batch(folder, policy)
    older = load_causal_lm(build_tiny_lm(tmp_path / "older", TinyLMShape(num_layers=1, hidden_size=64), seed=1))
    behaviour = response_logprobs(older, batch)
    advantages, _ = compute_advantages(batch, GRPO)
    mask = batch.response_mask
    one_step = replace(GRPO, update_epochs=1, num_minibatches=1)
    for correction, cap in (("decoupled", None), ("decoupled", 1.2), ("truncated_is", 1.2)):
        params = replace(one_step, off_policy_correction=correction, behaviour_weight_cap=cap)
        weights = behaviour_weight(batch.old_logprobs, behaviour, correction, cap)
        twin = copy.deepcopy(policy)
        optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2)
        stats = llm_update(
            twin, optimizer, batch, advantages, params, torch.Generator().manual_seed(0), behaviour_logprobs=behaviour
        )
        assert stats["train/clip_frac"] == 0.0 and abs(stats["train/approx_kl"]) < 1e-6
        assert stats["train/behaviour_weight"] == pytest.approx(masked_mean(weights, mask).item(), rel=1e-5)
        assert stats["train/policy_loss"] == pytest.approx(-masked_mean(weights * advantages, mask).item(), abs=1e-5)
    # The weights differ from 1 on both sides, and the caps engage on this batch.
    weights = behaviour_weight(batch.old_logprobs, behaviour, "decoupled", None)[mask.bool()]
    assert (weights > 1.2).any() and (weights < 1.0).any()
    with pytest.raises(ValueError, match="behaviour_logprobs has shape"):
        llm_update(policy, optimizer, batch, advantages, one_step, torch.Generator(), behaviour_logprobs=behaviour[1:])
    with pytest.raises(ValueError, match="seq_mean_token_sum_norm divides by max_response_tokens"):
        llm_update(policy, optimizer, batch, advantages, DR_GRPO, torch.Generator())


def test_compute_advantages_per_algorithm(folder, tmp_path):
    policy = load_causal_lm(folder)
    batch = _batch(folder, policy)
    reference = load_causal_lm(build_tiny_lm(tmp_path / "ref", TinyLMShape(num_layers=1, hidden_size=64), seed=1))
    batch.ref_logprobs = response_logprobs(reference, batch)
    mask = batch.response_mask.bool()
    values = torch.randn(mask.shape)
    shape = tuple(mask.shape)

    grpo, no_returns = compute_advantages(batch, GRPO)
    assert no_returns is None
    torch.testing.assert_close(grpo, grpo_advantages(batch.rewards, batch.response_mask, GROUP))

    kl_in_reward = algorithm("reinforce_pp", kl_coef=0.1, use_kl_loss=False)
    rpp, _ = compute_advantages(batch, kl_in_reward)
    rpp_kl_loss, _ = compute_advantages(batch, replace(kl_in_reward, use_kl_loss=True))
    assert not torch.allclose(rpp, rpp_kl_loss)  # the penalty is in the rewards only when use_kl_loss is off
    torch.testing.assert_close(rpp_kl_loss, reinforce_pp_advantages(batch.rewards, mask, None, 0.1, GROUP))
    plain, _ = compute_advantages(batch, algorithm("reinforce", kl_coef=0.1, use_kl_loss=False))
    kl = kl_divergence(batch.old_logprobs, batch.ref_logprobs, "low_var_kl")
    torch.testing.assert_close(plain, reinforce_pp_advantages(batch.rewards, mask, kl, 0.1))
    assert not torch.allclose(plain, rpp)  # without the group baseline
    # What the adaptive controller reads: the responses' mean of their token-mean KL (k1: old - ref log-probs).
    kl, responses = reward_kl(batch, replace(kl_in_reward, kl_type="k1"), None)
    per_response = [(batch.old_logprobs - batch.ref_logprobs)[row][mask[row]].double().mean() for row in range(8)]
    assert responses == 8 and kl == pytest.approx(float(sum(per_response)) / 8, rel=1e-12)

    ppo = algorithm("ppo", gae_lambda=0.9)
    advantages, returns = compute_advantages(batch, ppo, values)
    for tensor in (grpo, rpp, advantages, returns):
        assert tuple(tensor.shape) == shape and tensor.dtype == torch.float32
        assert tensor[~mask].abs().max() == 0
    # Advantages whitened over the valid tokens; returns in reward units: on the last token, reward - (nothing).
    assert masked_mean(advantages, mask).abs() < 1e-5
    last = mask.sum(-1) - 1
    torch.testing.assert_close(returns[torch.arange(len(REWARDS)), last], batch.rewards)
    with pytest.raises(ValueError, match="values"):
        compute_advantages(batch, ppo)


def test_the_update_reads_the_algorithm_section_as_it_is():
    # What LLMUpdateParams.from_config derived is now a property of the section: the critic's value clip follows
    # clip_vloss, the KL goes into the rewards or the loss; and a name the update has no estimator for is refused.
    alg = ReasoningAlgorithmConfig(name="reinforce_pp", kl_coef=0.01, use_kl_loss=False, clip_vloss=False)
    assert (alg.name, alg.kl_coef, alg.use_kl_loss, alg.value_clip) == ("reinforce_pp", 0.01, False, None)
    assert alg.kl_in_reward and not alg.kl_in_loss
    assert ReasoningAlgorithmConfig(name="ppo").value_clip == alg.clip_ratio_low
    assert not replace(alg, name="grpo").kl_in_reward  # GRPO's KL is never in the rewards
    with pytest.raises(ConfigError, match="algorithm.name = 'sac' is invalid: valid: grpo, ppo, reinforce_pp, rloo"):
        ReasoningAlgorithmConfig(name="sac")
    with pytest.raises(ConfigError, match="algorithm.group_size = 1 is invalid"):
        ReasoningAlgorithmConfig(name="grpo", group_size=1)
    # The off-policy correction of asynchronous training: AReaL's decoupled PPO by default, uncapped.
    assert (alg.off_policy_correction, alg.behaviour_weight_cap) == ("decoupled", None)
    with pytest.raises(ConfigError, match="algorithm.off_policy_correction = 'vtrace' is invalid: valid: decoupled"):
        ReasoningAlgorithmConfig(name="grpo", off_policy_correction="vtrace")
    with pytest.raises(ConfigError, match="algorithm.behaviour_weight_cap = None is invalid: .*truncated_is"):
        ReasoningAlgorithmConfig(name="grpo", off_policy_correction="truncated_is")
    with pytest.raises(ConfigError, match="algorithm.behaviour_weight_cap = 0.9 is invalid: null or at least 1"):
        ReasoningAlgorithmConfig(name="grpo", off_policy_correction="truncated_is", behaviour_weight_cap=0.9)


@pytest.mark.parametrize(
    "params",
    [
        GRPO,
        replace(GRPO, loss_agg="seq_mean_token_mean"),
        algorithm("ppo", update_epochs=2, num_minibatches=2),
        GSPO_DR,
    ],
    ids=["grpo", "grpo_seq_mean", "ppo", "gspo_dr_grpo"],
)
def test_token_budget_micro_batches_train_the_same_update(folder, params):
    # Rows are about 11 tokens (prompt and response): a budget of 12 makes a pass per row, 24 two rows a pass, with the
    # columns that are padding in all of a pass's rows dropped. Gradients accumulate over the passes, each pass's
    # loss its part of the minibatch's, so only float summation order differs: 1e-5, as between rank counts.
    weights, stats = _train(folder, params, 2, stale=True)
    for budget in (12, 24):
        budget_weights, budget_stats = _train(folder, params, 2, stale=True, max_tokens=budget)
        torch.testing.assert_close(budget_weights, weights, rtol=1e-5, atol=1e-6)
        assert budget_stats == pytest.approx(stats, rel=1e-5, abs=1e-6)


def test_a_tools_tokens_are_read_as_context_and_never_trained_on(folder):
    """A response made in turns (`rollout.multi_turn`): the second token of each 3-token response is the tool's. Its
    log-probs and advantages change nothing, in token-budget passes cut by the columns the responses span; the update
    differs from the one that trains on that token."""
    max_tokens = 12  # a pass per row

    def update(batch: SequenceBatch, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        policy = load_causal_lm(folder)
        optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
        advantages, _ = compute_advantages(batch, GRPO)
        if noise is not None:
            advantages = advantages + noise
        generator = torch.Generator().manual_seed(0)
        stats = llm_update(policy, optimizer, batch, advantages, GRPO, generator, max_tokens_per_micro_batch=max_tokens)
        return _flat(policy), stats

    batch = _batch(folder, load_causal_lm(folder))
    trained_on_all = update(batch)
    tool = torch.zeros_like(batch.response_mask)
    tool[batch.response_mask.sum(-1) == 3, 1] = 1
    batch.tool_mask = tool
    weights, stats = update(batch)
    noise = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(1)) * 5 * tool
    batch.old_logprobs = batch.old_logprobs + noise
    noisy_weights, noisy_stats = update(batch, noise)
    torch.testing.assert_close(noisy_weights, weights)
    assert noisy_stats == pytest.approx(stats)
    assert not torch.allclose(weights, trained_on_all[0])


def test_the_mismatch_kl_is_each_responses_mean_over_the_models_tokens() -> None:
    """`rollout/mismatch_kl`: k3 of the engine's log-probs against the inference group's, a mean per response over the
    tokens the model wrote (a tool's left out), summed over responses; in float64, so that differences in float32's
    last bits still give a KL of about half their square, never a negative one."""
    batch = SequenceBatch(
        0,
        torch.ones(2, 1, dtype=torch.long),
        torch.ones(2, 1, dtype=torch.long),
        torch.ones(2, 3, dtype=torch.long),
        torch.tensor([[1, 1, 0], [1, 1, 1]]),
        [Problem("", "")] * 2,
        tool_mask=torch.tensor([[0, 0, 0], [0, 1, 0]]),
    )
    batch.old_logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.25, -3.0]])
    batch.rollout_logprobs = batch.old_logprobs + torch.tensor([[1e-4, 1e-4, 5.0], [2e-4, 5.0, 2e-4]])
    assert mismatch_kl(batch) == pytest.approx(0.5 * 1e-8 + 0.5 * 4e-8, rel=1e-3)
