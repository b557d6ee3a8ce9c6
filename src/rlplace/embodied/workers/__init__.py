"""The worker groups of an embodied run: simulators (env), policy inference (rollout) and PPO training (actor)."""

from .actor import ActorWorker
from .env import EnvWorker
from .rollout import RolloutWorker

__all__ = ["ActorWorker", "EnvWorker", "RolloutWorker"]
