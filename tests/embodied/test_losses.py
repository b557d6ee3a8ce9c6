"""PPO loss terms with the arithmetic worked by hand (torchtune's style)."""

from __future__ import annotations

import math

import pytest
import torch

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
