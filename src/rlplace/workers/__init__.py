"""Worker groups: simulators, policy inference and training for embodied tasks; generation, reward, log-prob
inference and training for reasoning tasks."""

from .actor import ActorWorker
from .env import EnvWorker
from .inference import InferenceWorker
from .llm_actor import LLMActorWorker
from .llm_rollout import LLMRolloutWorker
from .reward import RewardWorker
from .rollout import RolloutWorker, StaleWeightsError

__all__ = [
    "ActorWorker",
    "EnvWorker",
    "InferenceWorker",
    "LLMActorWorker",
    "LLMRolloutWorker",
    "RewardWorker",
    "RolloutWorker",
    "StaleWeightsError",
]
