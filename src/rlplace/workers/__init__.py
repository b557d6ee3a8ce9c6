"""Worker groups of the embodied task: simulators, policy inference and training."""

from .actor import ActorWorker
from .env import EnvWorker
from .rollout import RolloutWorker, StaleWeightsError

__all__ = ["ActorWorker", "EnvWorker", "RolloutWorker", "StaleWeightsError"]
