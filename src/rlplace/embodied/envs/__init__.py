"""Simulator tasks: the task registry and slices of sub-environments addressed by global env index."""

from .env_slice import EnvSlice, EpisodeStats, SubEnvState, merge_episode_stats, split_stages
from .registry import TASKS, ActionSpec, EnvSpec, env_spec, make_env, resolve_env_id

__all__ = [
    "TASKS",
    "ActionSpec",
    "EnvSlice",
    "EnvSpec",
    "EpisodeStats",
    "SubEnvState",
    "env_spec",
    "make_env",
    "merge_episode_stats",
    "resolve_env_id",
    "split_stages",
]
