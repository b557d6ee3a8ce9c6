"""Counter-based uniform noise for action sampling, keyed by (seed, global env index, step, component).

A stateful RNG would make sampled actions depend on how sub-envs are split over rollout workers and pipeline stages
(each worker would draw from its own stream in its own order). Hashing the key instead makes the noise for env i at
step t the same wherever and whenever it is drawn. The hash is splitmix64 (Steele et al., 2014), chained over the key
parts, in wrapping numpy uint64 arithmetic. The process-wide random states, which checkpoints save and restore, are
here too.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_MANTISSA_BITS = 23
"""Uniforms are (2k + 1) / 2^24 for k < 2^23: exact in float32, symmetric, and never 0 or 1."""


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser applied to the golden-ratio increment of x (uint64 in, uint64 out, wrapping)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def _as_uint64(value: int) -> np.ndarray:
    """A Python int (any sign) as a 1-element uint64 array: arrays wrap silently where numpy scalars warn."""
    return np.array([int(value) & _MASK64], dtype=np.uint64)


def uniform_noise(seed: int, env_indices: torch.Tensor | np.ndarray, step: int, dim: int) -> torch.Tensor:
    """Uniform noise in (0, 1), float32 [n, dim]: row j is a pure function of (seed, env_indices[j], step).

    Column c is component c of that env's draw (one per action dimension). Values lie on the grid (2k + 1) / 2^24,
    so 1 - u is on the same grid and inverse-CDF transforms never see 0 or 1.
    """
    if isinstance(env_indices, torch.Tensor):
        env_indices = env_indices.cpu().numpy()
    env = np.asarray(env_indices, dtype=np.int64).astype(np.uint64).reshape(-1, 1)
    key = splitmix64(splitmix64(splitmix64(_as_uint64(seed)) + env) + _as_uint64(step))
    bits = splitmix64(key + np.arange(dim, dtype=np.uint64).reshape(1, -1))
    k = bits >> np.uint64(64 - _MANTISSA_BITS)
    u = (2.0 * k.astype(np.float64) + 1.0) / float(1 << (_MANTISSA_BITS + 1))
    return torch.from_numpy(u.astype(np.float32))


def rng_states() -> dict[str, Any]:
    """The process-wide random states (torch, CUDA where present, numpy, Python), to be put back by `set_rng_states`.
    The updates draw from their own generators, but a model with dropout draws from torch's stream; numpy's and
    Python's are carried along for any code that draws from them (nothing here seeds or reads them)."""
    states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
