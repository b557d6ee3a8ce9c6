"""Simulator tasks: gymnasium environments by id, and slices of sub-environments addressed by global env index."""

from .env_slice import EnvSlice, EpisodeStats, SubEnvState, merge_episode_stats, split_stages
from .normalize import Normalization
from .registry import ActionSpec, EnvSpec, check_env_id, env_spec, make_env

__all__ = [
    "ActionSpec",
    "EnvSlice",
    "EnvSpec",
    "EpisodeStats",
    "Normalization",
    "SubEnvState",
    "check_env_id",
    "env_spec",
    "make_env",
    "merge_episode_stats",
    "split_stages",
]
