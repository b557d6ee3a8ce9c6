"""EnvSlice: seeding by global index, same-step auto-reset, episode stats, splits; the task registry."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

from rlplace.embodied.envs import (
    EnvSlice,
    EpisodeStats,
    Normalization,
    env_spec,
    make_env,
    merge_episode_stats,
    split_stages,
)
from rlplace.embodied.envs.registry import observation_flattener

FIELDS = ("obs", "rewards", "terminated", "truncated")


def _actions(step: int, global_indices: np.ndarray) -> np.ndarray:
    """A fixed 0/1 action schedule keyed by global env index and step, so any split gets the same actions."""
    return (global_indices * 7 + step * 3) % 5 // 3


NORMALIZED = [None, Normalization(observations=True, rewards=True, gamma=0.99)]
"""Each split test runs as it is and with observations and rewards normalised (statistics kept per sub-env)."""


@pytest.mark.parametrize("normalize", NORMALIZED)
def test_two_slices_equal_one_slice_step_by_step(normalize: Normalization | None) -> None:
    whole = EnvSlice("CartPole-v1", 0, 8, seed=11, normalize=normalize)
    parts = [EnvSlice("CartPole-v1", 0, 4, 11, normalize), EnvSlice("CartPole-v1", 4, 8, 11, normalize)]
    np.testing.assert_array_equal(whole.reset(), np.concatenate([p.reset() for p in parts]))
    for step in range(150):
        expected = whole.step(_actions(step, whole.global_indices))
        got = [p.step(_actions(step, p.global_indices)) for p in parts]
        for i, name in enumerate(FIELDS):
            np.testing.assert_array_equal(expected[i], np.concatenate([g[i] for g in got]), err_msg=name)
    merged = merge_episode_stats([p.pop_episode_stats() for p in parts])
    assert merged == whole.pop_episode_stats()
    assert len(merged.returns) > 8  # episodes ended (and auto-reset) along the way


@pytest.mark.parametrize("normalize", NORMALIZED)
def test_states_taken_from_one_split_continue_in_another(normalize: Normalization | None) -> None:
    # Mid-episode states of slices [0, 4) and [4, 8), taken back by slices [0, 2) and [2, 8) (as a checkpoint written
    # by two env processes is resumed by a different split), continue exactly like the slice that was never split.
    whole = EnvSlice("CartPole-v1", 0, 8, seed=5, normalize=normalize)
    parts = [EnvSlice("CartPole-v1", 0, 4, 5, normalize), EnvSlice("CartPole-v1", 4, 8, 5, normalize)]
    for envs in (whole, *parts):
        envs.reset()
        for step in range(30):
            envs.step(_actions(step, envs.global_indices))
        envs.pop_episode_stats()
    states = pickle.loads(pickle.dumps(parts[0].states() + parts[1].states()))  # as a checkpoint keeps them
    resumed = [EnvSlice("CartPole-v1", 0, 2, 5, normalize), EnvSlice("CartPole-v1", 2, 8, 5, normalize)]
    for envs in resumed:
        envs.reset()
        envs.restore(states[envs.start : envs.end])
    for step in range(30, 150):
        expected = whole.step(_actions(step, whole.global_indices))
        got = [envs.step(_actions(step, envs.global_indices)) for envs in resumed]
        for i, name in enumerate(FIELDS):
            np.testing.assert_array_equal(expected[i], np.concatenate([g[i] for g in got]), err_msg=name)
    merged = merge_episode_stats([envs.pop_episode_stats() for envs in resumed])
    assert merged == whole.pop_episode_stats()
    # Some episodes ran across the resume: their returns and lengths began before it.
    assert any(length > end - 30 for length, end in zip(merged.lengths, merged.end_steps, strict=True))


def test_seeds_follow_global_index() -> None:
    # Sub-env 5 of a slice [4, 8) seeded 3 starts where a lone env seeded 3 + 5 starts.
    lone = make_env("CartPole-v1")
    first_obs, _ = lone.reset(seed=8)
    np.testing.assert_array_equal(EnvSlice("CartPole-v1", 4, 8, seed=3).reset()[1], first_obs)


def test_auto_reset_and_episode_stats() -> None:
    envs = EnvSlice("CartPole-v1", 10, 12, seed=0)
    obs = envs.reset()
    lengths, returns, ended_at = [0, 0], [0.0, 0.0], []
    for step in range(1, 60):
        actions = np.zeros(2, dtype=np.int64)  # always push left: episodes end within ~10 steps
        next_obs, rewards, terminated, truncated = envs.step(actions)
        for i in range(2):
            lengths[i] += 1
            returns[i] += rewards[i]
            if terminated[i] or truncated[i]:
                # Same-step auto-reset: the returned obs is a fresh episode's first one, near the origin.
                assert np.abs(next_obs[i]).max() <= 0.05
                ended_at.append((step, 10 + i, returns[i], lengths[i]))
                lengths[i], returns[i] = 0, 0.0
        obs = next_obs
    assert obs.dtype == np.float32 and obs.shape == (2, 4)
    stats = envs.pop_episode_stats()
    assert len(stats.returns) >= 8
    assert stats == EpisodeStats(
        returns=[e[2] for e in ended_at],
        lengths=[e[3] for e in ended_at],
        env_indices=[e[1] for e in ended_at],
        end_steps=[e[0] for e in ended_at],
    )
    assert envs.pop_episode_stats() == EpisodeStats([], [], [], [])


def test_step_before_reset_is_refused() -> None:
    with pytest.raises(RuntimeError, match="before reset"):
        EnvSlice("CartPole-v1", 0, 1, seed=0).step(np.zeros(1, dtype=np.int64))


def test_split_stages() -> None:
    assert split_stages(0, 8, 2) == [(0, 4), (4, 8)]
    assert split_stages(4, 11, 3) == [(4, 7), (7, 9), (9, 11)]
    assert split_stages(3, 4, 1) == [(3, 4)]
    with pytest.raises(ValueError, match="into 5 stages"):
        split_stages(0, 4, 5)


def test_any_gymnasium_id_and_unknown_ids() -> None:
    spec = env_spec("CartPole-v1")
    assert spec.obs_dim == 4 and spec.action.discrete and spec.action.n == 2
    assert make_env("CartPole-v1").spec.max_episode_steps == 500
    assert env_spec("Acrobot-v1").action.n == 3  # gymnasium's registry is the task registry
    with pytest.raises(ValueError, match=r"'Cartpole-v1' is not a registered gymnasium environment \(close: CartPole"):
        make_env("Cartpole-v1")
    with pytest.raises(ValueError, match="'pong' is not a registered gymnasium environment"):
        env_spec("pong")


def test_observations_that_are_not_a_vector_reach_the_policy_flattened() -> None:
    """FrozenLake's state is one of 16 cells (one-hot), Blackjack's a tuple of three discrete parts; both step, and
    a state taken mid-episode continues in another slice, as a checkpoint does."""
    assert env_spec("FrozenLake-v1").obs_dim == 16 and env_spec("Blackjack-v1").obs_dim == 32 + 11 + 2
    lake = EnvSlice("FrozenLake-v1", 0, 2, seed=0)
    first = lake.reset()
    assert first.shape == (2, 16) and first.dtype == np.float32
    np.testing.assert_array_equal(first.sum(axis=1), [1.0, 1.0])  # one cell each
    assert first[0, 0] == 1.0  # the start cell
    whole, moved = EnvSlice("Blackjack-v1", 0, 4, seed=3), EnvSlice("Blackjack-v1", 0, 4, seed=3)
    for envs in (whole, moved):
        envs.reset()
        envs.step(np.zeros(4, dtype=np.int64))
        envs.pop_episode_stats()
    moved.restore(pickle.loads(pickle.dumps(moved.states())))
    for step in range(20):
        expected, got = (
            whole.step(_actions(step, whole.global_indices)),
            moved.step(_actions(step, moved.global_indices)),
        )
        for i, name in enumerate(FIELDS):
            np.testing.assert_array_equal(expected[i], got[i], err_msg=name)


def test_spaces_a_policy_cannot_take_are_refused() -> None:
    space = gym.spaces.Graph(node_space=gym.spaces.Box(0, 1, (2,)), edge_space=None)
    with pytest.raises(ValueError, match="observation space Graph.* has no flat vector form"):
        observation_flattener(space)
    assert observation_flattener(gym.spaces.Box(0, 1, (3,))) is None  # already a vector: taken as it is


def test_normalisation_is_gymnasiums_per_sub_env_and_leaves_episode_returns_raw() -> None:
    """One Pendulum sub-env normalised here against gymnasium's NormalizeObservation and NormalizeReward wrappers
    (what CleanRL wraps each env in) with the same actions, clipped to +-10 as CleanRL clips them; its episode return
    is the simulator's own reward sum."""
    normalized = EnvSlice("Pendulum-v1", 0, 1, seed=3, normalize=Normalization(True, True, gamma=0.9))
    plain = EnvSlice("Pendulum-v1", 0, 1, seed=3)
    wrapped = gym.wrappers.NormalizeReward(gym.wrappers.NormalizeObservation(make_env("Pendulum-v1")), gamma=0.9)
    expected_obs, _ = wrapped.reset(seed=3)
    np.testing.assert_allclose(normalized.reset()[0], np.clip(expected_obs, -10, 10), rtol=1e-5, atol=1e-6)
    plain.reset()
    raw_return = 0.0
    for step in range(200):  # one whole episode: Pendulum truncates at 200 steps
        action = np.array([[np.sin(step / 7.0) * 2.0]], dtype=np.float32)
        obs, reward, _, truncated = normalized.step(action)
        expected_obs, expected_reward, *_ = wrapped.step(action[0])
        raw_return += float(plain.step(action)[1][0])
        if step < 199:  # at the episode's end the slice resets at once, gymnasium's wrapper returns the last one
            np.testing.assert_allclose(obs[0], np.clip(expected_obs, -10, 10), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(reward[0], np.clip(expected_reward, -10, 10), rtol=1e-5, atol=1e-6)
    assert truncated[0] and abs(reward[0]) < 10
    (episode_return,) = normalized.pop_episode_stats().returns
    assert episode_return == pytest.approx(raw_return, rel=1e-6) and episode_return < -100  # Pendulum's cost
