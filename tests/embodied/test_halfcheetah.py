"""HalfCheetah-v5 (MuJoCo) creates, steps, and gets its actions clipped; skipped where mujoco is not installed."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mujoco")

from rlplace.embodied.envs import EnvSlice, env_spec  # noqa: E402


def test_spec() -> None:
    spec = env_spec("HalfCheetah-v5")
    assert spec.env_id == "HalfCheetah-v5" and spec.obs_dim == 17
    assert not spec.action.discrete and spec.action.dim == 6
    assert spec.action.low == (-1.0,) * 6 and spec.action.high == (1.0,) * 6


def test_steps_and_clips_actions() -> None:
    clipped, unclipped = EnvSlice("HalfCheetah-v5", 0, 2, seed=0), EnvSlice("HalfCheetah-v5", 0, 2, seed=0)
    obs = clipped.reset()
    unclipped.reset()
    assert obs.shape == (2, 17) and obs.dtype == np.float32
    big = np.full((2, 6), 5.0, dtype=np.float32)
    for _ in range(5):
        a, b = clipped.step(big), unclipped.step(np.ones((2, 6), dtype=np.float32))
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert np.isfinite(a[0]).all() and a[1].dtype == np.float32


def test_a_pickled_state_continues_exactly() -> None:
    # MuJoCo envs pickle as their constructor arguments only, so a checkpoint's state carries the physics and the
    # reset RNG itself. Auto-resets after the restore (every 10 steps) draw their start from that RNG.
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1.0, 1.0, (40, 2, 6)).astype(np.float32)
    whole = EnvSlice("HalfCheetah-v5", 0, 2, seed=0, max_episode_steps=10)
    whole.reset()
    for t in range(15):
        whole.step(actions[t])
    whole.pop_episode_stats()
    restored = EnvSlice("HalfCheetah-v5", 0, 2, seed=0, max_episode_steps=10)
    restored.reset()
    restored.restore(pickle.loads(pickle.dumps(whole.states())))  # as a checkpoint stores and loads them
    for t in range(15, 40):
        for x, y in zip(whole.step(actions[t]), restored.step(actions[t]), strict=True):
            np.testing.assert_array_equal(x, y)
    assert whole.pop_episode_stats() == restored.pop_episode_stats()


def test_leaves_no_mujoco_log_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MuJoCo's own handler would append the model's compile warning to MUJOCO_LOG.TXT in the working directory.
    monkeypatch.chdir(tmp_path)
    EnvSlice("HalfCheetah-v5", 0, 2, seed=0).reset()
    assert list(tmp_path.iterdir()) == []
