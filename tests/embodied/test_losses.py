"""PPO loss terms with the arithmetic worked by hand (torchtune's style)."""

from __future__ import annotations

import math

import pytest
import torch

from rlplace.core.off_policy import behaviour_weight
from rlplace.embodied.losses import entropy_bonus, ppo_policy_loss, value_loss


def test_policy_loss_clipped_and_unclipped() -> None:
    # ratios r = exp(logprob - old_logprob) = [1.5, 0.5, 1.1, 0.7], advantages A = [1, 1, -1, -1], clip 0.2:
    #   sample 0: max(-1 * 1.5, -1 * 1.2) = -1.2   (clipped: no credit beyond 1 + eps)      outside range
    #   sample 1: max(-1 * 0.5, -1 * 0.8) = -0.5   (a worse ratio is never clipped away)     outside range
    #   sample 2: max(+1 * 1.1, +1 * 1.1) =  1.1                                              inside
    #   sample 3: max(+1 * 0.7, +1 * 0.8) =  0.8   (clipped)                                  outside range
    #   loss = (-1.2 - 0.5 + 1.1 + 0.8) / 4 = 0.05; clip_frac = 3 / 4
    #   approx_kl = mean((r - 1) - log r)
    ratio = torch.tensor([1.5, 0.5, 1.1, 0.7])
    old_logprob = torch.tensor([-1.0, -2.0, -0.5, -0.3])
    logprob = old_logprob + ratio.log()
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, stats = ppo_policy_loss(logprob, old_logprob, advantages, 0.2, 0.2)
    assert loss.item() == pytest.approx(0.05, abs=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(0.75)
    expected_kl = sum((r - 1) - math.log(r) for r in [1.5, 0.5, 1.1, 0.7]) / 4
    assert stats["approx_kl"].item() == pytest.approx(expected_kl, abs=1e-6)


def test_policy_loss_asymmetric_clip() -> None:
    # clip_low = 0.2, clip_high = 0.5: r = 1.4 with A = 1 stays unclipped: loss = -1.4, clip_frac = 0.
    # r = 0.7 with A = -1: max(0.7, 0.8) = 0.8, clip_frac = 1.
    loss, stats = ppo_policy_loss(torch.tensor([math.log(1.4)]), torch.zeros(1), torch.ones(1), 0.2, 0.5)
    assert loss.item() == pytest.approx(-1.4, abs=1e-6)
    assert stats["clip_frac"].item() == 0.0
    loss, stats = ppo_policy_loss(torch.tensor([math.log(0.7)]), torch.zeros(1), -torch.ones(1), 0.2, 0.5)
    assert loss.item() == pytest.approx(0.8, abs=1e-6)
    assert stats["clip_frac"].item() == 1.0


def test_policy_loss_at_ratio_one_is_minus_mean_advantage() -> None:
    logprob = torch.tensor([-0.5, -1.5], requires_grad=True)
    loss, stats = ppo_policy_loss(logprob, logprob.detach(), torch.tensor([2.0, -1.0]), 0.2, 0.2)
    assert loss.item() == pytest.approx(-0.5)
    assert stats["approx_kl"].item() == 0.0
    loss.backward()  # d loss / d logprob_i = -A_i / n at r = 1
    torch.testing.assert_close(logprob.grad, torch.tensor([-1.0, 0.5]))


# The samples of test_policy_loss_clipped_and_unclipped, now off-policy: the ratios r = [1.5, 0.5, 1.1, 0.7] are taken
# against the proximal policy, and the behaviour policy that sampled them had π_prox / π_behav = [2, 0.5, 1, 4].
RATIO = [1.5, 0.5, 1.1, 0.7]
PROXIMAL = torch.tensor([-1.0, -2.0, -0.5, -0.3])
BEHAVIOUR = PROXIMAL - torch.tensor([2.0, 0.5, 1.0, 4.0]).log()
ADVANTAGES = torch.tensor([1.0, 1.0, -1.0, -1.0])


def test_behaviour_weight_per_correction() -> None:
    # w = π_prox / π_behav = [2, 0.5, 1, 4]
    #   decoupled, no cap:  [2, 0.5, 1, 4]
    #   decoupled, cap 3:   [2, 0.5, 1, 0]   (AReaL drops the sample above the cap)
    #   truncated_is, 3:    [2, 0.5, 1, 3]   (clamped, kept)
    torch.testing.assert_close(behaviour_weight(PROXIMAL, BEHAVIOUR, "decoupled", None), torch.tensor([2, 0.5, 1, 4]))
    torch.testing.assert_close(behaviour_weight(PROXIMAL, BEHAVIOUR, "decoupled", 3.0), torch.tensor([2, 0.5, 1, 0]))
    torch.testing.assert_close(behaviour_weight(PROXIMAL, BEHAVIOUR, "truncated_is", 3.0), torch.tensor([2, 0.5, 1, 3]))
    with pytest.raises(ValueError, match="truncated_is needs a cap"):
        behaviour_weight(PROXIMAL, BEHAVIOUR, "truncated_is", None)
    with pytest.raises(ValueError, match="'vtrace'.*decoupled, truncated_is"):
        behaviour_weight(PROXIMAL, BEHAVIOUR, "vtrace", None)


@pytest.mark.parametrize(
    ("correction", "cap", "expected_loss", "expected_weight"),
    [
        # Unweighted per-sample losses max(-A * r, -A * clip(r, 0.8, 1.2)) = [-1.2, -0.5, 1.1, 0.8] (see above).
        # decoupled, no cap: w = [2, 0.5, 1, 4]: (-2.4 - 0.25 + 1.1 + 3.2) / 4 = 1.65 / 4 = 0.4125; mean w = 7.5 / 4
        ("decoupled", None, 0.4125, 1.875),
        # decoupled, cap 3: w = [2, 0.5, 1, 0]: (-2.4 - 0.25 + 1.1 + 0) / 4 = -0.3875; mean w = 3.5 / 4 = 0.875
        ("decoupled", 3.0, -0.3875, 0.875),
        # truncated_is, cap 3: w = [2, 0.5, 1, 3]: (-2.4 - 0.25 + 1.1 + 2.4) / 4 = 0.2125; mean w = 6.5 / 4 = 1.625
        ("truncated_is", 3.0, 0.2125, 1.625),
    ],
)
def test_policy_loss_weighted_by_behaviour(
    correction: str, cap: float | None, expected_loss: float, expected_weight: float
) -> None:
    logprob = (PROXIMAL + torch.tensor(RATIO).log()).requires_grad_()
    behaviour = BEHAVIOUR.clone().requires_grad_()
    weight = behaviour_weight(PROXIMAL, behaviour, correction, cap)
    assert not weight.requires_grad  # detached: data, not a function of the parameters
    loss, stats = ppo_policy_loss(logprob, PROXIMAL, ADVANTAGES, 0.2, 0.2, weight)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert stats["behaviour_weight"].item() == pytest.approx(expected_weight, abs=1e-6)
    # clip_frac and approx_kl are relative to the proximal policy, unweighted: as in the on-policy test.
    assert stats["clip_frac"].item() == pytest.approx(0.75)
    assert stats["approx_kl"].item() == pytest.approx(sum((r - 1) - math.log(r) for r in RATIO) / 4, abs=1e-6)
    # d loss / d logprob_i = w_i * (-A_i * r_i) / 4 where the unclipped term wins (samples 1 and 2), else 0:
    #   sample 1: 0.5 * (-1 * 0.5) / 4 = -0.0625;  sample 2: 1 * (1 * 1.1) / 4 = 0.275   (the same w in every case)
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor([0.0, -0.0625, 0.275, 0.0]))
    assert behaviour.grad is None


def test_policy_loss_gets_no_gradient_through_the_weight() -> None:
    # A weight that requires grad is detached inside: the loss is linear in w, yet w receives nothing.
    weight = torch.tensor([2.0, 0.5, 1.0, 4.0], requires_grad=True)
    logprob = (PROXIMAL + torch.tensor(RATIO).log()).requires_grad_()
    loss, _ = ppo_policy_loss(logprob, PROXIMAL, ADVANTAGES, 0.2, 0.2, weight)
    loss.backward()
    assert weight.grad is None and logprob.grad is not None


@pytest.mark.parametrize(
    ("correction", "cap"), [("decoupled", None), ("decoupled", 1.0), ("truncated_is", 1.0), ("truncated_is", 2.0)]
)
def test_on_policy_weights_reduce_to_ppo_bit_for_bit(correction: str, cap: float | None) -> None:
    # Synchronous training (K = 0): π_behav = π_prox, so w = exp(0) = 1 exactly, 1 * x = x, and the loss, its stats
    # and its gradient are today's PPO's to the last bit, whatever the correction and cap (at least 1).
    generator = torch.Generator().manual_seed(0)
    old_logprob = -torch.rand(64, generator=generator) * 3
    logprob = old_logprob + 0.3 * torch.randn(64, generator=generator)
    advantages = torch.randn(64, generator=generator)
    results = []
    for weight in (None, behaviour_weight(old_logprob, old_logprob.clone(), correction, cap)):
        leaf = logprob.clone().requires_grad_()
        loss, stats = ppo_policy_loss(leaf, old_logprob, advantages, 0.2, 0.28, weight)
        loss.backward()
        results.append((loss, stats, leaf.grad))
    (loss, stats, grad), (loss_w, stats_w, grad_w) = results
    assert torch.equal(loss, loss_w) and torch.equal(grad, grad_w)
    assert stats.keys() == stats_w.keys() and all(torch.equal(stats[k], stats_w[k]) for k in stats)
    assert stats_w["behaviour_weight"].item() == 1.0


def test_value_loss_unclipped() -> None:
    # values [1, 3], returns [2, 2]: 0.5 * mean([1, 1]) = 0.5
    loss = value_loss(torch.tensor([1.0, 3.0]), torch.zeros(2), torch.tensor([2.0, 2.0]), clip=None)
    assert loss.item() == pytest.approx(0.5)


def test_value_loss_clipped_takes_pessimistic_max() -> None:
    # old values [0, 0], clip 0.2, returns [1, 1]:
    #   sample 0: new 0.5 -> clipped to 0.2; max((0.5 - 1)^2, (0.2 - 1)^2) = max(0.25, 0.64) = 0.64
    #   sample 1: new 1.0 -> clipped to 0.2; max((1 - 1)^2, (0.2 - 1)^2) = 0.64
    #   loss = 0.5 * mean([0.64, 0.64]) = 0.32
    loss = value_loss(torch.tensor([0.5, 1.0]), torch.zeros(2), torch.ones(2), clip=0.2)
    assert loss.item() == pytest.approx(0.32)
    # A step towards the target larger than the clip earns nothing: old 2, new 1.5, return 1:
    #   clipped 1.8; max((1.5 - 1)^2, (1.8 - 1)^2) = 0.64 -> loss 0.32, and no gradient (the clipped branch wins)
    new = torch.tensor([1.5], requires_grad=True)
    loss = value_loss(new, torch.tensor([2.0]), torch.ones(1), clip=0.2)
    assert loss.item() == pytest.approx(0.32)
    loss.backward()
    assert new.grad.item() == 0.0


def test_entropy_bonus_is_mean_entropy() -> None:
    # Uniform over 2 actions: log 2 = 0.6931; over 4: log 4 = 1.3863; mean = 1.0397
    entropy = torch.tensor([math.log(2), math.log(4)])
    assert entropy_bonus(entropy).item() == pytest.approx((math.log(2) + math.log(4)) / 2)
