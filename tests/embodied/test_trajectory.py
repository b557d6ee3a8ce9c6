"""Trajectory: streams merged by global env index whatever their order, and actor shards cut back out as columns."""

from __future__ import annotations

import copy
from dataclasses import fields

import torch

from rlplace.embodied.trajectory import PER_ENV, Trajectory


def _filled(
    env_indices: list[int], num_steps: int = 3, obs_dim: int = 2, action_shape: tuple[int, ...] = ()
) -> Trajectory:
    """A trajectory whose every entry encodes its global env index (100 * env + step + k / 10 per field k)."""
    traj = Trajectory.allocate(num_steps, torch.tensor(env_indices), obs_dim, action_shape, version=3)
    envs = torch.tensor(env_indices, dtype=torch.float32)
    for k, f in enumerate(fields(Trajectory)):
        value = getattr(traj, f.name)
        if f.name == "env_indices":
            continue
        if f.name in PER_ENV:
            value.copy_(100 * envs + k / 10)
        else:
            steps = torch.arange(num_steps, dtype=torch.float32).view(-1, 1)
            grid = 100 * envs.view(1, -1) + steps + k / 10
            value.copy_(grid.view(*grid.shape, *([1] * (value.dim() - 2))).expand_as(value))
    return traj


def _assert_equal(a: Trajectory, b: Trajectory) -> None:
    for f in fields(Trajectory):
        torch.testing.assert_close(getattr(a, f.name), getattr(b, f.name), rtol=0, atol=0, msg=f.name)


def test_allocate_shapes() -> None:
    traj = Trajectory.allocate(5, torch.arange(4, 7), obs_dim=3, action_shape=(2,), version=0)
    assert traj.obs.shape == (5, 3, 3) and traj.actions.shape == (5, 3, 2)
    assert traj.logprobs.shape == traj.values.shape == traj.rewards.shape == traj.dones.shape == (5, 3)
    assert traj.last_value.shape == traj.last_done.shape == (3,)
    assert traj.env_indices.tolist() == [4, 5, 6]


def test_merge_orders_streams_by_global_env_index() -> None:
    # Streams arrive in any order (whichever rollout rank finishes first); the merge is the same batch.
    whole = _filled([0, 1, 2, 3, 4, 5])
    for parts in ([[0, 1], [2, 3], [4, 5]], [[4, 5], [0, 1], [2, 3]], [[3, 4, 5], [0, 1, 2]]):
        _assert_equal(Trajectory.merge([_filled(p) for p in parts]), whole)
    # Interleaved indices too (not only contiguous streams).
    _assert_equal(Trajectory.merge([_filled([1, 3, 5]), _filled([0, 2, 4])]), whole)


def test_merge_keeps_continuous_action_dims() -> None:
    merged = Trajectory.merge([_filled([2, 3], action_shape=(6,)), _filled([0, 1], action_shape=(6,))])
    assert merged.actions.shape == (3, 4, 6)
    _assert_equal(merged, _filled([0, 1, 2, 3], action_shape=(6,)))


def test_columns_cut_an_actor_shard() -> None:
    whole = _filled([0, 1, 2, 3])
    _assert_equal(whole.columns(2, 4), _filled([2, 3]))
    _assert_equal(whole.columns(0, 4), whole)
    # Shards of a merge put back together give the merge.
    merged = Trajectory.merge([_filled([2, 3]), _filled([0, 1])])
    _assert_equal(Trajectory.merge([merged.columns(2, 4), merged.columns(0, 2)]), whole)


def test_columns_sent_before_their_ending_assemble_into_the_whole() -> None:
    # The rollout sends each actor rank its columns once the last action is out, the reward for it and the
    # bootstrap value after; pieces from several streams arrive in any order.
    whole = _filled([0, 1, 2, 3])
    early = [copy.deepcopy(whole.columns(2, 4)), copy.deepcopy(whole.columns(0, 2))]  # sent: copies, as pickled
    for piece in early:  # not known yet when they left
        piece.rewards[-1], piece.last_value, piece.last_done = 0.0, torch.zeros(2), torch.zeros(2)
    endings = [whole.columns(0, 2).ending(), whole.columns(2, 4).ending()]
    _assert_equal(Trajectory.assemble([early[0], endings[0], endings[1], early[1]]), whole)
