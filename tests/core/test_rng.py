"""Counter-based noise: a pure function of (seed, global env index, step, component), whatever the layout."""

from __future__ import annotations

import numpy as np
import torch

from rlplace.core.rng import uniform_noise


def test_deterministic_and_in_open_unit_interval() -> None:
    a = uniform_noise(7, np.arange(16), 3, 4)
    b = uniform_noise(np.int64(7), torch.arange(16), np.int64(3), 4)  # numpy ints, as a worker may pass
    assert a.shape == (16, 4) and a.dtype == torch.float32
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    big = uniform_noise(-5, np.arange(50_000), 2**40, 2)
    assert 0.0 < big.min().item() and big.max().item() < 1.0


def test_layout_independent() -> None:
    # Two "workers" holding envs [0, 3) and [3, 8), or pipeline stages in any order, see the same noise per env.
    whole = uniform_noise(1, np.arange(8), 42, 3)
    parts = torch.cat([uniform_noise(1, np.arange(3), 42, 3), uniform_noise(1, np.arange(3, 8), 42, 3)])
    torch.testing.assert_close(whole, parts, rtol=0, atol=0)
    shuffled = np.array([5, 0, 7])
    torch.testing.assert_close(uniform_noise(1, shuffled, 42, 3), whole[shuffled], rtol=0, atol=0)
    # More components only append columns.
    torch.testing.assert_close(uniform_noise(1, np.arange(8), 42, 5)[:, :3], whole, rtol=0, atol=0)


def test_every_key_part_changes_the_noise() -> None:
    base = uniform_noise(1, np.arange(64), 10, 2)
    for other in (uniform_noise(2, np.arange(64), 10, 2), uniform_noise(1, np.arange(64), 11, 2)):
        assert not torch.equal(base, other)
    assert not torch.equal(base[:, 0], base[:, 1])
    assert len(torch.unique(base)) == base.numel()


def test_roughly_uniform() -> None:
    u = uniform_noise(3, np.arange(100_000), 0, 1).flatten()
    assert abs(u.mean().item() - 0.5) < 0.005
    assert abs(u.var().item() - 1 / 12) < 0.002
    counts = torch.histc(u, bins=10, min=0.0, max=1.0)
    assert (counts - 10_000).abs().max().item() < 500
