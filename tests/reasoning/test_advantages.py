"""Token-level advantage estimators against hand-computed examples and a per-sequence reference loop."""

from __future__ import annotations

import pytest
import torch

from rlplace.reasoning.advantages import (
    adaptive_kl_coef,
    grpo_advantages,
    kl_penalized,
    masked_mean,
    masked_whiten,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_rewards_to_tokens,
    token_gae,
)


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    """Right-padded response mask (bool) for the given response lengths."""
    return torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


def test_masked_mean_and_whiten() -> None:
    # x = [[1, 2, 9], [3, 9, 9]], valid = [1, 2] and [3]: mean over all = 6 / 3 = 2; per row = [1.5, 3]
    x = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = _mask([2, 1], 3)
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 3.0]))
    # Whitening: deviations [-1, 0, 1], unbiased var = 2 / 2 = 1 -> [-1, 0, 1] on the valid positions, 0 elsewhere.
    torch.testing.assert_close(masked_whiten(x, mask), torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="at least 2 valid positions, got 1"):
        masked_whiten(x, _mask([1, 0], 3))


def test_sequence_rewards_sit_on_the_last_valid_token() -> None:
    # Lengths 3, 1 and 0: the reward lands on the EOS position; an empty response gets nothing.
    token_rewards = sequence_rewards_to_tokens(torch.tensor([2.0, -1.0, 5.0]), _mask([3, 1, 0], 3))
    torch.testing.assert_close(token_rewards, torch.tensor([[0.0, 0.0, 2.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # KL folded in: r - 0.5 * kl on valid tokens, 0 on padding: [0 - 0.5 * 0.2, 2 - 0.5 * 0.4, 0] for the first row.
    kl = torch.tensor([[0.2, 0.4, 9.0]])
    penalized = kl_penalized(torch.tensor([[0.0, 2.0, 7.0]]), kl, 0.5, _mask([2], 3))
    torch.testing.assert_close(penalized, torch.tensor([[-0.1, 1.8, 0.0]]))


def test_grpo_hand_computed() -> None:
    # Two groups of 3. Group 0: rewards [0, 1, 2], mean 1, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> [-1, 0, 1].
    # Group 1: rewards [4, 0, 2], mean 2, deviations [2, -2, 0], std sqrt((4 + 4 + 0) / 2) = 2 -> [1, -1, 0].
    # Each response's advantage sits on all its tokens (lengths [2, 1, 3, 3, 2, 1]), 0 on padding.
    rewards = torch.tensor([0.0, 1.0, 2.0, 4.0, 0.0, 2.0])
    mask = _mask([2, 1, 3, 3, 2, 1], 3)
    advantages = grpo_advantages(rewards, mask, group_size=3, eps=0.0)
    expected = torch.tensor([-1.0, 0.0, 1.0, 1.0, -1.0, 0.0]).unsqueeze(1) * mask
    torch.testing.assert_close(advantages, expected)
    # Without the std division (Dr. GRPO): the centred rewards [-1, 0, 1, 2, -2, 0].
    unnormalised = grpo_advantages(rewards, mask, group_size=3, norm_std=False)
    torch.testing.assert_close(unnormalised, torch.tensor([-1.0, 0.0, 1.0, 2.0, -2.0, 0.0]).unsqueeze(1) * mask)


def test_rloo_hand_computed() -> None:
    # Group 0: rewards [1, 0, 1, 0]: each response minus the mean of the other three: 1 - 1/3, 0 - 2/3, ...
    # Group 1: rewards [0, 0, 0, 3]: [-1, -1, -1, 3]. Every valid token of a response gets its advantage.
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 3.0])
    mask = _mask([2, 1, 3, 3, 2, 1, 3, 2], 3)
    advantages = rloo_advantages(rewards, mask, group_size=4)
    expected = torch.tensor([2 / 3, -2 / 3, 2 / 3, -2 / 3, -1.0, -1.0, -1.0, 3.0])
    torch.testing.assert_close(advantages, expected.unsqueeze(1) * mask)
    # The KL in the reward: each token's -kl_coef * kl is added to its return-to-go (gamma 1), as REINFORCE's.
    kl = torch.full((8, 3), 0.5)
    with_kl = rloo_advantages(rewards, mask, 4, token_kl=kl, kl_coef=0.2)
    torch.testing.assert_close(with_kl[0, :2], torch.tensor([2 / 3 - 0.2, 2 / 3 - 0.1]))
    assert with_kl[~mask].abs().max() == 0
    with pytest.raises(ValueError, match="group_size = 1 must be at least 2"):
        rloo_advantages(rewards, mask, group_size=1)


def test_grpo_normalises_each_group_on_its_own() -> None:
    # Group 0 rewards [1, 0]: mean 0.5, unbiased std sqrt(0.25 + 0.25) = 0.7071 -> +-0.7071.
    # Group 1 rewards [3, 3]: every answer equally good, no signal -> 0 (not NaN, thanks to eps).
    advantages = grpo_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0]), torch.ones(4, 2), group_size=2)
    a = 0.5 / 0.5**0.5
    expected = torch.tensor([[a, a], [-a, -a], [0.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=1e-5)
    # Shifting one group's rewards changes nothing in the other.
    shifted = grpo_advantages(torch.tensor([1.0, 0.0, 30.0, -3.0]), torch.ones(4, 2), group_size=2)
    torch.testing.assert_close(shifted[:2], advantages[:2])
    # group_size 1: nothing to compare with -> 0.
    torch.testing.assert_close(grpo_advantages(torch.tensor([1.0, 2.0]), torch.ones(2, 3), 1), torch.zeros(2, 3))


def test_reinforce_pp_hand_computed() -> None:
    # rewards [1, 0], kl_coef 0.5, gamma 1, lengths [3, 2]; the padded kl (9) must be ignored.
    # token rewards: row 0 = [-0.05, -0.1, -0.15 + 1] = [-0.05, -0.1, 0.85]; row 1 = [-0.2, -0.25]
    # returns-to-go: row 0 = [0.70, 0.75, 0.85]; row 1 = [-0.45, -0.25]
    # whiten over the 5 valid tokens: mean 1.6 / 5 = 0.32; deviations [0.38, 0.43, 0.53, -0.77, -0.57],
    #   squares sum 1.528, unbiased var 1.528 / 4 = 0.382, std 0.618061
    #   -> [0.614826, 0.695724, 0.857520, -1.245831, -0.922238]
    token_kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    advantages = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), _mask([3, 2], 3), token_kl, kl_coef=0.5)
    expected = torch.tensor([[0.614826, 0.695724, 0.857520], [-1.245831, -0.922238, 0.0]])
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=1e-5)


def test_reinforce_pp_discount() -> None:
    # One response of 3 tokens, reward 1, no KL, gamma 0.5: returns [0.25, 0.5, 1]; mean 7/12;
    # deviations [-1/3, -1/12, 5/12], unbiased var (16 + 1 + 25) / 144 / 2 = 21/144, std sqrt(21)/12 = 0.381881
    # -> [-0.872872, -0.218218, 1.091089]
    advantages = reinforce_pp_advantages(torch.tensor([1.0]), torch.ones(1, 3), None, kl_coef=0.0, gamma=0.5)
    torch.testing.assert_close(advantages, torch.tensor([[-0.872872, -0.218218, 1.091089]]), atol=1e-5, rtol=1e-5)


def test_reinforce_pp_baseline_removes_the_prompt_offset() -> None:
    # Two prompts of 2 responses, one token each. Rewards [1, 0, 3, 3]; group means [0.5, 3] -> [0.5, -0.5, 0, 0].
    # Whitened: mean 0, unbiased var (0.25 + 0.25) / 3 = 1/6 -> [1.2247, -1.2247, 0, 0]: the prompt every response
    # solved teaches nothing, as in GRPO.
    rewards, mask = torch.tensor([1.0, 0.0, 3.0, 3.0]), torch.ones(4, 1)
    advantages = reinforce_pp_advantages(rewards, mask, None, kl_coef=0.0, group_size=2)
    a = 0.5 * 6**0.5
    torch.testing.assert_close(advantages, torch.tensor([[a], [-a], [0.0], [0.0]]), atol=1e-5, rtol=1e-5)
    # Without the baseline (batch mean 1.75) the hard prompt's correct answer is pushed down and the solved prompt's
    # answers up.
    plain = reinforce_pp_advantages(rewards, mask, None, kl_coef=0.0)
    assert plain[0].item() < 0.0 < plain[2].item()


def test_token_gae_hand_computed() -> None:
    # gamma = 0.5, lambda = 0.5 (gamma * lambda = 0.25). Row 0: rewards [0, 0, 1], values [0.5, 0.5, 0.5]:
    #   t=2: delta = 1 + 0.5 * 0 - 0.5 = 0.5 (no bootstrap after EOS);  A2 = 0.5
    #   t=1: delta = 0 + 0.5 * 0.5 - 0.5 = -0.25;                         A1 = -0.25 + 0.25 * 0.5 = -0.125
    #   t=0: delta = -0.25;                                               A0 = -0.25 + 0.25 * -0.125 = -0.28125
    #   returns = A + V = [0.21875, 0.375, 1.0]
    # Row 1: length 2, rewards [0, 2, (7)], values [1, 1, (5)] (padding in brackets, ignored):
    #   t=1: delta = 2 + 0 - 1 = 1;            A1 = 1
    #   t=0: delta = 0 + 0.5 * 1 - 1 = -0.5;   A0 = -0.5 + 0.25 * 1 = -0.25;   returns = [0.75, 2.0]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    values = torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 5.0]])
    advantages, returns = token_gae(rewards, values, _mask([3, 2], 3), gamma=0.5, lam=0.5)
    torch.testing.assert_close(advantages, torch.tensor([[-0.28125, -0.125, 0.5], [-0.25, 1.0, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.21875, 0.375, 1.0], [0.75, 2.0, 0.0]]))


def _reference_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """GAE for one unpadded response, written as the textbook sums: A_t = sum_k (gamma lam)^k delta_{t+k}."""
    n = len(rewards)
    deltas = [rewards[t] + gamma * (values[t + 1] if t + 1 < n else 0.0) - values[t] for t in range(n)]
    return [sum((gamma * lam) ** (k - t) * deltas[k] for k in range(t, n)) for t in range(n)]


def test_token_gae_matches_per_sequence_reference() -> None:
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 1, 3, 4]
    rewards = torch.randn(4, 5, generator=generator, dtype=torch.float64)
    values = torch.randn(4, 5, generator=generator, dtype=torch.float64)
    advantages, returns = token_gae(rewards, values, _mask(lengths, 5), gamma=0.9, lam=0.8)
    for row, n in enumerate(lengths):
        expected = _reference_gae(rewards[row, :n].tolist(), values[row, :n].tolist(), 0.9, 0.8)
        torch.testing.assert_close(advantages[row, :n], torch.tensor(expected, dtype=torch.float64))
        torch.testing.assert_close(returns[row, :n], advantages[row, :n] + values[row, :n])
        assert not advantages[row, n:].any() and not returns[row, n:].any()


def test_padding_changes_nothing() -> None:
    generator = torch.Generator().manual_seed(1)
    mask = _mask([4, 2, 3, 1], 4)
    rewards = torch.randn(4, generator=generator)
    token_rewards, values, token_kl = torch.randn(3, 4, 4, generator=generator)
    noise = torch.randn(3, 4, 4, generator=generator) * 100 * ~mask  # only on padding

    gae = token_gae(token_rewards, values, mask, 0.99, 0.95)
    gae_noisy = token_gae(token_rewards + noise[0], values + noise[1], mask, 0.99, 0.95)
    torch.testing.assert_close(gae, gae_noisy)
    rpp = reinforce_pp_advantages(rewards, mask, token_kl, 0.1, group_size=2)
    torch.testing.assert_close(rpp, reinforce_pp_advantages(rewards, mask, token_kl + noise[2], 0.1, group_size=2))
    assert not rpp[~mask].any() and not grpo_advantages(rewards, mask, 2)[~mask].any()


def test_a_tools_tokens_are_stepped_over_as_if_they_were_not_there() -> None:
    """A response made in turns has holes in its action mask where a tool wrote (`rollout.multi_turn`): GAE and the
    discounted returns over it equal those over the model's tokens alone, put back in their columns (verl's
    multi-turn GAE), whatever the holes hold; PPO's returns then are the critic's target on the model's tokens only."""
    generator = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 0, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 0, 1, 1, 1]])
    rewards = torch.randn(4, generator=generator, dtype=torch.float64)
    token_rewards, values, token_kl = torch.randn(3, 4, 7, generator=generator, dtype=torch.float64)
    noise = torch.randn(3, 4, 7, generator=generator, dtype=torch.float64) * 100 * (1 - mask)

    def compact(x: torch.Tensor, row: int) -> torch.Tensor:  # the row's model tokens, left-aligned and padded
        kept = x[row][mask[row].bool()]
        return torch.nn.functional.pad(kept, (0, 7 - kept.numel()))

    def dense(f, *tensors: torch.Tensor) -> torch.Tensor:  # f over the compacted rows, put back in their columns
        lengths = mask.sum(-1)
        compacted = [torch.stack([compact(t, row) for row in range(4)]) for t in tensors]
        out = f(*compacted, _mask(lengths.tolist(), 7))
        back = torch.zeros_like(out)
        for row in range(4):
            back[row][mask[row].bool()] = out[row, : int(lengths[row])]
        return back

    advantages, returns = token_gae(token_rewards + noise[0], values + noise[1], mask, 0.9, 0.8)
    torch.testing.assert_close(
        advantages, dense(lambda r, v, m: token_gae(r, v, m, 0.9, 0.8)[0], token_rewards, values)
    )
    torch.testing.assert_close(returns, dense(lambda r, v, m: token_gae(r, v, m, 0.9, 0.8)[1], token_rewards, values))
    for algorithm in (
        lambda kl, m: reinforce_pp_advantages(rewards, m, kl, 0.1, group_size=2, gamma=0.9),
        lambda kl, m: rloo_advantages(rewards, m, 2, kl, 0.1, gamma=0.9),
    ):
        torch.testing.assert_close(algorithm(token_kl + noise[2], mask), dense(algorithm, token_kl))


def test_group_size_must_divide_batch() -> None:
    with pytest.raises(ValueError, match="group_size = 3 .*batch size \\(4\\)"):
        grpo_advantages(torch.ones(4), torch.ones(4, 2), group_size=3)
    with pytest.raises(ValueError, match="group_size = 3"):
        reinforce_pp_advantages(torch.ones(4), torch.ones(4, 2), None, 0.0, group_size=3)


def test_the_adaptive_kl_coefficient_moves_towards_the_target_by_at_most_its_clip() -> None:
    # Ziegler et al.'s controller: x (1 + clip(kl / target - 1, -0.2, 0.2) x responses / horizon).
    assert adaptive_kl_coef(0.1, kl=0.11, target=0.1, horizon=100, responses=50) == pytest.approx(0.1 * (1 + 0.1 / 2))
    assert adaptive_kl_coef(0.1, kl=0.5, target=0.1, horizon=100, responses=50) == pytest.approx(0.1 * 1.1)
    assert adaptive_kl_coef(0.1, kl=0.0, target=0.1, horizon=100, responses=100) == pytest.approx(0.08)
    assert adaptive_kl_coef(0.1, kl=0.1, target=0.1, horizon=100, responses=100) == 0.1
