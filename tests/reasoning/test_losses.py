"""Token-level losses with the arithmetic worked by hand (torchtune's style)."""

from __future__ import annotations

import math

import pytest
import torch

from rlplace.core.off_policy import behaviour_weight
from rlplace.reasoning.losses import (
    Counts,
    aggregate_loss,
    entropy_from_logits,
    kl_divergence,
    logprobs_from_logits,
    token_policy_loss,
    token_value_loss,
)

# Two responses, T = 3; row 1 has 2 valid tokens. Padding holds junk (ratio 3, advantage 100) that must be ignored.
RATIO = torch.tensor([[1.5, 0.5, 1.1], [0.7, 1.0, 3.0]])
ADVANTAGES = torch.tensor([[1.0, 1.0, -1.0], [-1.0, 2.0, 100.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD_LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.2]])


def test_policy_loss_hand_computed() -> None:
    # Per-token loss max(-A * r, -A * clip(r, 0.8, 1.2)):
    #   row 0: max(-1.5, -1.2) = -1.2 (clipped, active); max(-0.5, -0.8) = -0.5 (a worse ratio is never clipped
    #          away); max(1.1, 1.1) = 1.1
    #   row 1: A = -1, r = 0.7: max(0.7, 0.8) = 0.8 (clipped, active); r = 1, A = 2: -2
    #   token_mean = (-1.2 - 0.5 + 1.1 + 0.8 - 2) / 5 = -0.36
    #   seq_mean_token_mean = mean((-1.2 - 0.5 + 1.1) / 3, (0.8 - 2) / 2) = mean(-0.2, -0.6) = -0.4
    #   clip_frac = 2 / 5; approx_kl = mean over the 5 valid tokens of (r - 1) - log r
    logprobs = OLD_LOGPROBS + RATIO.log()
    loss, stats = token_policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2)
    assert loss.item() == pytest.approx(-0.36, abs=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(0.4)
    expected_kl = sum((r - 1) - math.log(r) for r in [1.5, 0.5, 1.1, 0.7, 1.0]) / 5
    assert stats["approx_kl"].item() == pytest.approx(expected_kl, abs=1e-6)
    loss, _ = token_policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx(-0.4, abs=1e-6)


def test_policy_loss_gradient_flows_only_where_not_clipped() -> None:
    # d loss / d logprob = -A * r / 5 (token_mean over 5 valid tokens) where the unclipped term wins, else 0:
    #   row 0: clipped -> 0; -1 * 0.5 / 5 = -0.1; +1 * 1.1 / 5 = 0.22
    #   row 1: clipped -> 0; -2 * 1 / 5 = -0.4; padding -> 0
    logprobs = (OLD_LOGPROBS + RATIO.log()).requires_grad_()
    loss, _ = token_policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.1, 0.22], [0.0, -0.4, 0.0]]))


def test_policy_loss_clips_at_separate_low_and_high_bounds() -> None:
    # clip_ratio_low 0.2, clip_ratio_high 0.28 (DAPO), A = [1, 1, -1, -1]:
    #   r = 1.25, A = 1: inside [0.8, 1.28]  -> -1.25, gradient flows
    #   r = 1.30, A = 1: above 1.28          -> -1.28, clipped
    #   r = 0.75, A = -1: below 0.8          -> max(0.75, 0.8) = 0.8, clipped
    #   r = 0.85, A = -1: inside             -> 0.85
    #   loss = (-1.25 - 1.28 + 0.8 + 0.85) / 4 = -0.22; clip_frac = 2 / 4
    logprobs = torch.tensor([[1.25, 1.3, 0.75, 0.85]]).log().requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, stats = token_policy_loss(logprobs, torch.zeros(1, 4), advantages, torch.ones(1, 4), 0.2, 0.28)
    assert loss.item() == pytest.approx(-0.22, abs=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    loss.backward()  # -A * r / 4 where unclipped: [-1.25 / 4, 0, 0, 0.85 / 4]
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.3125, 0.0, 0.0, 0.2125]]))


def test_policy_loss_ignores_padding() -> None:
    logprobs = OLD_LOGPROBS + RATIO.log()
    junk = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    for agg in ("token_mean", "seq_mean_token_mean"):
        loss, stats = token_policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2, agg)
        loss_junk, stats_junk = token_policy_loss(logprobs + junk, OLD_LOGPROBS, ADVANTAGES - junk, MASK, 0.2, 0.2, agg)
        assert loss_junk.item() == pytest.approx(loss.item())
        torch.testing.assert_close(stats_junk, stats)


def test_policy_loss_unknown_agg() -> None:
    with pytest.raises(ValueError, match="'seq_sum'.*token_mean, seq_mean_token_mean, seq_mean_token_sum"):
        token_policy_loss(OLD_LOGPROBS, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2, agg="seq_sum")
    with pytest.raises(ValueError, match="'tokens'.*token, sequence"):
        token_policy_loss(OLD_LOGPROBS, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2, importance_ratio="tokens")


def test_each_loss_aggregation_hand_computed() -> None:
    # Row 0 has 3 valid tokens [1, 2, 3], row 1 two [4, 6], the padding 100; a third row has none (it counts nowhere).
    #   token_mean = 16 / 5; seq_mean_token_mean = mean(2, 5) = 3.5; seq_mean_token_sum = mean(6, 10) = 8;
    #   seq_mean_token_sum_norm with a budget of 4 tokens = (6 + 10) / (2 x 4) = 2, whatever the padded width.
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 6.0, 100.0], [100.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    expected = {"token_mean": 3.2, "seq_mean_token_mean": 3.5, "seq_mean_token_sum": 8.0}
    for agg, value in expected.items():
        assert aggregate_loss(losses, mask, agg).item() == pytest.approx(value), agg
    counts = Counts(tokens=torch.tensor(5.0), responses=torch.tensor(2.0), budget=4)
    for agg, value in (expected | {"seq_mean_token_sum_norm": 2.0}).items():
        assert aggregate_loss(losses, mask, agg, counts).item() == pytest.approx(value), agg
    wider = torch.cat([losses, torch.full((3, 2), 100.0)], dim=1)
    assert aggregate_loss(
        wider, torch.cat([mask, torch.zeros(3, 2, dtype=mask.dtype)], 1), "seq_mean_token_sum_norm", counts
    ).item() == pytest.approx(2.0)
    # With counts of a global minibatch twice this one, this rank's part is half.
    halves = Counts(tokens=torch.tensor(10.0), responses=torch.tensor(4.0), budget=4)
    assert aggregate_loss(losses, mask, "seq_mean_token_sum_norm", halves).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="budget"):
        aggregate_loss(losses, mask, "seq_mean_token_sum_norm")


def test_a_sequence_ratio_is_the_geometric_mean_of_its_tokens_and_clipped_as_a_whole() -> None:
    # GSPO: row 0's token log-ratios log [1.5, 0.5, 1.1] give s_0 = (1.5 x 0.5 x 1.1) ^ (1/3) = 0.9378; row 1's
    # log [0.7, 1.0] give s_1 = 0.7 ^ (1/2) = 0.8367; the padding's junk ratio 3 is not read. With bounds [0.9, 1.1]:
    #   row 0, s_0 inside: tokens lose -A x s_0: [-0.9378, -0.9378, 0.9378]
    #   row 1, s_1 below 0.9: A = -1 takes max(0.8367, 0.9) = 0.9 (clipped); A = 2 takes max(-1.6733, -1.8) = -1.6733
    #   seq_mean_token_mean = mean((-0.9378 - 0.9378 + 0.9378) / 3, (0.9 - 1.6733) / 2)
    s0, s1 = (1.5 * 0.5 * 1.1) ** (1 / 3), 0.7**0.5
    logprobs = OLD_LOGPROBS + RATIO.log()
    loss, stats = token_policy_loss(
        logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, 0.1, 0.1, "seq_mean_token_mean", importance_ratio="sequence"
    )
    assert loss.item() == pytest.approx(((-s0) / 3 + (0.9 - 2 * s1) / 2) / 2, abs=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(1 / 5)  # row 1's first token only
    # approx_kl stays the tokens' own, as with the token ratio.
    _, token_stats = token_policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, 0.1, 0.1)
    assert stats["approx_kl"].item() == pytest.approx(token_stats["approx_kl"].item())


def test_the_sequence_ratio_has_gspo_s_sequence_level_gradient() -> None:
    # GSPO's objective per response, -min(s_i A_i, clip(s_i) A_i) with s_i = exp(mean_t(log π_t - log π_old_t)),
    # averaged over responses; one advantage per response (GRPO's). Its gradient and the token form's agree.
    torch.manual_seed(0)
    old = -torch.rand(3, 4) * 2
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    advantages = torch.tensor([[1.5], [-0.5], [0.7]]).expand(3, 4)
    start = old + torch.tensor([[0.2, -0.1, 0.05, 0.0], [0.3, 0.4, 9.0, 9.0], [-0.2, 0.1, 0.0, 9.0]])
    token_form = start.clone().requires_grad_()
    loss, _ = token_policy_loss(
        token_form, old, advantages, mask, 0.2, 0.2, "seq_mean_token_mean", importance_ratio="sequence"
    )
    loss.backward()
    sequence_form = start.clone().requires_grad_()
    valid = mask.bool()
    mean_log_ratio = torch.where(valid, sequence_form - old, 0.0).sum(-1) / valid.sum(-1)
    s = mean_log_ratio.exp()
    a = advantages[:, 0]
    reference = torch.max(-a * s, -a * s.clamp(0.8, 1.2)).mean()
    reference.backward()
    assert loss.item() == pytest.approx(reference.item(), abs=1e-6)
    torch.testing.assert_close(token_form.grad, sequence_form.grad)
    assert token_form.grad[~valid].abs().max() == 0


def test_dual_clip_bounds_the_loss_of_negative_advantages() -> None:
    # clip_ratio_c = 3: a token with A < 0 loses at most 3 |A|. Ratios [5, 2, 5], A = [-1, -1, 1]:
    #   r = 5, A = -1: max(5, 1.2) = 5, bounded to 3 (no gradient: the bound is constant)
    #   r = 2, A = -1: max(2, 1.2) = 2 < 3, unchanged
    #   r = 5, A = 1: max(-5, -1.2) = -1.2, a positive advantage is never bounded
    #   token_mean = (3 + 2 - 1.2) / 3; clip_frac_lower = 1 / 3
    logprobs = torch.tensor([[5.0, 2.0, 5.0]]).log().requires_grad_()
    advantages = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, stats = token_policy_loss(
        logprobs, torch.zeros(1, 3), advantages, torch.ones(1, 3), 0.2, 0.2, clip_ratio_c=3.0
    )
    assert loss.item() == pytest.approx((3 + 2 - 1.2) / 3, abs=1e-6)
    assert stats["clip_frac_lower"].item() == pytest.approx(1 / 3)
    loss.backward()  # only r = 2 passes a gradient: -A * r / 3
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 2 / 3, 0.0]]))
    _, plain = token_policy_loss(logprobs, torch.zeros(1, 3), advantages, torch.ones(1, 3), 0.2, 0.2)
    assert "clip_frac_lower" not in plain


# The tokens above, now off-policy: RATIO is taken against the proximal policy (OLD_LOGPROBS), and the behaviour policy
# that sampled them had π_prox / π_behav = [[2, 0.5, 1], [4, 1, inf]]: its log-prob on the padding is -inf (junk).
BEHAVIOUR = OLD_LOGPROBS - torch.tensor([[2.0, 0.5, 1.0], [4.0, 1.0, 1.0]]).log()
BEHAVIOUR[1, 2] = -math.inf


@pytest.mark.parametrize(
    ("correction", "cap", "weights"),
    [
        ("decoupled", None, [[2.0, 0.5, 1.0], [4.0, 1.0, math.inf]]),
        ("decoupled", 3.0, [[2.0, 0.5, 1.0], [0.0, 1.0, 0.0]]),  # above the cap: dropped (AReaL)
        ("truncated_is", 3.0, [[2.0, 0.5, 1.0], [3.0, 1.0, 3.0]]),  # above the cap: clamped, kept
    ],
)
def test_behaviour_weight_per_correction(correction: str, cap: float | None, weights: list[list[float]]) -> None:
    torch.testing.assert_close(behaviour_weight(OLD_LOGPROBS, BEHAVIOUR, correction, cap), torch.tensor(weights))


def test_behaviour_weight_refuses_a_missing_cap_or_an_unknown_correction() -> None:
    with pytest.raises(ValueError, match="truncated_is needs a cap"):
        behaviour_weight(OLD_LOGPROBS, BEHAVIOUR, "truncated_is", None)
    with pytest.raises(ValueError, match="'vtrace'.*decoupled, truncated_is"):
        behaviour_weight(OLD_LOGPROBS, BEHAVIOUR, "vtrace", None)


@pytest.mark.parametrize(
    ("correction", "cap", "token_mean", "seq_mean", "mean_weight"),
    [
        # Unweighted per-token losses (test_policy_loss_hand_computed): [[-1.2, -0.5, 1.1], [0.8, -2, pad]].
        # decoupled, no cap: w = [[2, 0.5, 1], [4, 1, pad]] -> [[-2.4, -0.25, 1.1], [3.2, -2]]:
        #   token_mean = (-2.4 - 0.25 + 1.1 + 3.2 - 2) / 5 = -0.35 / 5 = -0.07
        #   seq_mean_token_mean = mean(-1.55 / 3, 1.2 / 2) = mean(-0.516667, 0.6) = 0.0416667
        #   mean w over valid tokens = (2 + 0.5 + 1 + 4 + 1) / 5 = 1.7 (the infinite padding weight is ignored)
        ("decoupled", None, -0.07, 0.0416667, 1.7),
        # decoupled, cap 3: the 4 is dropped -> [[-2.4, -0.25, 1.1], [0, -2]]:
        #   token_mean = -3.55 / 5 = -0.71; seq_mean_token_mean = mean(-0.516667, -1) = -0.758333; mean w = 4.5 / 5
        ("decoupled", 3.0, -0.71, -0.758333, 0.9),
        # truncated_is, cap 3: the 4 becomes 3 -> [[-2.4, -0.25, 1.1], [2.4, -2]]:
        #   token_mean = -1.15 / 5 = -0.23; seq_mean_token_mean = mean(-0.516667, 0.2) = -0.158333; mean w = 7.5 / 5
        ("truncated_is", 3.0, -0.23, -0.158333, 1.5),
    ],
)
def test_policy_loss_weighted_by_behaviour(
    correction: str, cap: float | None, token_mean: float, seq_mean: float, mean_weight: float
) -> None:
    logprobs = (OLD_LOGPROBS + RATIO.log()).requires_grad_()
    behaviour = BEHAVIOUR.clone().requires_grad_()
    weights = behaviour_weight(OLD_LOGPROBS, behaviour, correction, cap)
    assert not weights.requires_grad  # detached: data, not a function of the parameters
    loss, stats = token_policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2, "token_mean", weights)
    assert loss.item() == pytest.approx(token_mean, abs=1e-6)
    assert stats["behaviour_weight"].item() == pytest.approx(mean_weight, abs=1e-6)
    # clip_frac and approx_kl stay relative to the proximal policy, unweighted (as in test_policy_loss_hand_computed).
    assert stats["clip_frac"].item() == pytest.approx(0.4)
    assert stats["approx_kl"].item() == pytest.approx(
        sum((r - 1) - math.log(r) for r in [1.5, 0.5, 1.1, 0.7, 1.0]) / 5, abs=1e-6
    )
    # d loss / d logprob = w * (-A * r) / 5 where the unclipped term wins, else 0 (the same w in every case there):
    #   row 0: clipped -> 0; 0.5 * (-1 * 0.5) / 5 = -0.05; 1 * (1 * 1.1) / 5 = 0.22
    #   row 1: clipped -> 0; 1 * (-2 * 1) / 5 = -0.4; padding -> 0
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.05, 0.22], [0.0, -0.4, 0.0]]))
    assert behaviour.grad is None
    loss, _ = token_policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2, "seq_mean_token_mean", weights)
    assert loss.item() == pytest.approx(seq_mean, abs=1e-6)


def test_policy_loss_gets_no_gradient_through_the_weights() -> None:
    weights = torch.tensor([[2.0, 0.5, 1.0], [4.0, 1.0, 1.0]], requires_grad=True)
    logprobs = (OLD_LOGPROBS + RATIO.log()).requires_grad_()
    loss, _ = token_policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2, weights=weights)
    loss.backward()
    assert weights.grad is None and logprobs.grad is not None


@pytest.mark.parametrize(
    ("correction", "cap"), [("decoupled", None), ("decoupled", 1.0), ("truncated_is", 1.0), ("truncated_is", 2.0)]
)
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_on_policy_weights_reduce_to_ppo_bit_for_bit(correction: str, cap: float | None, agg: str) -> None:
    # Synchronous training (K = 0): π_behav = π_prox, so w = exp(0) = 1 exactly on every token, and the loss, its
    # stats and its gradient are today's PPO's to the last bit, whatever the correction, cap (at least 1) and agg.
    generator = torch.Generator().manual_seed(0)
    old_logprobs = -torch.rand(4, 6, generator=generator) * 3
    logprobs = old_logprobs + 0.3 * torch.randn(4, 6, generator=generator)
    advantages = torch.randn(4, 6, generator=generator)
    mask = (torch.arange(6) < torch.tensor([[6], [3], [1], [5]])).long()
    results = []
    for weights in (None, behaviour_weight(old_logprobs, old_logprobs.clone(), correction, cap)):
        leaf = logprobs.clone().requires_grad_()
        loss, stats = token_policy_loss(leaf, old_logprobs, advantages, mask, 0.2, 0.28, agg, weights)
        loss.backward()
        results.append((loss, stats, leaf.grad))
    (loss, stats, grad), (loss_w, stats_w, grad_w) = results
    assert torch.equal(loss, loss_w) and torch.equal(grad, grad_w)
    assert stats.keys() == stats_w.keys() and all(torch.equal(stats[k], stats_w[k]) for k in stats)
    assert stats_w["behaviour_weight"].item() == 1.0


def test_kl_kinds_hand_computed() -> None:
    # log p = [-1, -2], log q (reference) = [-1.5, -1]:
    #   k1 = log p - log q = [0.5, -1];  k2 = 0.5 * k1^2 = [0.125, 0.5]
    #   k3: log(q/p) = [-0.5, 1] -> exp(-0.5) + 0.5 - 1 = 0.106531; exp(1) - 1 - 1 = 0.718282
    logprobs, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    torch.testing.assert_close(kl_divergence(logprobs, ref, "k1"), torch.tensor([0.5, -1.0]))
    torch.testing.assert_close(kl_divergence(logprobs, ref, "k2"), torch.tensor([0.125, 0.5]))
    k3 = torch.tensor([math.exp(-0.5) - 0.5, math.e - 2.0])
    torch.testing.assert_close(kl_divergence(logprobs, ref, "k3"), k3)
    torch.testing.assert_close(kl_divergence(logprobs, ref, "low_var_kl"), k3)
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        assert not kl_divergence(logprobs, logprobs, kind).any()


def test_k1_and_k3_expectations_are_the_exact_kl() -> None:
    # Over a categorical p, E_{x~p}[k1] = sum p log(p/q) = KL(p || q) and E_{x~p}[k3] = sum q - sum p log(q/p) - 1
    # = KL too (both unbiased); k2 only approximates it (second order), and it is never negative.
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    exact = (p * (p / q).log()).sum()
    for kind in ("k1", "k3"):
        assert (p * kl_divergence(p.log(), q.log(), kind)).sum().item() == pytest.approx(exact.item())
    assert (kl_divergence(p.log(), q.log(), "k2") >= 0).all()


def test_k3_is_clamped_with_finite_gradient() -> None:
    # log(q/p) = -30 is clamped to -20: exp(-20) + 20 - 1 ~ 19 -> 10. log(q/p) = +30 -> 20: exp(20) - 21 -> 10.
    logprobs = torch.tensor([0.0, -30.0], requires_grad=True)
    kl = kl_divergence(logprobs, torch.tensor([-30.0, 0.0]), "k3")
    torch.testing.assert_close(kl, torch.tensor([10.0, 10.0]))
    kl.sum().backward()
    assert torch.isfinite(logprobs.grad).all()


def test_kl_unknown_kind() -> None:
    with pytest.raises(ValueError, match="'k4'.*k1, k2, k3, low_var_kl"):
        kl_divergence(torch.zeros(1), torch.zeros(1), "k4")


def test_value_loss_masked_and_clipped() -> None:
    # Valid tokens: values [0.5, 1.0], old [0, 0], returns [1, 1], clip 0.2:
    #   token 0: clipped to 0.2; max((0.5 - 1)^2, (0.2 - 1)^2) = max(0.25, 0.64) = 0.64
    #   token 1: clipped to 0.2; max(0, 0.64) = 0.64          -> 0.5 * mean(0.64, 0.64) = 0.32
    # Unclipped: 0.5 * mean(0.25, 0) = 0.0625. The padded third token (value 50) is ignored.
    values = torch.tensor([[0.5, 1.0, 50.0]], requires_grad=True)
    old, returns, mask = torch.zeros(1, 3), torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([[1, 1, 0]])
    assert token_value_loss(values, old, returns, mask, clip=None).item() == pytest.approx(0.0625)
    loss = token_value_loss(values, old, returns, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.32)
    loss.backward()  # the clipped branch wins on both tokens: no gradient anywhere
    assert not values.grad.any()


def test_logprobs_from_logits() -> None:
    # logits [0, log 3] -> softmax [0.25, 0.75]; tokens [1, 0] -> [log 0.75, log 0.25]
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    logprobs = logprobs_from_logits(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(logprobs, torch.tensor([[math.log(0.75), math.log(0.25)]]))
    # bf16 logits come back as float32 log-probs, equal to log_softmax + gather on the upcast logits.
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=generator).to(torch.bfloat16)
    tokens = torch.randint(0, 11, (2, 3), generator=generator)
    logprobs = logprobs_from_logits(logits, tokens)
    assert logprobs.dtype == torch.float32
    expected = torch.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logprobs, expected)


def test_entropy_from_logits() -> None:
    # [0, log 3, -1e9, -1e9] -> softmax [0.25, 0.75, 0, 0]: -(0.25 log 0.25 + 0.75 log 0.75) = 0.562335;
    # uniform over 4: log 4 = 1.386294. Huge logits stay finite: [1e4, 1e4] is uniform over 2 -> log 2.
    logits = torch.tensor([[0.0, math.log(3.0), -1e9, -1e9], [1.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([0.562335, math.log(4.0)]))
    torch.testing.assert_close(entropy_from_logits(torch.tensor([1e4, 1e4])), torch.tensor(math.log(2.0)))


def test_entropy_gradient_matches_the_definition() -> None:
    # The max shift is a constant for the entropy, so the gradient equals that of -sum(p * log p) computed directly.
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=generator, requires_grad=True)
    entropy_from_logits(logits).sum().backward()
    direct = logits.detach().clone().requires_grad_()
    log_probs = torch.log_softmax(direct, -1)
    (-(log_probs.exp() * log_probs).sum()).backward()
    torch.testing.assert_close(logits.grad, direct.grad)
